"""Pinned messages: what the user pinned is in every request raw, after the summary, across
the agent's compaction and a reset, until it is unpinned; budgets and hostile input hold.

The oracle is the test's own transcript (what the user wrote) and the messages the floor's
decision sends, compared as text; the pin detection itself is checked as a pure function.
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

import orjson
import pytest

from proxy.floor.pins import KEPT_CHARS, TRUNCATED, pin_message, pins_in
from proxy.policy.parse import parse_rules
from proxy.policy.records import DEFAULT_PINS
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from proxy.wire.content import message_text
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import (
    Holder,
    Transcript,
    chat,
    conversation,
    put,
    request_for,
    rules,
    system,
)

PIN = "!pin Leave the database alone. Today, we are only editing documentation."
NOTE = "[tailfloor] Pinned by the user earlier in this conversation:"


def texts(messages: list[Any]) -> list[str]:
    return [message_text(m) for m in messages]


# ------------------------------------------------------------------ detection (pure)
def test_markers_unpin_and_pointing_back() -> None:
    found = pins_in([("1", "user", "hello"), ("2", "user", PIN), ("3", "assistant", "ok"),
                     ("4", "user", "📌 use tabs"), ("5", "user", "  !PIN  no force pushes"),
                     ("6", "user", "do not !pin this"), ("7", "assistant", "plan: A then B"),
                     ("8", "user", "!pin ^")], DEFAULT_PINS)
    assert [p.entry_id for p in found.pins] == ["2", "4", "5"]  # !pin ^ is off by default
    both = pins_in([("7", "assistant", "plan: A then B"), ("8", "user", "!pin ^")],
                   DEFAULT_PINS, pin_assistant=True)
    assert [p.text for p in both.pins] == ["plan: A then B"]
    after = pins_in([("9", "user", "!unpin tabs"), ("10", "user", "!unpin")], DEFAULT_PINS,
                    start=found)
    assert [p.entry_id for p in after.pins] == ["2"]  # "tabs" by text, then the newest


def test_a_pin_or_an_unpin_read_again_changes_nothing() -> None:
    first = pins_in([("1", "user", PIN), ("2", "user", "📌 use tabs"),
                     ("3", "user", "!unpin")], DEFAULT_PINS)
    assert [p.entry_id for p in first.pins] == ["1"]
    # what was appended since, read with the last message read before it
    again = pins_in([("1", "user", PIN), ("3", "user", "!unpin"), ("4", "user", "thanks")],
                    DEFAULT_PINS, start=first)
    assert again == first
    # the pin that ``!unpin`` ended, met again: it stays ended
    assert pins_in([("2", "user", "📌 use tabs"), ("4", "user", "thanks")], DEFAULT_PINS,
                   start=first).pins == first.pins
    # and so does one the cap pushed out
    capped = pins_in([("a", "user", "!pin one"), ("b", "user", "!pin two")], DEFAULT_PINS,
                     max_pinned=1)
    assert [p.entry_id for p in capped.pins] == ["b"]
    assert pins_in([("a", "user", "!pin one")], DEFAULT_PINS, max_pinned=1,
                   start=capped).pins == capped.pins


def test_the_ended_pins_remembered_are_the_newest_few() -> None:
    lines = [(str(i), "user", f"!pin rule {i}" if i % 2 else "!unpin") for i in range(20_000)]
    read = pins_in(lines, DEFAULT_PINS, max_pinned=16)
    # each pin but the last unpinned right after it
    assert [p.entry_id for p in read.pins] == ["19999"] and len(read.ended) == 64
    assert read.ended[-1] == "19997"


def _inherited_after(unpins: list[str], inherited: list[str]) -> list[str]:
    """The oracle: each unpin applied in turn to what a session inherited."""
    out = list(inherited)
    for what in unpins:
        out = out[:-1] if not what else [t for t in out if what.lower() not in t.lower()]
    return out


def test_an_unpin_implied_by_an_earlier_one_is_not_kept_and_ends_the_same_pins() -> None:
    from proxy.floor.pins import merged

    rng = random.Random(5)
    words = ["db", "DB", "the db", "tabs", "use TABS now", "", "", "x", "no x here"]
    inherited = [f"!pin {w} {i}" for i, w in enumerate(["db", "tabs", "x", "dbx", "y"] * 3)]
    old = pins_in([(f"o{i}", "user", t) for i, t in enumerate(inherited)], DEFAULT_PINS)
    assert len(old.pins) == len(inherited)
    for _ in range(300):
        said = [rng.choice(words) for _w in range(rng.randint(0, 12))]
        new = pins_in([(f"n{i}", "user", f"!unpin {w}") for i, w in enumerate(said)],
                      DEFAULT_PINS)
        assert [p.text for p in merged(old, new).pins] == _inherited_after(said, inherited), said
    kept = pins_in([("1", "user", "!unpin db"), ("2", "user", "!unpin the DB table"),
                    ("3", "user", "!unpin"), ("4", "user", "!unpin")], DEFAULT_PINS)
    assert kept.unpins == ("db", "", "")


def test_thousands_of_unpins_keep_little_and_end_every_inherited_pin() -> None:
    from proxy.floor.pins import KEPT_CONTROLS, KEPT_UNPIN_CHARS, KEPT_UNPINS, merged

    old = pins_in([("o1", "user", PIN), ("o2", "user", "📌 use tabs")], DEFAULT_PINS)
    lines = [("p", "user", "!pin keep it short")]
    lines += [(f"u{i}", "user", f"!unpin rule {i:05d}") for i in range(3_000)]
    whole = pins_in(lines, DEFAULT_PINS)
    assert [p.entry_id for p in whole.pins] == ["p"]  # its own pins: every unpin applied
    assert whole.unpins_all and whole.unpins == ()
    assert len(whole.controls) == KEPT_CONTROLS and whole.controls[-1] == "u2999"
    assert [p.entry_id for p in merged(old, whole).pins] == ["p"]
    # read in pieces, as a transcript grows: the same
    grown = pins_in(lines[:100], DEFAULT_PINS)
    assert not grown.unpins_all and len(grown.unpins) == 99
    for at in range(100, len(lines), 700):
        grown = pins_in(lines[at:at + 700], DEFAULT_PINS, start=grown)
    assert grown == whole
    # a few long ones pass the text budget
    long = pins_in([(str(i), "user", f"!unpin {i:03d}:" + "z" * 3_000) for i in range(90)],
                   DEFAULT_PINS)
    assert KEPT_UNPINS > 90 and KEPT_UNPIN_CHARS < 90 * 3_000 and long.unpins_all
    assert [p.entry_id for p in merged(old, long).pins] == []
    under = pins_in([(str(i), "user", f"!unpin rule {i:05d}") for i in range(KEPT_UNPINS)],
                    DEFAULT_PINS)
    assert not under.unpins_all and len(under.unpins) == KEPT_UNPINS
    assert [p.entry_id for p in merged(old, under).pins] == ["o1", "o2"]


def test_the_cap_drops_the_oldest_and_a_huge_pin_is_kept_truncated() -> None:
    many = pins_in(((str(i), "user", f"!pin rule {i}") for i in range(10_000)), DEFAULT_PINS,
                   max_pinned=16)
    assert [p.text for p in many.pins] == [f"!pin rule {i}" for i in range(9984, 10_000)]
    assert many.dropped == 10_000 - 16
    huge = pins_in([("h", "user", "!pin " + "x" * 5_000_000)], DEFAULT_PINS)
    [pin] = huge.pins
    assert pin.truncated and len(pin.text) == KEPT_CHARS
    counter = TokenCounter()

    def count(text: str) -> int:
        return counter.message({"role": "user", "content": text}, "estimate")

    message, kept, dropped = pin_message(huge.pins, NOTE, 500, count)
    assert message is not None and kept == 1 and dropped == 0
    assert message["content"].endswith(TRUNCATED) and count(message["content"]) <= 500


def test_matching_is_bounded_and_catastrophic_patterns_are_refused() -> None:
    problems = []
    try:
        parse_rules([("r.toml", '[defaults]\npin_patterns = ["^(a+)+$"]\n')])
    except Exception as exc:  # the parser reports every problem at once
        problems.append(str(exc))
    assert problems and "refused" in problems[0]
    # An allowed pattern sees only the start of a message: a long text costs no more.
    pattern = re.compile(r"remember:", re.IGNORECASE)
    started = time.perf_counter()
    pins_in([("1", "user", "a" * 5_000_000 + " remember: x")], [pattern])
    assert time.perf_counter() - started < 1.0


# ------------------------------------------------------------------ the floor
def pinned_session(sid: str = "bbbb2222-p1") -> Transcript:
    t = Transcript(sid)
    t.user("Hello, a first turn.")
    t.assistant("hi")
    t.user(PIN)
    t.assistant("understood")
    conversation(t, 20)
    return t


def floor_of(catalog: Catalog, n: int = 6, **policy: Any) -> FloorHarness:
    return FloorHarness(Holder(rules(n=n, **policy)), TokenCounter(), catalog)


def test_after_the_agents_compaction_the_pin_follows_the_summary() -> None:
    catalog = Catalog()
    t = pinned_session()
    t.compaction("## Goal\nedit the docs", t.message_ids()[-5])
    t.user("after compaction")
    put(catalog, t)
    body = request_for(catalog, t.session_id)
    assert PIN not in texts(body["messages"])  # the agent's request lost it
    floor = floor_of(catalog)
    first = floor.decide(chat(body), {})
    assert "pinned=1" in first.verdict, first.verdict
    sent = orjson.loads(first.body)["messages"]
    at = next(i for i, m in enumerate(sent) if NOTE in message_text(m))
    assert "<summary>" in message_text(sent[at - 1]) or "edit the docs" in message_text(
        sent[at - 1])
    assert message_text(sent[at]) == NOTE + "\n\n" + PIN  # verbatim, after the note
    assert first.origins is not None and first.origins[at].provenance == "pinned"
    again = floor.decide(chat(body), {})
    assert again.body == first.body  # the same bytes while the pins are the same


def test_a_request_that_holds_the_floor_still_gets_a_summarized_pin() -> None:
    catalog = Catalog()
    t = pinned_session()
    t.compaction("## Goal\nedit the docs", t.message_ids()[-30])
    t.user("after compaction")
    put(catalog, t)
    body = request_for(catalog, t.session_id)
    decision = floor_of(catalog, n=6).decide(chat(body), {})
    assert decision.verdict == "floor; pinned=1", decision.verdict
    assert NOTE + "\n\n" + PIN in texts(orjson.loads(decision.body)["messages"])


def test_a_held_pin_is_not_added_twice_and_an_unpinned_one_is_gone() -> None:
    catalog = Catalog()
    t = pinned_session()
    put(catalog, t)
    body = request_for(catalog, t.session_id)  # the pin is still raw in the request
    decision = floor_of(catalog, n=6).decide(chat(body), {})
    assert "pinned" not in decision.verdict
    t.user("!unpin database")
    t.assistant("ok")
    t.compaction("## Goal\nedit the docs", t.message_ids()[-3])
    t.user("after compaction")
    catalog2 = Catalog()
    put(catalog2, t)
    decision = floor_of(catalog2, n=6).decide(chat(request_for(catalog2, t.session_id)), {})
    assert "pinned" not in decision.verdict, decision.verdict


def test_the_pin_survives_a_reset_into_the_next_session() -> None:
    catalog = Catalog()
    t = pinned_session()
    t.reset()
    t.user("the next day")
    put(catalog, t)
    floor = floor_of(catalog, n=6)
    record = catalog.full(t.session_id)
    assert record is not None
    closed = [m for r in catalog.tail(t.session_id, 200, before=record.resets[-1].entry_id)
              for m in r.messages]
    floor.decide(chat({**request_for(catalog, t.session_id),
                       "messages": [system(), *closed]}), {})
    hello = {"model": "fake-model", "tools": request_for(catalog, t.session_id)["tools"],
             "messages": [system(date="2026-12-01"),
                          {"role": "user", "content": "the next day"}]}
    decision = floor.decide(chat(hello), {"x-tailfloor-session": t.session_id})
    assert decision.kind == "carry" and "pinned=" in decision.verdict, decision.verdict
    sent = texts(orjson.loads(decision.body)["messages"])
    assert NOTE + "\n\n" + PIN in sent
    # before the carried messages' opening note
    assert sent.index(NOTE + "\n\n" + PIN) < next(i for i, s in enumerate(sent)
                                                   if "previous session" in s)


def test_a_client_claiming_the_session_gets_no_pins() -> None:
    catalog = Catalog()
    t = pinned_session()
    t.compaction("## Goal\nedit the docs", t.message_ids()[-5])
    put(catalog, t)
    floor = floor_of(catalog, n=6)
    mallory = {"model": "fake-model", "messages": [
        {"role": "system", "content": "You are Mallory's assistant."},
        {"role": "user", "content": "hi"}]}
    decision = floor.decide(chat(mallory), {"x-tailfloor-session": t.session_id})
    assert decision.kind == "none" and PIN.encode() not in decision.body, decision.verdict


@pytest.mark.parametrize("budget", [0, 120])
def test_pins_never_push_past_the_window(budget: int) -> None:
    catalog = Catalog()
    t = Transcript("bbbb2222-p2")
    t.user("!pin " + "keep every word of this rule " * 100)
    t.assistant("understood")
    conversation(t, 20)
    t.compaction("## Goal\nedit the docs", t.message_ids()[-5])
    t.user("after compaction")
    put(catalog, t)
    body = request_for(catalog, t.session_id)
    floor = floor_of(catalog, n=6, pinned_token_budget=budget)
    decision = floor.decide(chat(body), {})
    sent = texts(orjson.loads(decision.body)["messages"])
    if budget == 0:
        assert "pinned" not in decision.verdict and not any(NOTE in s for s in sent)
    else:  # too small for the pin: kept truncated, with its marker
        [pinned] = [s for s in sent if NOTE in s]
        assert pinned.endswith(TRUNCATED.strip()) or TRUNCATED.strip() in pinned


# ------------------------------------------------------------- tailfloor's own compaction
def test_tailfloor_s_overflow_compaction_keeps_the_pin_raw_and_does_not_summarize_it() -> None:
    """A pin the floor put in sits in what recovery summarizes: it stays raw right after
    tailfloor's summary, and the summarizer never receives it."""
    import asyncio
    import tempfile
    from pathlib import Path

    from proxy.chat import ChatRequest, Draft
    from proxy.context import build_context
    from proxy.facts.learned import TokenRatios
    from proxy.facts.resolve import ModelFactsResolver
    from proxy.floor.pinning import PINNED
    from proxy.recovery.stage import Recovery
    from proxy.report import AGENT
    from tests.recovery.test_invariant import OVERFLOW, WINDOWS, MemorySummarizer, Rules, inline
    from tests.recovery.test_plan import conversation as shaped

    pin = {"role": "user", "content": NOTE + "\n\n" + PIN}
    body = shaped([0, 1] * 20)
    for message in body:
        if isinstance(message.get("content"), str):
            message["content"] += " lorem ipsum" * 120
    messages = [{"role": "system", "content": "agent pins"}, body[0], pin, *body[1:]]
    origins = tuple(PINNED if m is pin else AGENT for m in messages)
    raw = orjson.dumps({"model": "fake-model", "messages": messages,
                        "max_completion_tokens": 64})
    chat_request = ChatRequest.parse(raw, orjson.loads(raw), None)
    sent_to_summarizer: list[bytes] = []

    class Recording(MemorySummarizer):
        async def complete(self, body: bytes, headers: Any,
                           timeout: float) -> tuple[int, bytes]:  # noqa: ASYNC109
            sent_to_summarizer.append(body)
            return await super().complete(body, headers, timeout)

    with tempfile.TemporaryDirectory() as tmp:
        models = ModelFactsResolver(WINDOWS, TokenRatios(), "test")
        recovery = Recovery(rules=Rules(), tokens=TokenCounter(), models=models,
                            transport=Recording(), offload=inline)
        recovery.open(Path(tmp))
        ctx = build_context(chat_request, {}, Rules.rules, sessions=None, models=models)
        view = recovery.view(ctx, Draft(raw, messages=tuple(messages), origins=origins))
        assert view is not None
        step = asyncio.run(recovery.on_error(view, None, OVERFLOW, attempt=0))
        asyncio.run(recovery.close())
    assert step.compaction is not None and step.compaction.label == "compacted:overflow"
    sent = list(step.compaction.messages)
    assert sent[2] == pin  # system, tailfloor's summary, then the pin
    assert step.compaction.origins is not None
    assert step.compaction.origins[2].provenance == "pinned"
    assert sent_to_summarizer and all(PIN.encode() not in b for b in sent_to_summarizer)


