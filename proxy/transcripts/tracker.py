"""Keep a Catalog in step with the files and databases under the roots (synchronous I/O).

``scan`` reads everything once (each file's header and tail only, unless ``full``);
``changed`` applies a batch of changed paths (from the watcher): appended lines, new,
renamed and deleted files, sessions.json rewrites, new SQLite rows, a replaced database.
Every problem is reported through the ``ErrorSink`` and skipped.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from proxy.transcripts import scan_pool
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.discovery import FileKind, classify, inside, walk
from proxy.transcripts.jsonl import (
    WHOLE_BELOW,
    ErrorSink,
    JsonlTranscript,
    TranscriptUnreadable,
)
from proxy.transcripts.records import SessionInfo, SourceKind
from proxy.transcripts.scan_worker import Read, opened
from proxy.transcripts.sqlite import AgentDatabase, SqliteTranscript
from proxy.transcripts.state import SettledWindow

__all__ = ["Tracker"]

log = logging.getLogger(__name__)
JSONL_ROLES = ("pi", "openclaw-jsonl", "reset-archive", "deleted-archive")
# A reset renames the old file and writes the new header in the same moment.
RESET_LINK_WINDOW = 10.0


@dataclass
class _Db:
    db: AgentDatabase
    agent_id: str | None
    sessions: dict[str, SqliteTranscript]


class Tracker:
    """Reads transcripts into a Catalog and keeps it current. Never writes anything."""

    def __init__(self, roots: Sequence[Path], catalog: Catalog, on_error: ErrorSink, *,
                 startup_messages: int | None = 8, full: bool = False,
                 small_whole: bool = True, scan_workers: str = "auto") -> None:
        self.roots = list(roots)
        self._resolved = [r.resolve() for r in roots]
        self._absolute = [r.absolute() for r in roots]
        self.catalog = catalog
        self._on_error = on_error
        self._startup = None if full else startup_messages
        # Small transcripts (JSONL under 64 KiB, SQLite sessions under 128 rows) are read
        # whole at start: exact counts at a cost still bounded per session.
        self._small_whole = small_whole
        self._workers = scan_workers  # processes reading the first scan's files (scan_pool)
        # Paths as strings: one is kept for every tracked session, and a Path object with
        # its parts cost ~450 bytes more (the same string is the session's location).
        self.files: dict[str, tuple[JsonlTranscript, FileKind]] = {}
        self._paths: dict[str, str] = {}  # session id -> file currently read for it
        self._folders: dict[str, set[str]] = {}  # sessions dir -> tracked files in it
        self.dbs: dict[Path, _Db] = {}
        self._keys: dict[str, dict[str, str]] = {}  # sessions dir -> session id -> key
        self._folder_roots: dict[str, str] = {}  # folder -> the root its files lie under
        self._root_names = {r.name for r in (*self._absolute, *self._resolved)}
        self.lines: dict[SourceKind, int] = {}
        self._bulk = False

    def _root_of(self, path: Path) -> str | None:
        """The root (resolved) a tracked path lies under: the session's tenant. The same for
        a folder's files (the scan asks for every file) but where a root is a file."""
        folder, own = str(path.parent), path.name in self._root_names
        if not own and folder in self._folder_roots:
            return self._folder_roots[folder]
        absolute = path.absolute()
        for given, resolved in zip(self._absolute, self._resolved, strict=True):
            if inside(absolute, [given]) or inside(absolute, [resolved]):
                if not own:
                    self._folder_roots[folder] = str(resolved)
                return str(resolved)
        resolved_path = path.resolve()
        return next((str(r) for r in self._resolved if inside(resolved_path, [r])), None)

    # -------------------------------------------------------------------- scan
    # A scan of tens of thousands of sessions makes millions of objects that live as long as
    # the process, and each full collection walks all of them in this thread, holding the
    # GIL: the event loop stood still 450 ms at 50,000 sessions. What is made so far is put
    # out of the collector's reach every so many files, so a collection only walks what came
    # since (the server freezes the rest once indexed).
    FREEZE_EVERY = 1000

    def scan(self) -> None:
        self._bulk = True
        try:
            self._scan()
        finally:
            self._bulk = False
        self.catalog.relink()
        for sid in list(self._paths):
            self._check_links(sid, self._paths[sid])

    def _scan(self) -> None:
        found = deque(walk(self.roots, self._on_error))
        for path, kind in found:
            if kind.role == "sessions-json":
                self._read_keys(path)
        job = (self._startup, WHOLE_BELOW if self._small_whole else 0, self.catalog.tail_limit)
        pooled = scan_pool.reads([str(path) for path, kind in found if kind.role in JSONL_ROLES],
                                 self._workers, job, self._on_error)
        n = 0
        with contextlib.closing(pooled):
            while found:
                # Each listed path is let go once read: 50,000 of them freed at once, when
                # the list went, held the GIL for 30-50 ms.
                path, kind = found.popleft()
                n += 1
                if kind.role in JSONL_ROLES:
                    self._open_jsonl(path, kind, next(pooled))
                elif kind.role == "sqlite":
                    self._open_db(path, kind)
                if n % self.FREEZE_EVERY == 0:
                    gc.freeze()
        self.catalog.relink()
        self._link_archives([Path(f) for f, paths in self._folders.items()
                             if any(self.files[p][1].role == "reset-archive" for p in paths)])

    def resync(self) -> set[str]:
        """Catch up after the watcher was down or a root appeared: every file now under the
        roots and every file tracked before, as one batch of changes."""
        found = [path for path, _kind in walk(self.roots, self._on_error)]
        return self.changed([*found, *map(Path, self.files), *self.dbs])

    # ------------------------------------------------------------------ update
    def changed(self, paths: Iterable[Path]) -> set[str]:
        """Apply changes to these paths; returns the ids of sessions that changed."""
        touched: set[str] = set()
        dirs: set[Path] = set()
        later: list[Path] = []
        for path in sorted(set(self._with_new_dirs(paths)), key=str):
            kind = classify(path)
            if kind.role == "ignored":
                continue
            if not path.exists():
                later.append(path)  # deletions last: a rename shows up as delete + add
                continue
            if not (inside(path.absolute(), self._absolute)
                    or inside(path.absolute(), self._resolved)):
                continue  # a neighbour of a file root: not ours
            if not inside(path.resolve(), self._resolved):
                self._on_error("outside_root", str(path), "symlink leads outside the roots")
                continue
            if kind.role == "sessions-json":
                self._read_keys(path)
                touched |= self._apply_keys(path.parent)
            elif kind.role in JSONL_ROLES:
                touched |= self._jsonl_changed(path, kind)
                if kind.role != "pi":  # a Pi folder holds no OpenClaw file to link
                    dirs.add(path.parent)
            elif kind.role in ("sqlite", "sqlite-side"):
                db_path = path if kind.role == "sqlite" else path.with_name(
                    path.name.rsplit("-", 1)[0])
                touched |= self._db_changed(db_path)
        for path in later:
            touched |= self._gone(path)
            dirs.add(path.parent)
        if dirs:
            self._link_archives(dirs)
        if touched:
            self.catalog.relink()
        return touched

    def _with_new_dirs(self, paths: Iterable[Path]) -> list[Path]:
        """The paths plus the files already inside directories that just appeared: the
        watcher starts following a new directory only once it has seen it, so a file written
        right after the ``mkdir`` (Pi's first session in a new working directory, a new
        OpenClaw agent, a folder deleted and made again) is never reported: looked for."""
        out = list(paths)
        for path in list(out):
            if self._folders.get(str(path)) or path.is_symlink() or not path.is_dir():
                continue
            if inside(path.absolute(), self._absolute) or inside(path.absolute(),
                                                                  self._resolved):
                out.extend(found for found, _kind in walk([path], self._on_error))
        return out

    # ------------------------------------------------------------------- jsonl
    def _source(self, kind: FileKind) -> SourceKind:
        return "pi" if kind.role == "pi" else "openclaw-jsonl"

    def _count(self, source: SourceKind, n: int) -> None:
        self.lines[source] = self.lines.get(source, 0) + n

    def _open_jsonl(self, path: Path, kind: FileKind, read: Read | None = None
                    ) -> str | None:
        """Track the file (``read``: as a scan worker read it)."""
        try:
            t, window = (opened(read, self._on_error) if read is not None else None) or \
                JsonlTranscript.start(path, self._on_error, self._startup,
                                      WHOLE_BELOW if self._small_whole else 0)
        except TranscriptUnreadable as exc:
            self._on_error(exc.kind, str(path), str(exc))
            return None
        sid = t.header.session_id
        where = t.path
        existing = self.catalog.info(sid)
        archive = kind.role in ("reset-archive", "deleted-archive")
        if existing is not None and existing.location != where and \
                Path(existing.location).exists() and archive:
            return None  # the live file wins over an archive of the same session
        self._count(self._source(kind), window.read if isinstance(window, SettledWindow)
                    else len(window.entries))
        source = self._source(kind)
        folder = sys.intern(str(path.parent))  # one string per folder, not one per session
        info = SessionInfo(
            session_id=sid, source=source,
            era="pi" if source == "pi" else "openclaw-2026.7",
            location=where, agent_id=kind.agent_id or ("pi" if source == "pi" else None),
            session_key=self._keys.get(folder, {}).get(sid),
            created=t.header.timestamp, cwd=t.header.cwd, ended=archive,
            group=folder if source == "pi" else None,
            scope=sys.intern(str(path.parent.parent)) if source != "pi" else None,
            root=self._root_of(path))
        if t.header.parent_session:
            parent = self._session_at(Path(t.header.parent_session).name, path.parent)
            if parent:
                info = replace(info, predecessor=parent, link="parent_session")
        old = self._paths.get(sid)
        if old is not None and old != where:
            self._forget(Path(old))
        self.files[where] = (t, kind)
        self._paths[sid] = where
        self._folders.setdefault(folder, set()).add(where)
        self.catalog.put(info, t, window, defer=self._bulk)
        if not self._bulk:
            self._check_links(sid, where)
        return sid

    def _forget(self, path: Path) -> tuple[JsonlTranscript, FileKind] | None:
        where = str(path)
        tracked = self.files.pop(where, None)
        self._folders.get(str(path.parent), set()).discard(where)
        if tracked is not None and self._paths.get(tracked[0].header.session_id) == where:
            del self._paths[tracked[0].header.session_id]
        return tracked

    def _session_at(self, name: str, folder: Path) -> str | None:
        tracked = self.files.get(str(folder / name))
        return tracked[0].header.session_id if tracked else None

    def _jsonl_changed(self, path: Path, kind: FileKind) -> set[str]:
        tracked = self.files.get(str(path))
        if tracked is None:
            sid = self._open_jsonl(path, kind)
            return {sid} if sid else set()
        t, _kind = tracked
        entries = t.poll()
        if entries is None:  # shrunk or replaced: read it again from the top
            before = t.header.session_id
            sid = self._open_jsonl(path, kind)
            if sid is None:
                # Not readable (truncated, half rewritten): the session it held is gone, and
                # the next change opens the file afresh instead of following a stale offset.
                return self._gone(path) | {before}
            if sid != before and self._paths.get(before) == str(path):
                del self._paths[before]  # the file now holds another session
                self.catalog.remove(before)
            return {s for s in (sid, before) if s}
        if entries:
            self._count(self._source(kind), len(entries))
            self.catalog.append(t.header.session_id, entries)
            self._check_links(t.header.session_id, t.path)
            return {t.header.session_id}
        return set()

    def _gone(self, path: Path) -> set[str]:
        tracked = self._forget(path)
        if tracked is not None:
            sid = tracked[0].header.session_id
            info = self.catalog.info(sid)
            if info is not None and info.location == str(path):
                self.catalog.remove(sid)
            return {sid}
        if path.name == "openclaw-agent.sqlite" and path in self.dbs:
            return set()  # keep what we have: a replaced database reappears
        return set()

    def _read_keys(self, path: Path) -> None:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            self._on_error("sessions_json", str(path), str(exc)[:200])
            return
        keys: dict[str, str] = {}
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, dict) and isinstance(value.get("sessionId"), str):
                    keys[value["sessionId"]] = key
        self._keys[str(path.parent)] = keys

    def _apply_keys(self, folder: Path) -> set[str]:
        touched: set[str] = set()
        for sid, key in self._keys.get(str(folder), {}).items():
            info = self.catalog.info(sid)
            if info is not None and info.session_key != key:
                self.catalog.update_info(replace(info, session_key=key))
                touched.add(sid)
        return touched

    def _link_archives(self, folders: Iterable[Path]) -> None:
        """Era A: a new session's predecessor is the archive renamed when it was created."""
        for folder in folders:
            here = [self.files[p] for p in self._folders.get(str(folder), ()) if p in self.files]
            archives = [(t, k) for t, k in here if k.role == "reset-archive" and k.archive_time]
            live = [t for t, k in here if k.role == "openclaw-jsonl"]
            for t in live:
                info = self.catalog.info(t.header.session_id)
                if info is None or (info.predecessor and info.link != "reset_archive"):
                    continue
                created = t.header.timestamp or 0.0
                best = min(archives, default=None,
                           key=lambda a: abs((a[1].archive_time or 0.0) - created))
                if best is None or abs((best[1].archive_time or 0.0) - created) \
                        > RESET_LINK_WINDOW:
                    continue
                old = best[0].header.session_id
                self.catalog.update_info(replace(info, predecessor=old, link="reset_archive"))
                old_info = self.catalog.info(old)
                if old_info is not None and info.session_key and not old_info.session_key:
                    self.catalog.update_info(replace(old_info, session_key=info.session_key))

    def _check_links(self, sid: str, where: str) -> None:
        missing = self.catalog.dangling_parent(sid)
        if missing:
            self._on_error("missing_parent", where, f"parent id {missing[:40]!r} not found")

    # ------------------------------------------------------------------ sqlite
    def _open_db(self, path: Path, kind: FileKind) -> set[str]:
        state = _Db(AgentDatabase(path, self._on_error), kind.agent_id, {})
        self.dbs[path] = state
        return self._db_sync(state, reload=True)

    def _db_changed(self, path: Path) -> set[str]:
        state = self.dbs.get(path)
        if state is None:
            return self._open_db(path, classify(path)) if path.exists() else set()
        return self._db_sync(state, reload=state.db.replaced())

    def _db_sync(self, state: _Db, *, reload: bool) -> set[str]:
        import sqlite3

        touched: set[str] = set()
        try:
            if reload:
                state.db.close()
                state.sessions.clear()
            last = state.db.last_seqs()
            rows = {r.session_id: r for r in state.db.sessions()} if reload or any(
                sid not in state.sessions for sid in last) else {}
        except sqlite3.Error as exc:
            self._on_error("sqlite", str(state.db.path), str(exc))
            return touched
        for sid, seq in last.items():
            t = state.sessions.get(sid)
            if t is None:
                row = rows.get(sid)
                t = SqliteTranscript(state.db, sid, self._on_error)
                header = t.read_header()
                if header is None:
                    continue
                window = (t.begin(self._startup) if self._small_whole
                          else t.begin(self._startup, 0))
                self._count("openclaw-sqlite", len(window.entries))
                info = SessionInfo(
                    session_id=sid, source="openclaw-sqlite", era="openclaw-2026.9",
                    location=str(state.db.path), agent_id=state.agent_id,
                    session_key=row.session_key if row else None,
                    created=header.timestamp or (row.created if row else None), cwd=header.cwd,
                    predecessor=row.previous_session_id if row else None,
                    link="session_windows" if row and row.previous_session_id else None,
                    scope=str(state.db.path.parent.parent), root=self._root_of(state.db.path))
                state.sessions[sid] = t
                self.catalog.put(info, t, window, defer=self._bulk)
                touched.add(sid)
            elif seq > t.last_seq:
                entries = t.poll()
                self._count("openclaw-sqlite", len(entries))
                self.catalog.append(sid, entries)
                touched.add(sid)
            if sid in touched:
                self._check_links(sid, f"{state.db.path} session {sid}")
        return touched
