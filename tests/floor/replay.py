"""Replaying recorded agent requests through the floor against the transcripts as they stood.

The recordings (tests/fixtures/transcripts/captures) hold each request's time, the start of
its system prompt, its tool count and its messages. The transcripts are read once, whole; for
each request a catalog is built from the entries written before it, with the session links
the tracker finds in the final state (reset archives, session windows, Pi directories).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from proxy.chat import ChatRequest
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.entries import Entry
from proxy.transcripts.records import SessionInfo, TranscriptStore, Window
from proxy.transcripts.tracker import Tracker
from tests.transcripts.capture_replay import CAPTURES, requests


def run_root(run: str) -> Path:
    if run.startswith("oc96"):
        return CAPTURES / "oc96-state"
    if run.startswith("oc735"):
        return CAPTURES / run / "state"
    return CAPTURES / run / "sessions"


@dataclass
class Session:
    info: SessionInfo
    store: TranscriptStore
    entries: list[Entry]
    created: float


def _fail(kind: str, where: str, detail: str) -> None:
    raise AssertionError(f"transcript error {kind} at {where}: {detail}")


def sessions(run: str) -> list[Session]:
    """Every session of a run, whole, with the links of the final state."""
    catalog = Catalog()
    tracker = Tracker([run_root(run)], catalog, _fail, full=True)
    tracker.scan()
    stores: dict[str, tuple[TranscriptStore, float | None]] = {}
    for t, _kind in tracker.files.values():
        stores[t.header.session_id] = (t, t.header.timestamp)
    for db in tracker.dbs.values():
        for sid, st in db.sessions.items():
            stores[sid] = (st, st.header.timestamp)
    out = []
    for record in catalog.sessions():
        store, created = stores[record.session_id]
        info = replace(record.info, predecessor=record.predecessor, link=record.link)
        out.append(Session(info, store, list(store.read_window(None).entries),
                           created or 0.0))
    return out


def catalog_at(all_sessions: list[Session], ts: float) -> Catalog:
    """The catalog as it stood at ``ts``: sessions created before it, entries written before."""
    catalog = Catalog()
    for s in all_sessions:
        if s.created >= ts:
            continue
        before = [e for e in s.entries if e.timestamp is not None and e.timestamp < ts]
        catalog.put(s.info, s.store, Window(before, complete=True))
    catalog.relink()
    return catalog


def bodies(run: str) -> Iterator[tuple[int, float, dict[str, Any]]]:
    """Each recorded request as a chat body (system prompt cut to its recorded start)."""
    for req in requests(run):
        messages = list(req["messages"])
        if req["system_head"]:
            messages.insert(0, {"role": "system", "content": req["system_head"]})
        tools = [{"type": "function", "function": {"name": f"tool{i}"}}
                 for i in range(req["tools"])]
        body: dict[str, Any] = {"model": "fake-model", "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True},
                                "max_completion_tokens": req.get("max_tokens") or 1024}
        if tools:
            body["tools"] = tools
        yield req["n"], req["ts"], body


def chat(body: dict[str, Any]) -> ChatRequest:
    raw = orjson.dumps(body)
    return ChatRequest.parse(raw, orjson.loads(raw), None)


def recorded(run: str, number: int, **changes: Any) -> dict[str, Any]:
    body = next(b for n, _ts, b in bodies(run) if n == number)
    return {**body, **changes}


def recorded_at(run: str, number: int) -> float:
    return next(ts for n, ts, _b in bodies(run) if n == number)


def keep_before(path: Path, ts: float) -> None:
    """Cut a transcript copy back to what was written before ``ts``: the floor only restores
    into a request that is current for its session, as the recorded one was then."""
    kept = []
    for line in path.read_bytes().splitlines(keepends=True):
        entry = json.loads(line)
        stamp = entry.get("timestamp")
        if entry.get("type") == "session" or (
                isinstance(stamp, str) and datetime.fromisoformat(stamp).timestamp() < ts):
            kept.append(line)
    path.write_bytes(b"".join(kept))