def test_an_unpin_in_the_next_session_ends_the_inherited_pin() -> None:
    from proxy.floor.pins import merged

    old = pins_in([("1", "user", PIN), ("2", "user", "📌 use tabs")], DEFAULT_PINS)
    new = pins_in([("3", "user", "!unpin database"), ("4", "user", "!pin keep it short")],
                  DEFAULT_PINS)
    assert [p.entry_id for p in merged(old, new).pins] == ["2", "4"]


def test_a_pin_held_behind_openclaw_s_timestamp_is_held() -> None:
    from proxy.floor.pins import missing

    [pin] = pins_in([("1", "user", PIN)], DEFAULT_PINS).pins
    held = [{"role": "user", "content": f"[Wed 2026-12-02 17:10 UTC] {PIN}"}]
    assert missing([pin], held) == []
    assert missing([pin], [{"role": "user", "content": "something else"}]) == [pin]


def test_openclaw_s_timestamp_is_not_part_of_the_pin() -> None:
    [pin] = pins_in([("1", "user", f"[Wed 2026-12-02 17:10 UTC] {PIN}")], DEFAULT_PINS).pins
    assert pin.text == PIN


def test_a_claim_with_made_up_messages_that_hold_the_floor_gets_no_pins() -> None:
    """A client that names the session and sends enough raw messages of its own for the
    floor to hold (nothing of the session's) is not the session's: no pin."""
    catalog = Catalog()
    t = pinned_session()
    t.compaction("## Goal\nedit the docs", t.message_ids()[-5])
    put(catalog, t)
    floor = floor_of(catalog, n=6)
    made_up: list[dict[str, Any]] = []
    for i in range(5):
        made_up += [{"role": "user", "content": f"zq{i}"},
                    {"role": "assistant", "content": f"xq{i}"}]
    mallory = {"model": "fake-model", "messages": [
        {"role": "system", "content": "You are Mallory's assistant."}, *made_up,
        {"role": "user", "content": "tell me"}]}
    decision = floor.decide(chat(mallory), {"x-tailfloor-session": t.session_id})
    assert "pinned" not in decision.verdict and PIN.encode() not in decision.body, \
        decision.verdict


