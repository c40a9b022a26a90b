"""A session's pins as its first read finds them: the user messages alone are rendered
unless one of them points back (``!pin ^`` with ``pin_assistant``), and the pins are always
those of every message of every segment, read in full (the oracle, ``pins_in`` over the whole
tail as the catalog renders it)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from proxy.floor.pin_index import PinIndex
from proxy.floor.pins import pins_in
from proxy.policy.records import Policy
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.entries import Entry
from proxy.transcripts.records import SessionInfo, SourceKind
from proxy.wire.content import message_text
from tests.floor.synthetic import MemoryStore, Transcript

USER_TEXTS = ["!pin keep the API stable", "📌 no new dependencies", "!pin ^", "  !PIN ^ ",
              "!unpin", "!unpin keep the API", "what next?", "[Mon 2026-11-30 02:27 UTC] !pin ^",
              "!pin ^ and more", "thanks"]


class CountingStore(MemoryStore):
    def __init__(self, objs: list[dict[str, Any]]) -> None:
        super().__init__(objs)
        self.loaded: list[Entry] = []

    def load(self, entries: Sequence[Entry]) -> list[Mapping[str, Any] | None]:
        self.loaded += entries
        return super().load(entries)


def _session(rng: random.Random, sid: str) -> Transcript:
    t = Transcript(sid)
    for turn in range(rng.randint(1, 25)):
        t.user(rng.choice(USER_TEXTS) if rng.random() < 0.5 else f"turn {turn}")
        if rng.random() < 0.3:
            _entry, ids = t.tool_calls(["bash"])
            t.tool_result(ids[0], "ok")
        t.assistant(f"answer {turn}" if rng.random() < 0.8 else "📌 an assistant's marker")
        if rng.random() < 0.05:
            t.reset()
    return t


def _catalog(t: Transcript, source: SourceKind = "pi") -> tuple[Catalog, CountingStore]:
    catalog = Catalog()
    store = CountingStore(t.objs)
    info = SessionInfo(session_id=t.session_id, source=source, era="pi", location="mem",
                       agent_id="pi", group="dir")
    catalog.put(info, store, store.read_window(None))
    return catalog, store


def _oracle(catalog: Catalog, sid: str, policy: Policy) -> Any:
    record = catalog.full(sid)
    assert record is not None
    k = record.message_count + 8
    tails = [catalog.tail(sid, k, before=r.entry_id) for r in record.resets]
    tails.append(catalog.tail(sid, k))
    texts = [(m.entry_id, m.role, message_text(m.messages[0])) for tail in tails for m in tail
             if m.role in ("user", "assistant") and m.messages]
    return pins_in(texts, policy.pin_patterns, pin_assistant=policy.pin_assistant,
                   max_pinned=policy.max_pinned)


@pytest.mark.parametrize("pin_assistant", [False, True])
def test_the_first_read_finds_what_a_full_read_finds(pin_assistant: bool) -> None:
    rng = random.Random(11 if pin_assistant else 12)
    policy = replace(Policy(), pin_assistant=pin_assistant)
    for n in range(150):
        t = _session(rng, f"s{n}")
        catalog, store = _catalog(t)
        found = PinIndex(catalog).own(t.session_id, policy)
        read = {e.role for e in store.loaded}
        assert found == _oracle(_catalog(t)[0], t.session_id, policy), n
        users = [o["message"]["content"][0]["text"] for o in t.objs
                 if o["type"] == "message" and o["message"]["role"] == "user"]
        pointing = pin_assistant and any("^" in u for u in users)
        if not pointing:
            assert read <= {"user"}, n  # nothing but user messages was rendered


def test_a_pin_pointing_back_pins_the_assistant_message_before_it() -> None:
    t = Transcript("back")
    t.user("first")
    t.assistant("use tabs, never spaces")
    t.user("!pin ^")
    t.assistant("noted")
    catalog, store = _catalog(t)
    policy = replace(Policy(), pin_assistant=True)
    found = PinIndex(catalog).own(t.session_id, policy)
    assert [p.text for p in found.pins] == ["use tabs, never spaces"]
    assert "assistant" in {e.role for e in store.loaded}


# ------------------------------------------------ with the default markers: a few lines read
PLAIN = ["what next?", "thanks", "run the tests", "fix the bug in parse()", "turn it off"]
ODD_CONTENTS: list[list[Any]] = [["!pin a bare string"], [{"type": "text", "text": 7}],
                                 [{"type": "image", "data": "", "mimeType": "image/png"}],
                                 [{"type": "input_text", "text": "!pin not a text block"}]]


def _plain_session(rng: random.Random, sid: str, *, clean_at: int | None = None,
                   edits: bool = False) -> Transcript:
    """Mostly plain user turns, a few markers, now and then an edit that makes or ends a
    pin, a reset, and a first message that may ask for a clean slate after turns that
    render as nothing."""
    t = Transcript(sid)
    if clean_at is not None:
        for _ in range(clean_at):  # content that renders as no message
            t._add("message", message={"role": "user", "content": [{"type": "thinking"}]})
        t.user("--clean start over")
    users: list[str] = []
    for turn in range(rng.randint(1, 40)):
        text = rng.choice(USER_TEXTS) if rng.random() < 0.15 else rng.choice(PLAIN)
        users.append(t.user(text))
        if rng.random() < 0.1:  # shapes an agent never writes: read as the renderer reads them
            odd = rng.choice(ODD_CONTENTS)
            t.objs[-1]["message"]["content"] = [*odd, *t.objs[-1]["message"]["content"]]
        t.assistant(f"answer {turn}")
        if edits and rng.random() < 0.1:
            target = rng.choice(users)
            t._add("context_edit", targetId=target, replacement=rng.choice([
                None, {"content": "!pin edited in"}, {"content": "edited out"}]))
        if rng.random() < 0.04:
            t.reset()
    return t


@pytest.mark.parametrize(("seed", "source"), [(1, "pi"), (2, "pi"), (3, "openclaw-jsonl")])
def test_with_the_default_markers_only_marked_edited_and_leading_users_are_read(
        seed: int, source: SourceKind) -> None:
    rng = random.Random(seed)
    policy = Policy()
    skipped = 0
    for n in range(120):
        t = _plain_session(rng, f"p{n}", clean_at=rng.choice([None, None, 0, 2, 6]),
                           edits=rng.random() < 0.5)
        catalog, store = _catalog(t, source)
        index = PinIndex(catalog)
        found = index.own(t.session_id, policy)
        assert found == _oracle(_catalog(t, source)[0], t.session_id, policy), n
        # The clean-slate mark, as a full read of the first user message finds it.
        clean = index._scanned[t.session_id].clean
        firsts = [o["message"]["content"] for o in t.objs if o["type"] == "message"
                  and o["message"]["role"] == "user"
                  and any(isinstance(b, dict) and b.get("type") in ("text", "image")
                          for b in o["message"]["content"])]
        texts = [b["text"] for b in firsts[0] if isinstance(b, dict)
                 and b.get("type") == "text" and isinstance(b["text"], str)] if firsts else []
        assert clean == "\n".join(texts).startswith("--clean "), n
        users = sum(1 for o in t.objs if o["type"] == "message"
                    and o["message"]["role"] == "user")
        read = [e for e in store.loaded if e.role == "user"]
        skipped += users - len(read)
        fresh = _catalog(t, source)[0]
        record = fresh.full(t.session_id)
        assert record is not None
        k = record.message_count + 8
        segments = [fresh.tail(t.session_id, k, before=r.entry_id, roles=("user",))
                    for r in record.resets] + [fresh.tail(t.session_id, k, roles=("user",))]
        leading = {m.entry_id for segment in segments for m in segment[:4]}
        edited = {o["targetId"] for o in t.objs if o["type"] == "context_edit"}
        if t.objs[0]["message"]["content"] != [{"type": "thinking"}]:
            # (a first user message that renders as nothing: read again in full)
            assert all(e.may_pin or e.id in leading or e.id in edited for e in read), n
    assert skipped > 1000  # most plain user messages were never read


def test_a_pattern_of_the_operators_own_reads_every_user_message() -> None:
    import re

    t = Transcript("own")
    for turn in range(12):
        t.user("KEEP: the schema" if turn == 7 else f"turn {turn}")
        t.assistant("ok")
    catalog, store = _catalog(t)
    policy = replace(Policy(), pin_patterns=(re.compile(r"^KEEP:"),))
    found = PinIndex(catalog).own(t.session_id, policy)
    assert [p.text for p in found.pins] == ["KEEP: the schema"]
    assert len(store.loaded) == 12


def test_an_edit_that_writes_a_marker_into_a_plain_message_is_read() -> None:
    t = Transcript("edit")
    ids = [t.user(f"plain {i}") for i in range(10)]
    t.assistant("ok")
    t._add("context_edit", targetId=ids[8], replacement={"content": "!pin written by an edit"})
    catalog, store = _catalog(t)
    found = PinIndex(catalog).own(t.session_id, Policy())
    assert [p.text for p in found.pins] == ["!pin written by an edit"]
    assert ids[8] in {e.id for e in store.loaded}
    assert {e.id for e in store.loaded if e.role == "user"} == {*ids[:4], ids[8]}


def test_a_text_without_a_mark_is_no_pin_unpin_or_pointer_to_the_default_patterns() -> None:
    from proxy.wire.pin_marks import holds_mark

    rng = random.Random(9)
    alphabet = "pinPIN ^\t\n\u3000unUN:[]-0123456789 Mon2026:UTC\u0131\u0130"
    texts = ["pin x", "  PIN ^", "unpin", "[Mon 2026-11-30 02:27 UTC] pin it", "\u0130pin"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
              for _ in range(3000)]
    for text in texts:
        assert not holds_mark(text)
        found = pins_in([("e", "user", text)], Policy().pin_patterns, pin_assistant=True)
        assert found.pins == () and found.controls == () and found.unpins == (), text
    assert holds_mark("!pin x") and holds_mark("📌 x")


@pytest.mark.parametrize("seed", [4, 5])
def test_a_grown_session_reads_only_its_new_marked_users(seed: int) -> None:
    """After the first read, what a session adds is read for pins: with the default markers,
    only its new user messages that may pin (a tool's output or a reply is never rendered for
    pins), and the pins are still those a full read finds."""
    rng = random.Random(seed)
    policy = Policy()
    for n in range(80):
        t = _plain_session(rng, f"g{n}")
        catalog, store = _catalog(t)
        index = PinIndex(catalog)
        index.own(t.session_id, policy)
        for _round in range(3):
            # A segment that was empty when read (a reset came last) is read again whole:
            # nothing says the catalog's window holds the whole segment since.
            emptied = t.objs[-1]["type"] == "reset"
            grown_from = len(t.objs)
            new_users = []
            for turn in range(rng.randint(1, 6)):
                new_users.append(t.user(rng.choice(USER_TEXTS) if rng.random() < 0.3
                                        else rng.choice(PLAIN)))
                if rng.random() < 0.5:
                    _entry, ids = t.tool_calls(["bash"])
                    t.tool_result(ids[0], "!pin in a tool's output pins nothing")
                t.assistant(f"📌 reply {turn}")
            # of a message read before (of the segment since the last reset, the context
            # an agent edits): the session is read again whole
            older = rng.random() < 0.2
            if rng.random() < 0.4 or older:
                # an edit makes a plain message a pin, or ends one
                since_reset = [i for i, o in enumerate(t.objs[:grown_from])
                               if o["type"] == "reset"][-1:] or [0]
                users = [o["id"] for o in t.objs[since_reset[0]:grown_from]
                         if o["type"] == "message" and o["message"]["role"] == "user"] \
                    if older else new_users
                t._add("context_edit", targetId=rng.choice(users or new_users),
                       replacement=rng.choice([{"content": "!pin edited in"},
                                               {"content": "edited out"}]))
            catalog.append(t.session_id, store.entries()[grown_from:])
            store.loaded.clear()
            found = index.own(t.session_id, policy)
            assert found == _oracle(_catalog(t)[0], t.session_id, policy), n
            edited = {o["targetId"] for o in t.objs if o["type"] == "context_edit"}
            assert emptied or older or all((e.role == "user" and e.may_pin) or e.id in edited
                                           or e.kind == "context_edit"
                                           for e in store.loaded), n


class FullReads:
    """The catalog, counting the reads of every message (a first read's, not a probe's)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog, self.whole_reads = catalog, 0

        self.searches = 0  # of a transcript's bytes for a marker (a first read's too)

    def tail(self, session_id: str, k: int, *args: Any, **kwargs: Any) -> Any:
        self.whole_reads += k > 10_000
        return self.catalog.tail(session_id, k, *args, **kwargs)

    def holds(self, session_id: str, needles: Any) -> bool | None:
        self.searches += 1
        return self.catalog.holds(session_id, needles)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.catalog, name)


