"""Synthetic transcripts in an in-memory catalog (or as Pi session files), and the requests an
agent would send."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from proxy.chat import ChatRequest
from proxy.policy.records import Mode, ModelSpec, Policy, RuleSet
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.entries import Entry, parse_entry
from proxy.transcripts.records import SessionInfo, SourceKind, Window

BASE_TS = 1_796_000_000.0
PI_TOOLS = [{"type": "function", "function": {"name": n, "description": n,
                                              "parameters": {"type": "object"}}}
            for n in ("read", "bash", "edit", "write")]


class MemoryStore:
    """A ``TranscriptStore`` over objects in memory (``pos`` is the list index)."""

    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.objs = objs

    def entries(self) -> list[Entry]:
        return [parse_entry(o, i) for i, o in enumerate(self.objs)]

    def load(self, entries: Sequence[Entry]) -> list[Mapping[str, Any] | None]:
        return [self.objs[e.pos] if e.pos < len(self.objs) else None for e in entries]

    def read_window(self, min_messages: int | None) -> Window:
        return Window(self.entries(), complete=True)


@dataclass
class Transcript:
    """A Pi/OpenClaw-style transcript being written."""

    session_id: str
    objs: list[dict[str, Any]] = field(default_factory=list)
    clock: float = BASE_TS
    calls: int = 0

    def _add(self, kind: str, **fields: Any) -> str:
        entry_id = f"{self.session_id[:6]}{len(self.objs):05d}"
        parent = self.objs[-1]["id"] if self.objs else None
        self.clock += 1.0
        self.objs.append({"type": kind, "id": entry_id, "parentId": parent,
                          "timestamp": self.clock * 1000, **fields})
        return entry_id

    def user(self, text: str) -> str:
        return self._add("message", message={"role": "user", "content": [
            {"type": "text", "text": text}], "timestamp": int(self.clock * 1000)})

    def assistant(self, text: str) -> str:
        return self._add("message", message={"role": "assistant", "content": [
            {"type": "text", "text": text}], "stopReason": "stop"})

    def tool_calls(self, names: Sequence[str]) -> tuple[str, list[str]]:
        ids = []
        blocks = []
        for name in names:
            self.calls += 1
            call_id = f"call_{self.session_id[:4]}{self.calls:08x}"
            ids.append(call_id)
            blocks.append({"type": "toolCall", "id": call_id, "name": name,
                           "arguments": {"command": f"echo {self.calls}"}})
        entry = self._add("message", message={"role": "assistant", "content": blocks,
                                              "stopReason": "toolUse"})
        return entry, ids

    def tool_result(self, call_id: str, text: str) -> str:
        return self._add("message", message={"role": "toolResult", "toolCallId": call_id,
                                             "toolName": "bash", "isError": False,
                                             "content": [{"type": "text", "text": text}]})

    def compaction(self, summary: str, first_kept_id: str) -> str:
        return self._add("compaction", summary=summary, firstKeptEntryId=first_kept_id,
                         tokensBefore=1000)

    def reset(self, reason: str = "reset") -> str:
        return self._add("reset", reason=reason)

    def message_ids(self) -> list[str]:
        return [o["id"] for o in self.objs if o["type"] == "message"]


def write_jsonl(root: Path, t: Transcript) -> Path:
    """``t`` as Pi's session file under ``root`` (a Pi sessions directory, cwd /work)."""
    sessions = root / "--work--"
    sessions.mkdir(parents=True, exist_ok=True)
    header = {"type": "session", "version": 3, "id": t.session_id,
              "timestamp": "2026-11-30T02:00:00.000Z", "cwd": "/work"}
    lines = [orjson.dumps(o) for o in [header, *t.objs]]
    path = sessions / f"2026-11-30T02-00-00-000Z_{t.session_id}.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def put(catalog: Catalog, t: Transcript, *, source: SourceKind = "pi",
        agent_id: str | None = None, group: str | None = "dir-a",
        predecessor: str | None = None, link: Any = None, session_key: str | None = None,
        created: float | None = None, relink: bool = True) -> MemoryStore:
    store = MemoryStore(t.objs)
    info = SessionInfo(
        session_id=t.session_id, source=source,
        era="pi" if source == "pi" else "openclaw-2026.9", location=f"mem:{t.session_id}",
        agent_id=agent_id or ("pi" if source == "pi" else "main"), session_key=session_key,
        created=created if created is not None else (t.objs[0]["timestamp"] / 1000
                                                     if t.objs else BASE_TS),
        group=group if source == "pi" else None, predecessor=predecessor, link=link,
        scope=None if source == "pi" else "scope")
    catalog.put(info, store, store.read_window(None))
    if relink:
        catalog.relink()
    return store


def system(cwd: str = "/home/a/project", date: str = "2026-11-30") -> dict[str, Any]:
    return {"role": "system", "content": "You are an expert coding assistant operating inside "
            f"pi.\nCurrent date: {date}\nCurrent working directory: {cwd}"}


def request_for(catalog: Catalog, session_id: str, *, sys: dict[str, Any] | None = None,
                extra: Sequence[dict[str, Any]] = (), max_tokens: int = 1024,
                ) -> dict[str, Any]:
    """What the agent itself sends now: its system prompt plus the transcript's context."""
    context = catalog.context(session_id) or []
    return {"model": "fake-model", "messages": [sys or system(), *context, *extra],
            "stream": True, "stream_options": {"include_usage": True}, "store": False,
            "max_completion_tokens": max_tokens, "tools": PI_TOOLS}


def chat(body: dict[str, Any], agent: str | None = None) -> ChatRequest:
    raw = orjson.dumps(body)
    return ChatRequest.parse(raw, orjson.loads(raw), agent)


def rules(n: int = 30, window: int = 1_000_000, *, reserve: int = 0, mode: Mode = "enforce",
          encoding: str = "estimate", **policy: Any) -> RuleSet:
    defaults = replace(Policy(), min_tail_messages=n, reserve_tokens=reserve, mode=mode,
                       **policy)
    return RuleSet(defaults=defaults, models=(ModelSpec("fake*", window, encoding, 0.0),))


@dataclass
class Holder:
    rules: RuleSet


def conversation(t: Transcript, turns: int, *, tools_every: int = 3, parallel: int = 1,
                 text: str = "message") -> None:
    """``turns`` user turns, every ``tools_every``-th with a tool exchange."""
    for i in range(turns):
        t.user(f"{text} {t.session_id[:4]} turn {i}")
        if tools_every and i % tools_every == 0:
            _entry, ids = t.tool_calls(["bash"] * parallel)
            for call_id in ids:
                t.tool_result(call_id, f"output of {call_id}")
        t.assistant(f"reply {t.session_id[:4]} turn {i}")