def test_a_clean_slate_inherits_no_pin_even_after_its_marker_is_summarized() -> None:
    """The new session's own first message says it is clean; the index reads that from
    the transcript, so no request of it inherits (the control without the marker does)."""
    from proxy.floor.pin_index import PinIndex

    for first, inherits in (("--clean start over", False), ("start over", True)):
        catalog = Catalog()
        old = pinned_session("bbbb2222-old1")
        put(catalog, old)
        new = Transcript("bbbb2222-new1")
        new.clock = old.clock + 100
        new.user(first)
        new.assistant("ok")
        conversation(new, 4)
        put(catalog, new, created=new.clock)
        record = catalog.get(new.session_id)
        assert record is not None and record.predecessor == old.session_id
        pins = PinIndex(catalog).lineage(new.session_id, rules(n=6).defaults).pins
        assert any(p.text == PIN for p in pins) == inherits, first


@pytest.mark.parametrize("pattern", ["(a+)+", "((a+))+$", "(a|aa)+$", "(.*a){12}",
                                     "(?:x|y*)*"])
def test_every_runaway_pattern_shape_is_refused(pattern: str) -> None:
    from proxy.policy.pin_patterns import unsafe_pattern

    assert unsafe_pattern(pattern) is not None
    for fine in (r"^\s*(?:remember|constraint):", r"(ab){2,}", r"[(]a+[)]+", r"\(a+\)+"):
        assert unsafe_pattern(fine) is None, fine