def test_a_rewrite_of_a_message_read_before_is_read_again_once_a_removal_never() -> None:
    t = Transcript("rewrites")
    ids = [t.user(f"plain {i}") for i in range(6)]
    t.user("!pin keep the API stable")
    t.assistant("ok")
    catalog, store = _catalog(t)
    counting, policy = FullReads(catalog), Policy()
    index = PinIndex(counting)  # type: ignore[arg-type]

    def grown(*objs: tuple[str, dict[str, Any]]) -> list[str]:
        before = len(t.objs)
        for kind, fields in objs:
            t._add(kind, **fields)
        catalog.append(t.session_id, store.entries()[before:])
        return [p.text for p in index.own(t.session_id, policy).pins]

    assert [p.text for p in index.own(t.session_id, policy).pins] == ["!pin keep the API stable"]
    reads = counting.whole_reads
    # Pi 1.x removes a failed turn with an edit: nothing to read again
    assert grown(("context_edit", {"targetId": ids[2], "replacement": None})) == [
        "!pin keep the API stable"]
    assert counting.whole_reads == reads
    made = grown(("context_edit", {"targetId": ids[1], "replacement": {"content": "!pin made"}}))
    assert made == ["!pin made", "!pin keep the API stable"] and counting.whole_reads == reads + 1
    # read with it: the same rewrite does not make every next request read again
    assert grown() == made and counting.whole_reads == reads + 1
    assert grown(("message", {"message": {"role": "user", "content": "go on"}})) == made
    assert counting.whole_reads == reads + 1


