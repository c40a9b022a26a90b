"""Pins of sessions longer than what tailfloor keeps of them in memory: a transcript the scan
read only from its end (as it reads every file over 64 KiB), whose window of messages slides
as the agent appends. The oracle is ``pins_in`` over every message of the same file read
whole, through a catalog of its own."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from proxy.floor.pin_index import PinIndex
from proxy.floor.pins import PinSet
from proxy.policy.records import Policy
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.jsonl import JsonlTranscript
from proxy.transcripts.records import SessionInfo
from tests.fake_upstream import FakeUpstream
from tests.floor.synthetic import Transcript, put, request_for, write_jsonl
from tests.pins.test_pin_edits import (
    _post,
    _updated,
    append_and_wait,
    compacted,
    pins_sent,
    tailfloor_over,
)
from tests.pins.test_pin_first_read import PLAIN, USER_TEXTS, _oracle
from tests.pins.test_pins import PIN

STARTUP = 8  # the messages a scan keeps of a long transcript (``--startup-messages``)
FILLER = "x" * 400  # long turns: a few hundred of them pass the window and 64 KiB


def _tracked(root: Path, t: Transcript, *, whole: bool = False
             ) -> tuple[Catalog, JsonlTranscript]:
    """The file as the scan tracks it: read from its end only (``whole``: read whole)."""
    path = write_jsonl(root, t)
    store, window = JsonlTranscript.start(path, lambda *_: None, None if whole else STARTUP,
                                          whole_below=0)
    catalog = Catalog()
    catalog.put(SessionInfo(session_id=t.session_id, source="pi", era="pi",
                            location=str(path), agent_id="pi", group=str(root)),
                store, window)
    return catalog, store


def _whole_read(root: Path, t: Transcript, policy: Policy) -> PinSet:
    catalog, _store = _tracked(root / "oracle", t, whole=True)
    record = catalog.get(t.session_id)
    assert record is not None and record.count_complete
    found: PinSet = _oracle(catalog, t.session_id, policy)
    return found


def _grow(root: Path, t: Transcript, catalog: Catalog, store: JsonlTranscript) -> None:
    write_jsonl(root, t)  # the same file, longer (what was there is unchanged)
    entries = store.poll()
    assert entries is not None
    catalog.append(t.session_id, entries)


def _long(t: Transcript, turns: int, rng: random.Random | None = None) -> None:
    for turn in range(turns):
        text = f"turn {turn} {FILLER}"
        if rng is not None and rng.random() < 0.05:
            text = rng.choice(USER_TEXTS)
        t.user(text)
        if rng is not None and rng.random() < 0.3:
            _entry, ids = t.tool_calls(["bash"])
            t.tool_result(ids[0], f"if (!pinned) {{ exit(1) }} {FILLER}")
        t.assistant(f"answer {turn} {FILLER}")


def test_a_pin_older_than_the_kept_window_is_read(tmp_path: Path) -> None:
    t = Transcript("old-pin")
    t.user("!pin never touch the production database")
    t.assistant("understood")
    t.user("📌 answer in French")
    _long(t, 300)
    t.user("!unpin French")
    _long(t, 20)
    catalog, _store = _tracked(tmp_path, t)
    record = catalog.get(t.session_id)
    assert record is not None and not record.count_complete  # only the end was read
    found = PinIndex(catalog).own(t.session_id, Policy())
    assert [p.text for p in found.pins] == ["!pin never touch the production database"]
    assert found == _whole_read(tmp_path, t, Policy())


def test_pins_hold_while_a_long_session_grows_past_its_window(tmp_path: Path) -> None:
    """The window keeps the newest ~200 messages: as the agent appends, the count of
    messages the catalog holds stays about the same while the session grows."""
    t = Transcript("growing")
    t.user("!pin keep the API stable")
    _long(t, 150)
    catalog, store = _tracked(tmp_path, t)
    index, policy = PinIndex(catalog), Policy()
    assert [p.text for p in index.own(t.session_id, policy).pins] == [
        "!pin keep the API stable"]
    expected = ["!pin keep the API stable"]
    for round_ in range(6):
        t.user(f"!pin rule {round_}")
        expected.append(f"!pin rule {round_}")
        _long(t, 70)
        _grow(tmp_path, t, catalog, store)
        found = index.own(t.session_id, policy)
        assert [p.text for p in found.pins] == expected, round_
    assert found == _whole_read(tmp_path, t, policy)


@pytest.mark.parametrize("written", [
    b'"!pin keep it"', b'"  !PIN keep it"', b'"!p\xc4\xb1n keep it"', b'"\\u0021pin keep it"',
    b'"!\\u0070in keep it"', b'"\\ud83d\\udccc keep it"', "\"\U0001f4cc keep it\"".encode(),
    b'"[Mon 2026-11-30 02:27 UTC] !pin keep it"'])
def test_a_pin_written_any_way_the_parser_reads_is_found(tmp_path: Path,
                                                          written: bytes) -> None:
    """Whatever form of a marker a JSON parser decodes and the pattern takes, upper case,
    a dotless i, an escape, OpenClaw's timestamp, is read in a long transcript."""
    t = Transcript("forms")
    t.user("PLACEHOLDER")
    _long(t, 250)
    path = write_jsonl(tmp_path, t)
    path.write_bytes(path.read_bytes().replace(b'"PLACEHOLDER"', written, 1))
    store, window = JsonlTranscript.start(path, lambda *_: None, STARTUP, whole_below=0)
    catalog = Catalog()
    catalog.put(SessionInfo(session_id=t.session_id, source="pi", era="pi",
                            location=str(path), agent_id="pi", group=str(tmp_path)),
                store, window)
    found = PinIndex(catalog).own(t.session_id, Policy())
    oracle_store, oracle_window = JsonlTranscript.start(path, lambda *_: None, None,
                                                        whole_below=0)
    whole = Catalog()
    whole.put(SessionInfo(session_id=t.session_id, source="pi", era="pi",
                          location=str(path), agent_id="pi", group=str(tmp_path)),
              oracle_store, oracle_window)
    assert len(found.pins) == 1 and found == _oracle(whole, t.session_id, Policy())


