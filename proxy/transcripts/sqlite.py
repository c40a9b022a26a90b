"""Read OpenClaw's per-agent SQLite store (2026.9.x), strictly read-only.

``<state>/agents/<agentId>/agent/openclaw-agent.sqlite`` (WAL mode):

* ``transcript_events(session_id, seq, event_json, event_zstd, event_utf8_bytes, ...)``: one
  transcript entry per row in ``seq`` order, the same JSON a JSONL line held; exactly one
  of ``event_json`` / ``event_zstd`` (zstd-compressed UTF-8) is set.
* ``session_windows(session_id, session_key, previous_session_id, reason, created_at, ...)``:
  a session and its predecessor (idle/daily expiry mints a new id).
* ``session_nodes(session_key, current_session_id, ...)``: a key's current session.

The database is opened with ``mode=ro`` (URI) and only SELECTs are issued, so the agent is
never blocked or written to. Rows that cannot be decoded are skipped and reported.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import zstandard

from proxy.transcripts.entries import Entry, EntryError, Header, parse_entry, parse_header
from proxy.transcripts.jsonl import ErrorSink
from proxy.transcripts.records import Window

__all__ = ["AgentDatabase", "SessionRow", "SqliteTranscript"]

PAGE = 64
WHOLE_BELOW = 128  # rows


@dataclass(frozen=True, slots=True)
class SessionRow:
    session_id: str
    session_key: str | None
    previous_session_id: str | None
    reason: str | None
    created: float | None
    current: bool


class AgentDatabase:
    """A read-only connection to one agent's database."""

    def __init__(self, path: Path, on_error: ErrorSink) -> None:
        self.path = path
        self._on_error = on_error
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._dctx = zstandard.ZstdDecompressor()

    def identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def connect(self) -> sqlite3.Connection:
        """The open connection; reopened when the database file was replaced."""
        ident = self.identity()
        if self._conn is not None and ident == self._identity:
            return self._conn
        self.close()
        uri = f"file:{quote(str(self.path))}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=2.0, check_same_thread=False,
                               isolation_level=None)
        conn.execute("PRAGMA query_only = ON")
        self._conn, self._identity = conn, ident
        return conn

    def replaced(self) -> bool:
        return self._conn is not None and self.identity() != self._identity

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def sessions(self) -> list[SessionRow]:
        """Every session with transcript rows, with its key and predecessor."""
        conn = self.connect()
        current = {sid for (sid,) in conn.execute(
            "SELECT current_session_id FROM session_nodes")}
        windows = {row[0]: row for row in conn.execute(
            "SELECT session_id, session_key, previous_session_id, reason, created_at "
            "FROM session_windows")}
        out: list[SessionRow] = []
        for (sid,) in conn.execute("SELECT DISTINCT session_id FROM transcript_events"):
            w = windows.get(sid)
            out.append(SessionRow(
                session_id=sid, session_key=w[1] if w else None,
                previous_session_id=w[2] if w else None, reason=w[3] if w else None,
                created=(w[4] / 1000.0) if w and isinstance(w[4], int) else None,
                current=sid in current))
        return out

    def last_seqs(self) -> dict[str, int]:
        conn = self.connect()
        return {sid: seq for sid, seq in conn.execute(
            "SELECT session_id, MAX(seq) FROM transcript_events GROUP BY session_id")}

    def decode(self, session_id: str, seq: int, text: str | None, blob: bytes | None,
               size: int | None) -> Any:
        """A row's JSON object, or None (reported) when it cannot be decoded."""
        where = f"{self.path} session {session_id} seq {seq}"
        raw: bytes | str
        if text is not None:
            raw = text
        elif blob is not None:
            try:
                raw = self._dctx.decompress(blob, max_output_size=max(size or 0, 1 << 20))
            except zstandard.ZstdError as exc:
                self._on_error("zstd", where, f"row does not decompress: {exc}")
                return None
        else:
            self._on_error("malformed_row", where, "row has no event")
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            kind = "invalid_utf8" if "utf-8" in str(exc).lower() else "malformed_json"
            self._on_error(kind, where, "row skipped")
            return None

    def rows(self, session_id: str, query: str, params: Sequence[Any]
             ) -> list[tuple[int, Any]]:
        conn = self.connect()
        cur = conn.execute(
            "SELECT seq, event_json, event_zstd, event_utf8_bytes FROM transcript_events "
            "WHERE session_id = ? " + query, (session_id, *params))
        return [(seq, self.decode(session_id, seq, text, blob, size))
                for seq, text, blob, size in cur]


