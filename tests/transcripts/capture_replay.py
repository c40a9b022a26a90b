"""Shared helpers: replay recorded agent requests against the transcripts as they stood."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.transcripts import loading, view
from proxy.transcripts.entries import Entry
from proxy.transcripts.jsonl import JsonlTranscript
from proxy.transcripts.records import TranscriptStore
from proxy.transcripts.render import RenderOptions
from proxy.transcripts.sqlite import AgentDatabase, SqliteTranscript

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts" / "captures"
RUNS = sorted(p.name for p in CAPTURES.iterdir() if (p / "requests.json").exists())
_PREFIX = re.compile(r"^\[[A-Z][a-z]{2} \d{4}-\d{2}-\d{2} \d{2}:\d{2} [^\]]+\] ")
INTERNAL = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
CONTINUE = "Continue the current task from the existing transcript"


@dataclass
class Loaded:
    store: TranscriptStore
    entries: list[Entry]
    flavor: str


def _errors() -> Callable[[str, str, str], None]:
    def sink(kind: str, where: str, detail: str) -> None:
        raise AssertionError(f"unexpected transcript error {kind} at {where}: {detail}")
    return sink


def load_run(run: str) -> list[Loaded]:
    """Every transcript a run left, read whole."""
    if run.startswith("oc96"):
        db = AgentDatabase(CAPTURES / "oc96-state/agents/main/agent/openclaw-agent.sqlite",
                           _errors())
        out = []
        for row in db.sessions():
            store = SqliteTranscript(db, row.session_id, _errors())
            out.append(Loaded(store, list(store.read_window(None).entries), "openclaw"))
        return out
    root = CAPTURES / run
    out = []
    for path in sorted(root.rglob("*.jsonl*")):
        t = JsonlTranscript.open(path, _errors())
        out.append(Loaded(t, list(t.read_window(None).entries),
                          "pi" if run.startswith("pi") else "openclaw"))
    return out


def requests(run: str) -> list[dict[str, Any]]:
    data = json.loads((CAPTURES / run / "requests.json").read_text())
    table = data["messages"]
    return [{**r, "messages": [table[k] for k in r["messages"]]} for r in data["requests"]]


def is_summarization(req: dict[str, Any]) -> bool:
    first = req["messages"][0] if req["messages"] else {}
    content = first.get("content")
    text = content if isinstance(content, str) else (
        content[0].get("text", "") if content else "")
    return (req["system_head"].startswith("You are a context summarization assistant")
            or (req["tools"] == 0 and len(req["messages"]) == 1
                and str(text).startswith("<conversation>")))


def _text(msg: dict[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def stored_part(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's messages minus what the captures README lists as never stored."""
    out = [json.loads(json.dumps(m)) for m in messages]
    if out and out[-1]["role"] == "user" and _text(out[-1]).startswith(INTERNAL):
        out.pop()
    out = [m for m in out if not (m["role"] == "user"
                                  and _PREFIX.sub("", _text(m)).startswith(CONTINUE))]
    if out and out[0]["role"] == "user":
        first = out[0]
        if isinstance(first["content"], str):
            first["content"] = re.sub(r"\n\nRuntime: agent=[^\n]*$", "", first["content"])
        else:
            first["content"] = [p for p in first["content"]
                                if not str(p.get("text", "")).startswith("Runtime: agent=")]
    return out


def context_at(loaded: Sequence[Loaded], ts: float) -> list[dict[str, Any]] | None:
    """The context view of the session active at ``ts`` (entries written before ``ts``)."""
    best: tuple[float, Loaded, list[Entry]] | None = None
    for item in loaded:
        before = [e for e in item.entries if e.timestamp is not None and e.timestamp < ts]
        if before and (best is None or before[-1].timestamp > best[0]):  # type: ignore[operator]
            best = (before[-1].timestamp or 0.0, item, before)
    if best is None:
        return None
    _ts, item, before = best
    plan = view.context_plan(view.active_branch(before).entries)
    flavor = "pi" if item.flavor == "pi" else "openclaw"
    return loading.render_plan(item.store, plan, RenderOptions(flavor=flavor))
