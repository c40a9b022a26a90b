"""Compactions remembered across requests and restarts, in an embedded SQLite file.

One row per compaction: the session key, the chained fingerprint of the last summarized
message and how many messages that prefix holds (see fingerprint.py), the summary, the tokens
it replaced, and when it was made and last used. A request is matched by walking its messages'
prefix chain and looking the chains up; the longest stored prefix wins.

Durability choice: WAL with ``synchronous=NORMAL``. In WAL mode NORMAL never corrupts the
database: a killed process loses nothing that was committed (the WAL is written before COMMIT
returns), and a power cut loses at most the last commits, which are a cache here (a lost
summary costs one summarizer call, never a wrong answer). FULL would add an fsync to every
put on the request path for no correctness gain.

Threads: one connection shared behind a lock (``check_same_thread=False``); every method is
one short transaction, so calling from several threads is safe. ``find_for`` and ``touch`` take
well under a millisecond and may run directly on the event loop; ``put`` may wait for the WAL
write and should go through ``asyncio.to_thread`` on the request path.

Files: only ``<state>/compactions.sqlite3`` and its ``-wal``/``-shm`` companions, created 0600
(summaries hold conversation content). A file that is not a readable database is renamed
``compactions.sqlite3.corrupt-<unix time>`` beside it and a new one started.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.recovery.message_chain import prefix_chain

__all__ = ["FILENAME", "CompactionStore", "StoredCompaction"]

FILENAME = "compactions.sqlite3"
_SCHEMA_VERSION = 1
_LOOKUP_BATCH = 500  # chains per IN (...) query, well under SQLite's variable limit
_LOG = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS compactions (
    id INTEGER PRIMARY KEY,
    session_key TEXT NOT NULL,
    chain TEXT NOT NULL,
    message_count INTEGER NOT NULL CHECK (message_count > 0),
    summary TEXT NOT NULL,
    size INTEGER NOT NULL,
    tokens_replaced INTEGER NOT NULL,
    created_at REAL NOT NULL,
    used_at REAL NOT NULL,
    UNIQUE (session_key, chain)
);
CREATE INDEX IF NOT EXISTS compactions_chain ON compactions (chain);
CREATE INDEX IF NOT EXISTS compactions_session_used ON compactions (session_key, used_at);
CREATE INDEX IF NOT EXISTS compactions_used ON compactions (used_at, size);
"""
_COLUMNS = ("id, session_key, chain, message_count, summary, tokens_replaced, created_at, "
            "used_at")


@dataclass(frozen=True, slots=True)
class StoredCompaction:
    id: int
    session_key: str
    chain: str  # chained fingerprint of the last summarized message
    message_count: int  # how many leading messages the summary replaces
    summary: str
    tokens_replaced: int
    created_at: float
    used_at: float


def _record(row: Sequence[Any]) -> StoredCompaction:
    return StoredCompaction(int(row[0]), str(row[1]), str(row[2]), int(row[3]), str(row[4]),
                            int(row[5]), float(row[6]), float(row[7]))