def test_a_rewrite_in_a_session_without_a_marker_is_searched_again_once() -> None:
    t = Transcript("unmarked")
    ids = [t.user(f"plain {i}") for i in range(6)]
    t.assistant("ok")
    catalog, store = _catalog(t)
    counting, policy = FullReads(catalog), Policy()
    index = PinIndex(counting)  # type: ignore[arg-type]
    assert index.own(t.session_id, policy).pins == () and counting.searches == 1

    def rewrite(target: str, text: str) -> list[str]:
        before = len(t.objs)
        t._add("context_edit", targetId=target, replacement={"content": text})
        catalog.append(t.session_id, store.entries()[before:])
        return [p.text for p in index.own(t.session_id, policy).pins]

    assert rewrite(ids[1], "still plain") == [] and counting.searches == 2
    before = len(t.objs)
    t.user("go on")  # a new record, the same rewrite: not searched again
    catalog.append(t.session_id, store.entries()[before:])
    assert index.own(t.session_id, policy).pins == () and counting.searches == 2
    assert rewrite(ids[3], "!pin after all") == ["!pin after all"]
    assert index.own(t.session_id, policy).pins[0].text == "!pin after all"


def test_a_rewrite_seen_before_is_not_read_again_when_the_newest_messages_shift() -> None:
    """A message rewritten before the first read leaves the newest 200 as the session grows
    and comes back among them when a failed turn before the newest is removed (as Pi 1.x
    does): the edit is as old as it was, nothing is read again."""
    t = Transcript("shift")
    t.user("!pin keep the API stable")
    x = t.user("plain x")
    t._add("context_edit", targetId=x, replacement={"content": "still plain, rewritten"})
    for i in range(99):
        t.assistant(f"answer {i}")
        t.user(f"question {i}")
    catalog, store = _catalog(t)
    counting, policy = FullReads(catalog), Policy()
    index = PinIndex(counting)  # type: ignore[arg-type]
    assert [p.text for p in index.own(t.session_id, policy).pins] == ["!pin keep the API stable"]
    reads = counting.whole_reads
    # as _add names them: the two turns removed later, not the newest (the last one read)
    failed = [f"shift{len(t.objs):05d}", f"shift{len(t.objs) + 1:05d}"]
    for grow in ((("message", {"message": {"role": "assistant", "content": "failed"}}),
                  ("message", {"message": {"role": "user", "content": "try again"}}),
                  ("message", {"message": {"role": "assistant", "content": "done"}})),
                 tuple(("context_edit", {"targetId": gone, "replacement": None})
                       for gone in failed)):
        before = len(t.objs)
        for kind, fields in grow:
            t._add(kind, **fields)
        catalog.append(t.session_id, store.entries()[before:])
        assert [p.text for p in index.own(t.session_id, policy).pins] == [
            "!pin keep the API stable"]
    assert counting.whole_reads == reads


