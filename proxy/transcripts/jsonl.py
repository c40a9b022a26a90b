"""Read a JSONL transcript incrementally, read-only.

* Start-up reads the header line and then the file backwards in chunks until the wanted
  number of raw messages is found, so start-up cost does not grow with file length.
* ``poll`` reads what was appended since the last byte offset; a last line without its
  newline is left for the next poll (a writer may be half-way through it).
* A file that shrank or whose header changed must be re-read: ``poll`` returns None.
* Bad lines (malformed JSON, invalid UTF-8, over ``MAX_LINE`` bytes, unknown entry types)
  are skipped and reported through ``on_error(kind, location, detail)``.

The file is only ever opened with mode ``rb``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from proxy.transcripts.entries import Entry, EntryError, Header, parse_entry, parse_header
from proxy.transcripts.file_span import file_holds_any, read_span
from proxy.transcripts.records import Window

__all__ = ["MAX_LINE", "ErrorSink", "JsonlTranscript", "TranscriptUnreadable"]

MAX_LINE = 16 * 1024 * 1024
_MARK = re.compile(rb'"type": ?"(?:compaction|reset)"')
CHUNK = 64 * 1024
WHOLE_BELOW = 64 * 1024
ErrorSink = Callable[[str, str, str], None]


class TranscriptUnreadable(Exception):
    """The file is not a usable transcript (no header, unsupported version, unreadable)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def _digest(line: bytes) -> bytes:
    return hashlib.blake2b(line, digest_size=8).digest()


def _decode(line: bytes) -> tuple[Any, str | None]:
    try:
        return orjson.loads(line), None
    except orjson.JSONDecodeError as exc:
        return None, ("invalid_utf8" if "utf-8" in str(exc).lower() else "malformed_json")


# What a scan worker (``scan_worker``) sends of the transcripts it opened: all but the sink.
_SENT = ("_head", "_identity", "_last_id", "_skipping", "_v1_count", "header", "header_end",
         "offset", "path")


