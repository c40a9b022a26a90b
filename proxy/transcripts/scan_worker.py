"""The first scan's JSONL reads, done in a process of its own (``scan_pool`` starts it).

A year of transcripts is tens of thousands of files, and parsing them is CPU work in one
thread, holding the interpreter lock: 50,000 sessions took ~25 s on one core while a second
core idled. A worker opens each file it is given exactly as the scan would
(``JsonlTranscript.start``) and sends back the transcript, its window as the catalog keeps
it (``SettledWindow``: trimmed, settled and packed, 25 bytes a row, where a list of entries
would pickle each object) and the problems it reported, for the tracker to put in the
catalog as if it had read the file itself.

Protocol (``python -m proxy.transcripts.scan_worker``): on stdin a frame with the pickled
``(startup_messages, whole_below, tail_limit, number of blocks)``, then a frame for each block, its
list of paths (one pickling of 25,000 paths held the parent's interpreter lock 39 ms); on
stdout one frame per block, in order, the pickled list of ``Read`` tuples for its paths.
A frame is its length (8 bytes, little-endian) and its bytes. Only this process's parent
writes to its stdin, and only it reads its stdout; the transcripts' bytes reach the parent
as values this code made.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import sys
from collections.abc import Sequence
from typing import IO

from proxy.transcripts.jsonl import ErrorSink, JsonlTranscript, TranscriptUnreadable
from proxy.transcripts.state import SessionState, SettledWindow

__all__ = ["FRAME", "Read", "Unreadable", "opened", "read_block", "read_frame", "write_frame"]

FRAME = struct.Struct("<Q")
MAX_FRAME = 64 << 20  # a block of 64 windows is a few hundred KB; a larger length is garbage

Problem = tuple[str, str, str]  # ErrorSink's (kind, where, detail)
# The transcript, its window as the catalog keeps it, and the problems met reading it.
Opened = tuple[JsonlTranscript, SettledWindow, list[Problem]]
Unreadable = tuple[None, Problem, list[Problem]]  # TranscriptUnreadable's kind and detail
Read = Opened | Unreadable


def read_one(path: str, startup: int | None, whole_below: int, limit: int) -> Read:
    """One file as ``JsonlTranscript.start`` reads it, its window settled for a catalog
    that keeps ``limit`` raw messages a session."""
    problems: list[Problem] = []

    def sink(kind: str, where: str, detail: str) -> None:
        problems.append((kind, where, detail))

    try:
        t, window = JsonlTranscript.start(path, sink, startup, whole_below)
    except TranscriptUnreadable as exc:
        return None, (exc.kind, path, str(exc)), problems
    settled = SessionState.settled(list(window.entries), window.complete, window.marks, limit)
    return t, settled, problems


def opened(read: object, on_error: ErrorSink) -> tuple[JsonlTranscript, SettledWindow] | None:
    """What ``JsonlTranscript.start`` would have returned (or raised) for the file a worker
    read, its problems reported to ``on_error`` as that call would have; None for what no
    worker of this code sends (the caller reads the file itself)."""
    if not (isinstance(read, tuple) and len(read) == 3 and isinstance(read[2], list)
            and all(isinstance(p, tuple) and len(p) == 3 and all(isinstance(x, str) for x in p)
                    for p in read[2])):
        return None
    t, sent, problems = read
    if t is None and isinstance(sent, tuple) and len(sent) == 3 \
            and all(isinstance(x, str) for x in sent):
        for problem in problems:
            on_error(*problem)
        raise TranscriptUnreadable(sent[0], sent[2])
    if not (isinstance(t, JsonlTranscript) and isinstance(sent, SettledWindow)):
        return None
    for problem in problems:
        on_error(*problem)
    t.report_to(on_error)
    return t, sent


def read_block(paths: Sequence[str], startup: int | None, whole_below: int, limit: int
               ) -> list[Read]:
    return [read_one(p, startup, whole_below, limit) for p in paths]


def write_frame(out: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(FRAME.pack(len(data)))
    out.write(data)
    out.flush()


def read_frame(source: IO[bytes]) -> object:
    """The next frame's value; EOFError when the stream ends or is cut inside a frame."""
    head = source.read(FRAME.size)
    if len(head) < FRAME.size:
        raise EOFError("no frame")
    (size,) = FRAME.unpack(head)
    if size > MAX_FRAME:
        raise EOFError(f"a frame of {size} bytes")
    data = source.read(size)
    if len(data) < size:
        raise EOFError("frame cut short")
    return pickle.loads(data)  # the parent's own child wrote it


def main() -> int:
    with contextlib.suppress(OSError):  # the server's requests come first on a busy CPU
        os.nice(10)
    startup: int | None
    whole_below: int
    limit: int
    count: int
    startup, whole_below, limit, count = read_frame(sys.stdin.buffer)  # type: ignore[misc]
    blocks = [read_frame(sys.stdin.buffer) for _ in range(count)]
    for block in blocks:
        write_frame(sys.stdout.buffer,
                    read_block(block, startup, whole_below, limit))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
