"""Packed windows: what a tracked session keeps between the requests that read it must give
back exactly the entries it was made from, whatever a transcript holds."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import pytest

from proxy.transcripts import packed
from proxy.transcripts.entries import KNOWN_KINDS, Entry, EntryDetail, user_text_key
from proxy.transcripts.jsonl import JsonlTranscript, TranscriptUnreadable

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

IDS = ["a1b2c3d4", "x", "é-ü", "\ud800lone", "", "i" * 254, "i" * 255, "ü" * 128, "7"]
ROLES = [None, "user", "assistant", "toolResult", "bashExecution", "custom", "system",
         "developer", "", "tool"]
STOPS = [None, "stop", "toolUse", "error", "aborted", "length", "refusal", ""]
STAMPS = [None, 0.0, 1796004000.123, -5.5, math.inf, -math.inf, math.nan, 7]
POSITIONS = [0, 1, 12_345, 2**31, 2**63 - 1, 2**63, -1, -(2**63), -(2**63) - 1]
SIZES = [0, 1, 140, 2**32 - 1, 2**32, -1]


def _keys(rng: random.Random) -> tuple[int, ...]:
    roll = rng.random()
    if roll < 0.5:
        return tuple(rng.getrandbits(64) for _ in range(rng.randint(0, 3)))
    if roll < 0.6:
        return tuple(rng.getrandbits(64) for _ in range(rng.choice((255, 256, 300))))
    if roll < 0.7:
        return (rng.choice((-1, 2**64, 2**64 - 1, 0)),)
    return ()


def _entry(rng: random.Random, previous: str | None, n: int) -> Entry:
    ident = rng.choice(IDS) + str(n) if rng.random() < 0.7 else rng.choice(IDS)
    parent = rng.choice([previous, previous, previous, None, "elsewhere", rng.choice(IDS),
                         "p" * 300])
    detail = None
    if rng.random() < 0.1:
        detail = EntryDetail(summary="s", first_kept_id=rng.choice(IDS), removes=True)
    kind = rng.choice(sorted(KNOWN_KINDS)) if rng.random() < 0.95 else "unheard_of"
    return Entry(kind, ident, parent, rng.choice(STAMPS), rng.choice(POSITIONS),
                 rng.choice(SIZES), rng.choice(ROLES), rng.choice(STOPS), _keys(rng), detail,
                 rng.random() < 0.3)


def _check(entries: list[Entry]) -> tuple[bytes, packed.Odd | None]:
    blob, odd = packed.pack(entries)
    assert packed.unpack(blob, odd) == entries
    assert packed.count(blob) == len(entries)
    assert Counter(packed.keys_of(blob, odd)) == Counter(k for e in entries for k in e.keys)
    assert packed.first_pos(blob, odd) == (entries[0].pos if entries else None)
    return blob, odd


@pytest.mark.parametrize("seed", range(40))
def test_any_entries_come_back_equal(seed: int) -> None:
    rng = random.Random(seed)
    entries: list[Entry] = []
    previous = None
    for n in range(rng.randint(0, 60)):
        entry = _entry(rng, previous, n)
        entries.append(entry)
        previous = entry.id
    _check(entries)


def test_every_fixture_transcript_comes_back_equal_and_small() -> None:
    checked = 0
    for path in sorted(FIXTURES.rglob("*.jsonl")):
        try:
            t = JsonlTranscript.open(path, lambda *_a: None)
        except TranscriptUnreadable:
            continue
        entries = list(t.read_window(None).entries)
        for window in (entries, entries[len(entries) // 2:], entries[-3:]):
            blob, odd = _check(window)
            plain = [e for i, e in enumerate(window) if i not in (odd or {})]
            # a row, its keys and its id (8 hex characters in Pi's transcripts)
            assert len(blob) <= 8 + sum(25 + 8 * len(e.keys) + len(e.id.encode()) + 40
                                        for e in plain) + 25 * len(odd or {})
        checked += 1
    assert checked >= 20


def test_an_entry_the_rows_cannot_hold_is_kept_as_it_is() -> None:
    nan = Entry("message", "n1", None, math.nan, 0, 10, "user", None, ())
    odd_role = Entry("message", "n2", "n1", 1.0, 10, 10, "developer", None, ())
    long_parent = Entry("message", "n3", "q" * 255, 2.0, 20, 10, "user", None, ())
    plain = Entry("message", "n4", "n3", 3.0, 30, 10, "assistant", "stop",
                  (user_text_key("hi") or 0,))
    blob, odd = _check([nan, odd_role, long_parent, plain])
    assert odd is not None and set(odd) == {0, 1, 2}
    assert odd[0] is nan  # the same object: a NaN is not equal to itself
    assert packed.unpack(blob, odd)[3].parent_id == "n3"


def test_a_user_message_that_may_pin_says_so_after_packing(tmp_path: Path) -> None:
    lines = [{"type": "session", "version": 3, "id": "s", "timestamp": "2026-11-30T03:00:00Z"}]
    contents: list[object] = [
        "plain", "!pin keep it", "say it loud!", "📌 the schema",
        [{"type": "text", "text": "no mark"}, {"type": "image", "data": "", "mimeType": "x"}],
        [{"type": "image", "data": "", "mimeType": "x"}, {"type": "text", "text": "late !"}],
        ["a bare string block"], 7]
    for i, content in enumerate(contents):
        lines.append({"type": "message", "id": f"u{i}", "parentId": f"u{i - 1}" if i else None,
                      "timestamp": "2026-11-30T03:00:01Z",
                      "message": {"role": "user", "content": content}})
    lines.append({"type": "message", "id": "a", "parentId": f"u{len(contents) - 1}",
                  "timestamp": "2026-11-30T03:00:02Z",
                  "message": {"role": "assistant", "content": [{"type": "text", "text": "!"}]}})
    path = tmp_path / "2026-11-30T03-00-00-000Z_s.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    entries = list(JsonlTranscript.open(path, lambda *a: None).read_window(None).entries)
    assert [e.may_pin for e in entries] == [False, True, True, True, False, True, True, False,
                                            False]
    _blob, odd = _check(entries)
    assert odd is None