def test_a_long_transcript_without_a_marker_is_not_parsed(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    """Most sessions pin nothing: their first read searches the file's bytes (a tool's
    ``!pinned`` in code is no marker to it) and parses none of its lines."""
    t = Transcript("plain")
    _long(t, 300)
    catalog, _store = _tracked(tmp_path, t)
    reads: list[object] = []
    real = JsonlTranscript.read_window

    def counted(self: JsonlTranscript, min_messages: int | None) -> Any:
        reads.append(min_messages)
        return real(self, min_messages)

    monkeypatch.setattr(JsonlTranscript, "read_window", counted)
    found = PinIndex(catalog).own(t.session_id, Policy())
    assert found.pins == () and reads == []
    t.user("!pin but this one")  # a marker: the transcript is read
    t.assistant("ok")
    catalog, _store = _tracked(tmp_path / "marked", t)
    assert [p.text for p in PinIndex(catalog).own(t.session_id, Policy()).pins] == [
        "!pin but this one"]
    assert reads


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_long_sessions_read_as_a_whole_read_does(tmp_path: Path, seed: int) -> None:
    """Markers, unpins, ``!pin ^``, resets and edits anywhere in long transcripts read from
    their end, then grown past their window a few times: the pins are a whole read's."""
    rng = random.Random(seed)
    for n in range(6):
        pin_assistant = rng.random() < 0.3
        policy = Policy() if not pin_assistant else Policy(pin_assistant=True)
        t = Transcript(f"r{seed}-{n}")
        for _block in range(rng.randint(1, 4)):
            _long(t, rng.randint(20, 120), rng)
            t.user(rng.choice(USER_TEXTS + PLAIN))
            t.assistant("📌 a reply with a marker")
            if rng.random() < 0.2:
                t.reset()
            if rng.random() < 0.3:
                users = [o["id"] for o in t.objs if o["type"] == "message"
                         and o["message"]["role"] == "user"]
                t._add("context_edit", targetId=rng.choice(users), replacement=rng.choice(
                    [None, {"content": "!pin edited in"}, {"content": "edited out"}]))
        root = tmp_path / t.session_id
        catalog, store = _tracked(root, t)
        index = PinIndex(catalog)
        assert index.own(t.session_id, policy) == _whole_read(root, t, policy), n
        for round_ in range(3):
            _long(t, rng.randint(1, 150), rng)
            _grow(root, t, catalog, store)
            assert index.own(t.session_id, policy) == _whole_read(root, t, policy), (n, round_)


@pytest.mark.parametrize("first", ["--clean start over", "start over, --clean later"])
def test_a_clean_slate_asked_for_long_ago_still_counts(tmp_path: Path, first: str) -> None:
    """The clean-slate marker opens the session's first user message, long before the window:
    the session inherits nothing, as a whole read says (and a marker later in the text is
    no clean slate)."""
    t = Transcript("clean")
    t.user(first)
    _long(t, 300)
    catalog, _store = _tracked(tmp_path, t)
    scanned = PinIndex(catalog)._own(t.session_id, Policy())
    assert scanned is not None and scanned.clean == first.startswith("--clean")


def test_through_tailfloor_a_long_session_s_old_pin_reaches_the_upstream(
        fake: FakeUpstream, tmp_path: Path) -> None:
    """A real tailfloor started over a long Pi transcript (its scan reads only the end):
    after the agent's compaction the upstream gets the pin written 300 turns earlier, and
    still does once the agent has written 250 turns more and pinned again."""
    t = Transcript("01a22a55-0000-7000-8000-00000001095e")
    t.user("Hello, a first turn.")
    t.assistant("hi")
    t.user(PIN)
    t.assistant("understood")
    _long(t, 300)
    compacted(t)
    mirror = Catalog()  # what the agent sends: its own context of the same transcript
    with tailfloor_over(fake, tmp_path, t) as (proxy, path):
        assert path.stat().st_size > 256 * 1024
        put(mirror, t)
        _post(proxy, request_for(mirror, t.session_id))
        assert pins_sent(fake.chat_requests()[-1].body) == [PIN]
        seen, written = _updated(proxy, t.session_id), len(t.objs)
        t.user("!pin and keep the changelog short")
        _long(t, 250)
        compacted(t)
        append_and_wait(proxy, path, t, written, seen)
        put(mirror, t)
        _post(proxy, request_for(mirror, t.session_id))
        assert pins_sent(fake.chat_requests()[-1].body) == [
            PIN, "!pin and keep the changelog short"]