class CompactionStore:
    """Compactions per session, bounded per session and in total (least recently used go)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        max_per_session: int = 16,
        max_total: int = 10_000,
        max_total_bytes: int = 256 * 1024 * 1024,
        max_summary_bytes: int = 1024 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if min(max_per_session, max_total, max_total_bytes, max_summary_bytes) <= 0:
            raise ValueError("store bounds must be positive")
        self._dir = Path(state_dir)
        self.path = self._dir / FILENAME
        self._max_per_session = max_per_session
        self._max_total = max_total
        self._max_total_bytes = max_total_bytes
        self._max_summary_bytes = max_summary_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError as exc:
            aside = self.path.with_name(f"{FILENAME}.corrupt-{int(self._clock())}")
            _LOG.warning("compaction store %s unreadable (%s); moved to %s and starting empty",
                         self.path, exc, aside.name)
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self._conn = self._open()

    def _open(self) -> sqlite3.Connection:
        # created 0600 before SQLite opens it; SQLite gives -wal/-shm the same mode
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > _SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"schema version {version} is newer than this build")
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def put(
        self,
        session_key: str,
        summarized: Sequence[Mapping[str, Any]],
        summary: str,
        tokens_replaced: int,
    ) -> StoredCompaction:
        """Remember that ``summary`` replaces the messages ``summarized`` (a request prefix)."""
        if not summarized:
            raise ValueError("a compaction summarizes at least one message")
        size = len(summary.encode("utf-8", errors="replace"))
        if size > self._max_summary_bytes:
            raise ValueError(f"summary of {size} bytes exceeds {self._max_summary_bytes}")
        chain = prefix_chain(summarized)[-1]
        now = self._clock()
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "INSERT INTO compactions (session_key, chain, message_count, summary, size,"
                    " tokens_replaced, created_at, used_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (session_key, chain) DO UPDATE SET summary = excluded.summary,"
                    " size = excluded.size, tokens_replaced = excluded.tokens_replaced,"
                    " created_at = excluded.created_at, used_at = excluded.used_at"
                    f" RETURNING {_COLUMNS}",
                    (session_key, chain, len(summarized), summary, size, int(tokens_replaced),
                     now, now)).fetchone()
                self._evict_session(session_key)
                self._evict_total()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return _record(row)

    def find_for(
        self, messages: Sequence[Mapping[str, Any]], session_key: str | None = None
    ) -> StoredCompaction | None:
        """The stored compaction covering the longest prefix of ``messages``, if any.

        Without a session key any session's compaction of the same prefix matches: the summary
        of identical messages is equally valid for whoever sends them.
        """
        chains = prefix_chain(messages)
        position = {c: k + 1 for k, c in enumerate(chains)}
        best: StoredCompaction | None = None
        with self._lock:
            for start in range(0, len(chains), _LOOKUP_BATCH):
                batch = chains[start:start + _LOOKUP_BATCH]
                marks = ",".join("?" * len(batch))
                sql = f"SELECT {_COLUMNS} FROM compactions WHERE chain IN ({marks})"
                params: list[Any] = list(batch)
                if session_key is not None:
                    sql += " AND session_key = ?"
                    params.append(session_key)
                for row in self._conn.execute(sql, params):
                    found = _record(row)
                    if position.get(found.chain) != found.message_count:
                        continue
                    if best is None or (found.message_count, found.used_at) > (
                            best.message_count, best.used_at):
                        best = found
        return best

    def touch(self, compaction_id: int) -> None:
        """Mark a compaction as used now (it was applied to a request)."""
        with self._lock:
            self._conn.execute("UPDATE compactions SET used_at = ? WHERE id = ?",
                               (self._clock(), compaction_id))

    def evict(self) -> int:
        """Apply the bounds to every session and to the total; the number of rows removed."""
        with self._lock:
            conn = self._conn
            before = conn.total_changes
            conn.execute("BEGIN IMMEDIATE")
            try:
                keys = [r[0] for r in conn.execute(
                    "SELECT session_key FROM compactions GROUP BY session_key HAVING count(*) > ?",
                    (self._max_per_session,))]
                for key in keys:
                    self._evict_session(key)
                self._evict_total()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return conn.total_changes - before

    def session_keys(self) -> set[str]:
        """Every session with a stored compaction (callers skip lookups for the others)."""
        with self._lock:
            return {str(r[0]) for r in self._conn.execute(
                "SELECT DISTINCT session_key FROM compactions")}

    def count(self, session_key: str | None = None) -> int:
        with self._lock:
            if session_key is None:
                row = self._conn.execute("SELECT count(*) FROM compactions").fetchone()
            else:
                row = self._conn.execute("SELECT count(*) FROM compactions WHERE session_key = ?",
                                         (session_key,)).fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.execute("PRAGMA optimize")
            finally:
                self._conn.close()

    def _evict_session(self, session_key: str) -> None:
        self._conn.execute(
            "DELETE FROM compactions WHERE id IN (SELECT id FROM compactions"
            " WHERE session_key = ? ORDER BY used_at DESC, id DESC LIMIT -1 OFFSET ?)",
            (session_key, self._max_per_session))

    def _evict_total(self) -> None:
        count, size = self._conn.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM compactions").fetchone()
        if count > self._max_total:
            self._conn.execute(
                "DELETE FROM compactions WHERE id IN (SELECT id FROM compactions"
                " ORDER BY used_at ASC, id ASC LIMIT ?)", (count - self._max_total,))
        if size > self._max_total_bytes:
            self._conn.execute(
                "DELETE FROM compactions WHERE id IN (SELECT id FROM (SELECT id, sum(size)"
                " OVER (ORDER BY used_at DESC, id DESC) AS kept FROM compactions) WHERE kept > ?)",
                (self._max_total_bytes,))
