"""What tailfloor inserts into a Responses or Anthropic Messages request is Pi's own rendering
of its transcript in that dialect.

Recordings of the real Pi 0.73.1 and 1.6.0 with an ``openai-responses`` and an
``anthropic-messages`` provider (tests/fixtures/dialects, see its README). For every request
Pi sent (its summarizer calls aside), some prefix of its own transcript, through the context
view and the dialect's renderer, must give the very items Pi sent, system prompt aside. The
renderer leaves out on purpose, and the comparison ignores: reasoning items and thinking
blocks (their encrypted content and signatures belong to the answer they came with; an old
turn is valid without them, and Responses refuses a call's item id sent without its reasoning
item), item ids, ``status``/``phase``, ``annotations``, ``cache_control`` breakpoints (never
put on what tailfloor inserts, so the client's stay where they are) and ``is_error: false``
(the default).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.transcripts import loading, view
from proxy.transcripts.jsonl import JsonlTranscript
from proxy.transcripts.render import RenderOptions
from proxy.wire.anthropic import render_messages
from proxy.wire.responses import render_items

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
CASES = [(api, version) for api in ("openai-responses", "anthropic-messages")
         for version in ("0.73.1", "1.6.0")]
_DROPPED_KEYS = frozenset({"id", "status", "phase"})
_DROPPED_BLOCK_KEYS = frozenset({"cache_control", "annotations"})


def _fail(kind: str, where: str, detail: str) -> None:
    raise AssertionError(f"transcript error {kind} at {where}: {detail}")


def recorded(api: str, version: str) -> list[list[Any]]:
    """Each recorded request's items, its ``same_as_previous`` references resolved."""
    key = "input" if api == "openai-responses" else "messages"
    out: list[list[Any]] = []
    previous: list[Any] = []
    for request in json.loads((ROOT / api / version / "requests.json").read_text()):
        value = request["body"][key]
        items = (previous[:value["same_as_previous"]] + value["then"]
                 if isinstance(value, dict) else value)
        out.append(items)
        previous = items
    return out


def views(api: str, version: str) -> list[list[dict[str, Any]]]:
    """The context view after each entry of each of Pi's transcripts."""
    out = []
    for path in sorted((ROOT / api / version / "sessions").glob("*.jsonl")):
        transcript = JsonlTranscript.open(path, _fail)
        entries = list(transcript.read_window(None).entries)
        for end in range(1, len(entries) + 1):
            plan = view.context_plan(view.active_branch(entries[:end]).entries)
            out.append(loading.render_plan(transcript, plan, RenderOptions(flavor="pi")))
    return out


def comparable(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for sent in items:
        if sent.get("type") == "reasoning" or sent.get("role") in ("system", "developer"):
            continue
        item = {k: v for k, v in sent.items() if k not in _DROPPED_KEYS}
        content = item.get("content")
        if isinstance(content, list):
            item["content"] = [
                {k: v for k, v in block.items() if k not in _DROPPED_BLOCK_KEYS
                 and not (k == "is_error" and v is False)}
                for block in content if block.get("type") not in ("thinking", "redacted_thinking")]
            if item["role"] == "assistant" and not item["content"]:
                continue
        out.append(item)
    return out


def is_summarization(items: list[Any]) -> bool:
    return "<conversation>" in json.dumps(items[-1]) and len(comparable(items)) == 1


@pytest.mark.parametrize(("api", "version"), CASES)
def test_every_request_is_pi_rendering_of_its_transcript(api: str, version: str) -> None:
    render = render_items if api == "openai-responses" else render_messages
    rendered = [comparable(render([m for m in v if m.get("role") not in ("system", "developer")]))
                for v in views(api, version)]
    checked = 0
    for number, items in enumerate(recorded(api, version)):
        if is_summarization(items):
            continue
        assert comparable(items) in rendered, f"request {number} is no rendering of the view"
        checked += 1
    assert checked >= 10