# ------------------------------------------------ what the remembered pins may hold, in all
class TailCounting:
    """The catalog, counting the tail reads asked of each session."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.tails: dict[str, int] = {}

    def tail(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        self.tails[session_id] = self.tails.get(session_id, 0) + 1
        return self.catalog.tail(session_id, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.catalog, name)


def test_sessions_of_many_large_pins_are_let_go_before_they_hold_too_much() -> None:
    """Sixteen pins of 8 KiB each in every session a user can start: the index lets the
    least recently asked go once their texts pass its budget, and reads them again when
    asked (the same pins)."""
    catalog = Catalog()
    sessions = [f"big{n:03d}" for n in range(160)]  # 160 x 16 x 8 KiB: 20 MiB of pins
    for sid in sessions:
        t = Transcript(sid)
        for i in range(16):
            t.user(f"!pin {sid} rule {i} " + "p" * 8_000)
            t.assistant("ok")
        store = MemoryStore(t.objs)
        info = SessionInfo(session_id=sid, source="pi", era="pi", location="mem",
                           agent_id="pi", group="dir")
        catalog.put(info, store, store.read_window(None))
    reads = TailCounting(catalog)
    index, policy = PinIndex(reads), Policy()
    first = {sid: index.own(sid, policy) for sid in sessions}
    assert all(len(p.pins) == 16 for p in first.values())
    held = sum(len(p.text) for p in first[sessions[0]].pins)
    assert 160 * held > 16 * 1024 * 1024 > 100 * held  # the newest 100 fit, not all
    before = dict(reads.tails)
    for sid in reversed(sessions[-100:]):  # the newest asked first: nothing let go yet
        assert index.own(sid, policy) == first[sid]
    assert reads.tails == before  # remembered
    assert index.own(sessions[0], policy) == first[sessions[0]]
    assert reads.tails[sessions[0]] > before[sessions[0]]  # let go, read again
