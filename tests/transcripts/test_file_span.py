"""Transcript lines re-read with one positioned read: the bytes asked for, and few system
calls (each one lets a worker thread lose the interpreter's lock to a busy event loop)."""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.transcripts import file_span
from proxy.transcripts.file_span import read_span
from proxy.transcripts.jsonl import JsonlTranscript

HEADER = {"type": "session", "version": 3, "id": "s-span", "timestamp": "2026-11-30T03:00:00Z",
          "cwd": "/w"}


def _transcript(path: Path, count: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    parent = None
    for i in range(count):
        entry_id = f"e{i:04d}"
        objs.append({"type": "message", "id": entry_id, "parentId": parent,
                     "timestamp": "2026-11-30T03:00:01Z",
                     "message": {"role": "user" if i % 2 == 0 else "assistant",
                                 "content": f"message {i} " + "é" * (i % 7)}})
        parent = entry_id
    path.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in [HEADER, *objs]))
    return objs


def test_a_span_is_the_files_bytes_and_shorter_past_its_end(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 300
    path.write_bytes(data)
    assert read_span(path, 0, len(data)) == data
    assert read_span(path, 1000, 5000) == data[1000:6000]
    assert read_span(path, len(data) - 10, 100) == data[-10:]
    assert read_span(path, len(data) + 5, 10) == b""
    assert read_span(tmp_path / "missing", 0, 10) is None
    assert read_span(tmp_path, 0, 10) is None  # a directory opens, but does not read


def test_a_short_read_is_read_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    data = os.urandom(50_000)
    path.write_bytes(data)
    real = os.pread

    def trickle(fd: int, size: int, offset: int) -> bytes:
        return real(fd, min(size, 7_000), offset)

    monkeypatch.setattr(file_span.os, "pread", trickle)
    assert read_span(path, 123, 40_000) == data[123:40_123]


def test_loading_entries_takes_one_open_one_read_and_one_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "2026-11-30T03-00-00-000Z_s-span.jsonl"
    objs = _transcript(path, 40)
    store = JsonlTranscript.open(path, lambda *a: None)
    entries = list(store.read_window(None).entries)
    calls: list[str] = []
    for name in ("open", "pread", "close", "read", "lseek", "fstat"):
        real = getattr(os, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(os, name, counted)
    real_open = builtins.open

    def no_buffered_open(*args: Any, **kwargs: Any) -> Any:
        calls.append("builtins.open")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_buffered_open)
    picked = entries[5:30:3]
    loaded = store.load(picked)
    assert calls == ["open", "pread", "close"]
    assert loaded == [objs[int(e.id[1:])] for e in picked]


def test_entries_cut_off_by_a_truncation_load_as_none(tmp_path: Path) -> None:
    path = tmp_path / "2026-11-30T03-00-00-000Z_s-span.jsonl"
    objs = _transcript(path, 10)
    store = JsonlTranscript.open(path, lambda *a: None)
    entries = list(store.read_window(None).entries)
    with path.open("r+b") as f:
        f.truncate(entries[6].pos + 5)
    loaded = store.load(entries)
    assert loaded[:6] == objs[:6]
    assert loaded[6:] == [None] * 4
    path.unlink()
    assert store.load(entries) == [None] * 10


def test_a_failing_close_still_gives_the_bytes(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    real = os.close

    def failing(fd: int) -> None:
        real(fd)
        raise OSError(5, "EIO on close")

    monkeypatch.setattr(file_span.os, "close", failing)
    assert read_span(path, 2, 5) == b"23456"


def test_what_a_file_holds_is_found_across_its_pieces(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A needle cut in two by a piece's end is still found; case is ASCII-folded; a
    pattern is searched too; bytes before ``start`` are not looked at."""
    import re

    monkeypatch.setattr(file_span, "_PIECE", 64)
    path = tmp_path / "f"
    head = b"!PIN at the head\n"
    body = bytearray(b"." * 300)
    body[62:66] = b"!pIn"  # across the first piece's end (start at len(head))
    body[200:206] = b"\\u0021"
    path.write_bytes(head + bytes(body))
    escape = re.compile(rb"\\u00[2-7][0-9a-f]")
    start = len(head)
    assert file_span.file_holds_any(path, start, (b"!pin", b"absent")) is True
    assert file_span.file_holds_any(path, start, (escape, b"absent")) is True
    assert file_span.file_holds_any(path, start + 70, (b"!pin", b"absent")) is False
    assert file_span.file_holds_any(path, 0, (b"at the head",)) is True
    assert file_span.file_holds_any(path, start, (b"at the head",)) is False
    assert file_span.file_holds_any(tmp_path / "missing", 0, (b"!pin",)) is None


@pytest.mark.parametrize("stops", [0, 2, 1024])
def test_what_a_file_holds_is_what_each_needle_alone_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stops: int) -> None:
    """Needles that share a first byte are searched in one pass (up to ``stops`` places of
    that byte, then one pass each): the answer is always that of searching each needle on its
    own over the whole lowered file, the test's oracle. Files of bytes that needles start
    with, in pieces of 64 bytes."""
    import random
    import re

    monkeypatch.setattr(file_span, "_PIECE", 64)
    monkeypatch.setattr(file_span, "_SHARED_STOPS", stops)
    rng = random.Random(stops)
    alphabet = [b"!", b"-", b"\\", b"u", b"p", b"i", b"n", b"P", b"I", b"N", b"\xc4", b"\xb0",
                b"\xf0", b"\x9f", b"0", b"2", b"1", b" ", b"\n"]
    words = [b"!pin", b"!unpin", b"!p\xc4", b"!unp\xc4", b"\xf0\x9f\x93\x8c", b"--clean",
             b"!p", b"-x", b"n"]
    escape = re.compile(rb"\\u(?:0021|0070)")
    path = tmp_path / "f"
    for case in range(400):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 400)))
        if rng.random() < 0.5:
            at = rng.randrange(0, len(data) + 1)
            planted = rng.choice([*words, b"\\u0021", b"!PIN", b"!UnPiN"])
            data = data[:at] + planted + data[at:]
        path.write_bytes(data)
        needles: list[bytes | re.Pattern[bytes]] = rng.sample(words, rng.randrange(1, 6))
        if rng.random() < 0.5:
            needles.append(escape)
        low = data.lower()
        expected = any(n in low if isinstance(n, bytes) else n.search(low) is not None
                       for n in needles)
        assert file_span.file_holds_any(path, 0, needles) is expected, (case, data, needles)


def test_a_file_of_nothing_but_a_shared_first_byte_is_searched_in_bounded_passes(
        tmp_path: Path) -> None:
    """A hostile file of ``!`` (every place a group's first byte): past the stops, each
    needle is searched on its own, and the answer holds at the file's very end."""
    path = tmp_path / "f"
    path.write_bytes(b"!" * 3_000_000 + b"!unpin")
    assert file_span.file_holds_any(path, 0, (b"!pin", b"!unpin")) is True
    path.write_bytes(b"!" * 3_000_000)
    assert file_span.file_holds_any(path, 0, (b"!pin", b"!unpin")) is False


def test_a_needle_longer_than_a_piece_is_still_searched_to_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces overlap by a needle's length: one longer than a piece makes pieces longer,
    never a search that stays where it is."""
    monkeypatch.setattr(file_span, "_PIECE", 64)
    needle = b"--" + b"x" * 198
    path = tmp_path / "f"
    path.write_bytes(b"." * 1000 + needle + b"." * 10)
    assert file_span.file_holds_any(path, 0, (needle,)) is True
    path.write_bytes(b"." * 5000)
    assert file_span.file_holds_any(path, 0, (needle,)) is False
