"""Where transcripts live and what each file is.

``default_roots`` gives the usual places (``$OPENCLAW_STATE_DIR`` or ``~/.openclaw``,
``$PI_CODING_AGENT_DIR`` or ``~/.pi/agent``). ``classify`` names a path's role from its
name and position alone (pure). ``walk`` lists the files under the roots (I/O), staying
inside them: a symlink whose target lies outside every root is reported, not followed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

__all__ = ["FileKind", "FileRole", "classify", "default_roots", "inside", "reset_time", "walk"]

FileRole = Literal["pi", "openclaw-jsonl", "reset-archive", "deleted-archive", "sessions-json",
                   "sqlite", "sqlite-side", "ignored"]
DB_NAME = "openclaw-agent.sqlite"
_ARCHIVE = re.compile(r"^(?P<stem>.+)\.jsonl\.(?P<kind>reset|deleted)\.(?P<ts>.+)$")
_SKIP_DIRS = frozenset({"session-sqlite-import-archive", "node_modules", ".git"})


@dataclass(frozen=True, slots=True)
class FileKind:
    """A path's role; ``agent_id`` from ``agents/<id>/...`` for OpenClaw files."""

    role: FileRole
    agent_id: str | None = None
    archive_time: float | None = None


_PI = FileKind("pi")


def default_roots(environ: Mapping[str, str], home: Path) -> list[Path]:
    """The usual OpenClaw and Pi locations (existing or not)."""
    oc = environ.get("OPENCLAW_STATE_DIR")
    pi = environ.get("PI_CODING_AGENT_DIR")
    return [Path(oc) if oc else home / ".openclaw",
            (Path(pi) if pi else home / ".pi" / "agent") / "sessions"]


def _agent(parts: Sequence[str], below: str) -> str | None:
    """``agents/<id>/<below>/<file>`` -> id."""
    if len(parts) >= 4 and parts[-2] == below and parts[-4] == "agents":
        return parts[-3]
    return None


def reset_time(stamp: str) -> float | None:
    """``2026-03-08T22-03-05.123Z`` (archive suffix) -> epoch seconds."""
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})T(\d{2})-(\d{2})-(\d{2})(\.\d+)?Z", stamp)
    if not m:
        return None
    iso = f"{m[1]}T{m[2]}:{m[3]}:{m[4]}{m[5] or ''}+00:00"
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def classify(path: Path) -> FileKind:
    """What a file under a root is, by name and place."""
    name = path.name
    parts = path.parts
    if name == DB_NAME:
        return FileKind("sqlite", _agent(parts, "agent"))
    if name in (DB_NAME + "-wal", DB_NAME + "-shm"):
        return FileKind("sqlite-side", _agent(parts, "agent"))
    if any(p in _SKIP_DIRS for p in parts):
        return FileKind("ignored")
    oc_agent = _agent(parts, "sessions")
    if name == "sessions.json":
        return FileKind("sessions-json", oc_agent) if oc_agent else FileKind("ignored")
    m = _ARCHIVE.match(name)
    if m:
        role: FileRole = "reset-archive" if m["kind"] == "reset" else "deleted-archive"
        return FileKind(role, oc_agent, reset_time(m["ts"]))
    if not name.endswith(".jsonl") or name.endswith(".trajectory.jsonl") or \
            ".checkpoint." in name:
        return FileKind("ignored")
    if oc_agent is not None:
        return FileKind("openclaw-jsonl", oc_agent)
    return _PI  # one for every Pi transcript tracked, not one each


def inside(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path`` (resolved) lies under one of the (resolved) roots."""
    # Compared by parts, as ``is_relative_to`` does at many times the cost (every changed
    # file is checked in every batch); a root without parts (".") holds relative paths only.
    parts = path.parts
    return any(parts[:len(r.parts)] == r.parts and bool(r.parts or not path.root)
               for r in roots)


def walk(roots: Sequence[Path], on_error: Callable[[str, str, str], None]
         ) -> Iterator[tuple[Path, FileKind]]:
    """Every interesting file under the roots, once each, never leaving them."""
    resolved = [r.resolve() for r in roots]
    seen: set[Path] = set()
    for root in roots:
        if not root.exists():
            continue
        if root.is_file():  # a single transcript or database named directly
            kind = classify(root)
            if kind.role != "ignored" and root not in seen:
                seen.add(root)
                yield root, kind
            continue

        def failed(exc: OSError) -> None:
            kind = "permission" if isinstance(exc, PermissionError) else "io"
            on_error(kind, str(exc.filename), str(exc.strerror or exc))

        for folder, entry in _files(root, failed):
            path = folder / entry.name
            kind = classify(path)
            if kind.role == "ignored":
                continue
            if _is_symlink(entry):
                target = path.resolve()
                if not inside(target, resolved):
                    on_error("outside_root", str(path),
                             "symlink leads outside the transcript roots; not followed")
                    continue
            if path in seen:
                continue
            seen.add(path)
            yield path, kind


def _is_symlink(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_symlink()
    except OSError:
        return False


def _files(top: Path, failed: Callable[[OSError], None]) -> Iterator[tuple[Path, os.DirEntry[str]]]:
    """The files under ``top`` (its folder, and each one's directory entry), in the order
    ``os.walk`` lists them: a folder's files, then each of its subfolders in turn; symlinked
    folders and the skipped ones are not entered. The entries tell a symlink without a
    ``stat`` of each file (a scan lists tens of thousands)."""
    try:
        listing = os.scandir(top)
    except OSError as exc:
        failed(exc)
        return
    files: list[os.DirEntry[str]] = []
    folders: list[os.DirEntry[str]] = []
    with listing:
        while True:
            try:
                entry = next(listing)
            except StopIteration:
                break
            except OSError as exc:
                failed(exc)
                return
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (folders if is_dir else files).append(entry)
    for entry in files:
        yield top, entry
    for entry in folders:
        if entry.name not in _SKIP_DIRS and not _is_symlink(entry):
            yield from _files(top / entry.name, failed)