class JsonlTranscript:
    """One JSONL transcript file. Implements ``TranscriptStore``. Slotted, and the header
    line kept as a digest: one is held for every tracked session."""

    __slots__ = (*_SENT, "_on_error")

    def __init__(self, path: str | Path, header: Header, header_end: int, on_error: ErrorSink,
                 identity: tuple[int, int], *, head: bytes = b"") -> None:
        self.path = os.fspath(path)  # a string: a Path object costs ~450 bytes a session
        self.header = header
        self.header_end = header_end
        # the header line as read, as a digest: a rewrite in place changes it
        self._head = _digest(head) if head else None
        self.offset = header_end
        self._on_error = on_error
        self._identity = identity[0] << 64 | identity[1]
        self._skipping = False
        self._last_id: str | None = None
        self._v1_count = 0

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _SENT)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(_SENT, state, strict=True):
            setattr(self, name, value)
        self._on_error = lambda _kind, _where, _detail: None  # until ``report_to``

    def report_to(self, on_error: ErrorSink) -> None:
        self._on_error = on_error

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | Path, on_error: ErrorSink) -> JsonlTranscript:
        """Read and validate the header; raise TranscriptUnreadable."""
        return cls._open(path, on_error, -1)[0]

    @classmethod
    def start(cls, path: str | Path, on_error: ErrorSink, min_messages: int | None,
              whole_below: int = WHOLE_BELOW) -> tuple[JsonlTranscript, Window]:
        """``open``, then ``begin``: a file under ``whole_below`` bytes is read once, header
        and entries together (a scan opens every transcript there is)."""
        t, data = cls._open(path, on_error, whole_below)
        if data is None:
            return t, t.begin(min_messages, whole_below)
        t._v1_count, t._last_id = 0, None
        end = data.rfind(b"\n") + 1  # a last line without its newline waits for it
        entries = t._parse_bytes(data[t.header_end:end], t.header_end, from_top=True)
        t.offset = end
        return t, Window(entries, True, end=end)

    @classmethod
    def _open(cls, path: str | Path, on_error: ErrorSink, whole_below: int
              ) -> tuple[JsonlTranscript, bytes | None]:
        """The transcript, and the whole file when it is at most ``whole_below`` bytes."""
        data = None
        try:  # not pathlib: a scan opens every transcript there is, and it cost 8% of it
            with open(os.fspath(path), "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_size <= whole_below:
                    data = f.read(st.st_size)
                    first = data[:data.find(b"\n") + 1] or data
                else:
                    first = f.readline(MAX_LINE + 1)
        except OSError as exc:
            raise TranscriptUnreadable("permission" if isinstance(exc, PermissionError)
                                       else "io", f"{path}: {exc.strerror or exc}") from exc
        if not first.endswith(b"\n"):
            raise TranscriptUnreadable("missing_header", f"{path}: no complete header line")
        obj, err = _decode(first)
        if err is not None:
            raise TranscriptUnreadable("missing_header", f"{path}: header is not JSON")
        try:
            header = parse_header(obj)
        except EntryError as exc:
            raise TranscriptUnreadable(exc.kind, f"{path}: {exc}") from exc
        t = cls(path, header, len(first), on_error, (st.st_dev, st.st_ino), head=first)
        return t, data

    # ----------------------------------------------------------------- reading
    def begin(self, min_messages: int | None, whole_below: int = WHOLE_BELOW) -> Window:
        """``read_window``, then follow the file from the end of what was read. Files under
        ``whole_below`` bytes are read whole (exact counts, at a cost bounded per file)."""
        if min_messages is not None:
            try:
                if os.stat(self.path).st_size <= whole_below:
                    min_messages = None
            except OSError:
                pass
        window = self.read_window(min_messages)
        if window.end >= 0:
            self.offset = window.end
        return window

    def read_window(self, min_messages: int | None) -> Window:
        """The last entries holding ``min_messages`` raw messages (None: the whole file)."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if min_messages is None or self.header.version < 2:
                    return self._whole(f, size)
                return self._read_backwards(f, size, min_messages)
        except OSError as exc:
            self._on_error("io", str(self.path), str(exc.strerror or exc))
            return Window((), False)

    def _read_backwards(self, f: Any, size: int, want: int) -> Window:
        # Only lines ending in a newline count: the last one may still be being written.
        block_at = max(self.header_end, size - CHUNK)
        f.seek(block_at)
        block = f.read(size - block_at)
        nl = block.rfind(b"\n")
        if nl < 0:
            return self._whole(f, size)
        end = block_at + nl + 1
        start, step = end, CHUNK
        batches: list[list[Entry]] = []  # newest first: joined once (a file of thousands)
        raw = 0
        while start > self.header_end:
            new_start = max(self.header_end, start - step)
            if new_start >= block_at:  # the first chunk is already in memory
                data = block[new_start - block_at:start - block_at]
            else:
                f.seek(new_start)
                data = f.read(start - new_start)
            if new_start > self.header_end:
                cut = data.find(b"\n")
                if cut < 0 or cut + 1 == len(data):
                    # no whole line inside the chunk: a line longer than it, widen the read
                    if step > MAX_LINE:
                        return self._whole(f, size)
                    step *= 2
                    continue
                data = data[cut + 1:]
                new_start += cut + 1
            # Parse from the newest line back and stop as soon as enough are found:
            # start-up cost follows the wanted tail, not the chunk or file size.
            batch: list[Entry] = []
            enough = False
            line_end = len(data)
            while line_end > 0:
                line_start = data.rfind(b"\n", 0, line_end - 1) + 1
                entry = self._parse_line(data[line_start:line_end], new_start + line_start,
                                         v1_index=None)
                line_end = line_start
                if entry is not None:
                    batch.append(entry)
                    if entry.is_raw_message:
                        raw += 1
                        if raw >= want:
                            enough = True
                            break
            batch.reverse()
            batches.append(batch)
            start = new_start + line_end
            if enough:
                break
            step = CHUNK * 4
        found = [e for batch in reversed(batches) for e in batch]
        return Window(found, start <= self.header_end, end=end)

    def _whole(self, f: Any, size: int) -> Window:
        self._v1_count, self._last_id = 0, None
        skipping = self._skipping
        entries, end = self._parse_range(f, self.header_end, size, from_top=True)
        self._skipping = skipping  # only the follower's own reads change its state
        return Window(entries, True, end=end)

    def _parse_range(self, f: Any, start: int, size: int, *, from_top: bool
                     ) -> tuple[list[Entry], int]:
        f.seek(start)
        entries: list[Entry] = []
        pos = start
        pending = b""
        pending_at = start
        skipping = False
        while pos < size:
            chunk = f.read(min(4 * 1024 * 1024, size - pos))
            if not chunk:
                break
            pos += len(chunk)
            data = pending + chunk
            base = pending_at
            last_nl = data.rfind(b"\n")
            if skipping:
                first_nl = data.find(b"\n")
                if first_nl < 0:
                    pending, pending_at = b"", pos
                    continue
                skipping = False
                base += first_nl + 1
                data = data[first_nl + 1:]
                last_nl = data.rfind(b"\n")
            if last_nl >= 0:
                entries.extend(self._parse_bytes(data[:last_nl + 1], base, from_top=from_top))
                pending, pending_at = data[last_nl + 1:], base + last_nl + 1
            else:
                pending = data
            if len(pending) > MAX_LINE:
                self._on_error("line_too_long", f"{self.path} @byte {pending_at}",
                               f"line longer than {MAX_LINE} bytes skipped")
                pending, skipping = b"", True
                pending_at = pos
        if skipping:
            self._skipping = True
            return entries, pos
        self._skipping = False
        return entries, pending_at

    def _parse_bytes(self, data: bytes, base: int, *, from_top: bool) -> list[Entry]:
        entries: list[Entry] = []
        pos = 0
        v1 = self.header.version < 2
        loads = orjson.loads
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            line = data[pos:nl + 1]
            at = base + pos
            pos = nl + 1
            entry = None
            if not v1 and len(line) <= MAX_LINE:
                # The common line at the least cost (the scan reads every line there is);
                # anything that fails is read again below, where it is reported.
                try:
                    entry = parse_entry(loads(line), at, len(line))
                except (orjson.JSONDecodeError, EntryError):
                    entry = None
            if entry is None:
                # v1 ids are entry indexes (header = 0), so v1 files are only read whole.
                entry = self._parse_line(line, at, v1_index=self._v1_count + 1
                                         if v1 and from_top else None)
            if entry is not None:
                if v1:  # the next line's parent; not kept otherwise (one per session)
                    self._last_id = entry.id
                self._v1_count += 1
                entries.append(entry)
        return entries

    def _parse_line(self, line: bytes, at: int, v1_index: int | None) -> Entry | None:
        if not line.strip():
            return None
        if len(line) > MAX_LINE:
            self._on_error("line_too_long", f"{self.path} @byte {at}",
                           f"line longer than {MAX_LINE} bytes skipped")
            return None
        obj, err = _decode(line)
        if err is not None:
            self._on_error(err, f"{self.path} @byte {at}", "line skipped")
            return None
        try:
            return parse_entry(obj, at, len(line), v1_index=v1_index,
                               v1_parent=self._last_id if v1_index is not None else None)
        except EntryError as exc:
            self._on_error(exc.kind, f"{self.path} @byte {at}", str(exc))
            return None

    # --------------------------------------------------------------- following
    def poll(self) -> list[Entry] | None:
        """New complete entries since the last call; None when the file must be re-read."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if ((st.st_dev << 64 | st.st_ino) != self._identity or st.st_size < self.offset
                        or (self.header.version < 2 and st.st_size != self.offset)):
                    return None
                # Truncated and written again on the same inode, already as long as before:
                # only the content tells (its first line is another session's, or torn).
                if self._head is not None and _digest(f.read(self.header_end)) != self._head:
                    return None
                if st.st_size == self.offset:
                    return []
                if self._skipping:
                    f.seek(self.offset)
                    rest = f.read(st.st_size - self.offset)
                    nl = rest.find(b"\n")
                    if nl < 0:
                        self.offset = st.st_size
                        return []
                    self._skipping = False
                    self.offset += nl + 1
                entries, end = self._parse_range(f, self.offset, st.st_size, from_top=False)
                self.offset = end
                return entries
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._on_error("permission" if isinstance(exc, PermissionError) else "io",
                           str(self.path), str(exc.strerror or exc))
            return []

    def read_marks(self, before: int) -> list[Entry]:
        """Compaction and reset entries in the file before byte ``before``: its bytes are
        searched for the entry type, not every line parsed (a long transcript's is cheap)."""
        found: list[Entry] = []
        try:
            with open(self.path, "rb") as f:
                pos = self.header_end
                f.seek(pos)
                carry = b""
                while pos < before:
                    chunk = f.read(min(4 * 1024 * 1024, before - pos))
                    if not chunk:
                        break
                    base = pos - len(carry)
                    data = carry + chunk
                    pos += len(chunk)
                    cut = data.rfind(b"\n") + 1
                    data, carry = data[:cut], data[cut:]
                    for m in _MARK.finditer(data):
                        start = data.rfind(b"\n", 0, m.start()) + 1
                        end = data.find(b"\n", m.end()) + 1
                        entry = self._parse_line(data[start:end], base + start, v1_index=None)
                        if entry is not None and entry.kind in ("compaction", "reset"):
                            found.append(entry)
        except OSError:
            return found
        return list({e.id: e for e in found}.values())

    def holds(self, needles: Sequence[bytes | re.Pattern[bytes]]) -> bool | None:
        """Whether the entries' lines hold any of ``needles`` (``file_holds_any``)."""
        return file_holds_any(self.path, self.header_end, needles)

    def load(self, entries: Sequence[Entry]) -> list[Mapping[str, Any] | None]:
        """Re-read the raw objects of entries (one read spanning them, ``read_span``)."""
        if not entries:
            return []
        lo = min(e.pos for e in entries)
        data = read_span(self.path, lo, max(e.pos + e.size for e in entries) - lo)
        if data is None:
            return [None] * len(entries)
        out: list[Mapping[str, Any] | None] = []
        for e in entries:
            obj, err = _decode(data[e.pos - lo:e.pos - lo + e.size])
            out.append(obj if err is None and isinstance(obj, Mapping) else None)
        return out