class SqliteTranscript:
    """One session's rows in an agent database. Implements ``TranscriptStore``."""

    def __init__(self, db: AgentDatabase, session_id: str, on_error: ErrorSink) -> None:
        self.db = db
        self.session_id = session_id
        self.last_seq = -1
        self._on_error = on_error
        self.header: Header | None = None

    def read_header(self) -> Header | None:
        rows = self.db.rows(self.session_id, "ORDER BY seq LIMIT 1", ())
        if not rows or rows[0][1] is None:
            return None
        try:
            self.header = parse_header(rows[0][1])
        except EntryError as exc:
            self._on_error(exc.kind, f"{self.db.path} session {self.session_id}", str(exc))
            return None
        self._header_seq = rows[0][0]
        return self.header

    def _entries(self, rows: Sequence[tuple[int, Any]]) -> list[Entry]:
        out: list[Entry] = []
        for seq, obj in rows:
            if obj is None or (isinstance(obj, Mapping) and obj.get("type") == "session"):
                continue
            try:
                out.append(parse_entry(obj, seq))
            except EntryError as exc:
                self._on_error(exc.kind, f"{self.db.path} session {self.session_id} seq {seq}",
                               str(exc))
        return out

    def begin(self, min_messages: int | None, whole_below: int = WHOLE_BELOW) -> Window:
        """``read_window``, then follow rows after the last one read. Sessions with fewer
        than ``whole_below`` rows are read whole."""
        if min_messages is not None:
            try:
                (rows,) = self.db.connect().execute(
                    "SELECT count(*) FROM transcript_events WHERE session_id = ?",
                    (self.session_id,)).fetchone()
                if rows <= whole_below:
                    min_messages = None
            except sqlite3.Error:
                pass
        window = self.read_window(min_messages)
        self.last_seq = max(self.last_seq, window.end)
        return window

    def read_window(self, min_messages: int | None) -> Window:
        try:
            if min_messages is None:
                rows = self.db.rows(self.session_id, "ORDER BY seq", ())
                end = rows[-1][0] if rows else -1
                return Window(self._entries(rows), True, end=end)
            found: list[Entry] = []
            upper: int | None = None
            complete = False
            end = -1
            while True:
                cond = "AND seq < ? " if upper is not None else ""
                params = (upper,) if upper is not None else ()
                rows = self.db.rows(self.session_id, cond + f"ORDER BY seq DESC LIMIT {PAGE}",
                                    params)
                if upper is None and rows:
                    end = rows[0][0]
                rows.reverse()
                found = self._entries(rows) + found
                if len(rows) < PAGE:
                    complete = True
                    break
                upper = rows[0][0]
                if sum(1 for e in found if e.is_raw_message) >= min_messages:
                    break
            return Window(found, complete, end=end)
        except sqlite3.Error as exc:
            self._on_error("sqlite", f"{self.db.path} session {self.session_id}", str(exc))
            return Window((), False)

    def read_marks(self, before: int) -> list[Entry]:
        """Compaction and reset entries with ``seq`` below ``before`` (OpenClaw indexes
        event types in ``transcript_event_identities``; without it, every row is read)."""
        try:
            conn = self.db.connect()
            try:
                seqs = [seq for (seq,) in conn.execute(
                    "SELECT seq FROM transcript_event_identities WHERE session_id = ? AND "
                    "event_type IN ('compaction', 'reset') AND seq < ? ORDER BY seq",
                    (self.session_id, before))]
                rows = [r for seq in seqs for r in self.db.rows(
                    self.session_id, "AND seq = ?", (seq,))]
            except sqlite3.OperationalError:
                rows = self.db.rows(self.session_id, "AND seq < ? ORDER BY seq", (before,))
        except sqlite3.Error as exc:
            self._on_error("sqlite", f"{self.db.path} session {self.session_id}", str(exc))
            return []
        return [e for e in self._entries(rows) if e.kind in ("compaction", "reset")]

    def poll(self) -> list[Entry]:
        """Rows added since the last read (``seq`` above the last seen)."""
        try:
            rows = self.db.rows(self.session_id, "AND seq > ? ORDER BY seq", (self.last_seq,))
        except sqlite3.Error as exc:
            self._on_error("sqlite", f"{self.db.path} session {self.session_id}", str(exc))
            return []
        if rows:
            self.last_seq = rows[-1][0]
        return self._entries(rows)

    def load(self, entries: Sequence[Entry]) -> list[Mapping[str, Any] | None]:
        if not entries:
            return []
        seqs = [e.pos for e in entries]
        try:
            rows = dict(self.db.rows(self.session_id, "AND seq BETWEEN ? AND ?",
                                     (min(seqs), max(seqs))))
        except sqlite3.Error:
            return [None] * len(entries)
        out: list[Mapping[str, Any] | None] = []
        for seq in seqs:
            obj = rows.get(seq)
            out.append(obj if isinstance(obj, Mapping) else None)
        return out
