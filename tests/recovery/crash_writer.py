"""Writes compactions in a loop until killed; the crash-consistency test SIGKILLs it mid-write.

Every record is a pure function of its sequence number, so after the crash the test can check
that each stored row is whole (summary, count, tokens and chain all belong to the same record).
Prints ``<seq>`` after each committed put so the test knows what was acknowledged.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from proxy.recovery.sqlite_store import CompactionStore

SESSIONS = 4
PER_SESSION = 12


def record_for(seq: int) -> tuple[str, list[dict[str, Any]], str, int]:
    session = f"agent:main:s{seq % SESSIONS}"
    count = 2 + seq % 7
    messages: list[dict[str, Any]] = [
        {"role": "user" if k % 2 == 0 else "assistant", "content": f"{session} m{k} seq{seq}"}
        for k in range(count)]
    # tens of kilobytes: a record spans many pages, so a torn write would show
    summary = f"## Goal\nrecord {seq}\n" + (f"line {seq} " * (2000 + (seq * 37) % 4000))
    return session, messages, summary, 1000 + seq


def main(state_dir: str, start: int) -> None:
    store = CompactionStore(Path(state_dir), max_per_session=PER_SESSION)
    seq = start
    while True:
        session, messages, summary, tokens = record_for(seq)
        store.put(session, messages, summary, tokens)
        sys.stdout.write(f"{seq}\n")
        sys.stdout.flush()
        seq += 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
