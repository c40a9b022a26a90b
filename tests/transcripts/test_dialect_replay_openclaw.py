"""What tailfloor inserts into a Responses or Anthropic Messages request is OpenClaw's own
rendering of its transcript in that dialect, as far as one renderer can serve Pi and OpenClaw.

Recordings of the real OpenClaw 2026.9.6 gateway with an ``openai-responses`` and an
``anthropic-messages`` provider (tests/fixtures/dialects/openclaw, see the README one level
up). For every request OpenClaw sent (its summarizer calls aside), the context view of its
SQLite transcript after some entry, rendered with flavor ``openclaw`` and the dialect's
renderer, must give the very items OpenClaw sent, system prompt aside, with the normalisation
of the Pi replay (``test_dialect_replay.comparable``) plus:

- the parts OpenClaw never stores (``capture_replay.stored_part``): its trailing
  internal-context user message, the overflow retry's "Continue ..." message and a Runtime
  line in the first user message (2026.9.6 puts it at the end of the system prompt in both
  dialects, so there is none to take off here);
- Anthropic: OpenClaw sends a user text it stores as a string as a string, except the
  current turn's prompt and the newest user message, which become one text block carrying a
  ``cache_control`` breakpoint; Pi stores and sends blocks. ``render_messages`` renders
  blocks (one renderer: the chat view of a request does not keep whether the client sent a
  string or blocks), so a string is compared as its one text block. The API reads both the
  same; the bytes tailfloor inserts are the same on every request either way;
- tool-call ids are compared by the key every wire form shares (``call_id_key``): OpenClaw
  sends the model's call id verbatim in both dialects (``call_fake_1_...``,
  ``toolu_fake_1_...``) while the ``openclaw`` flavor renders its chat-completions form,
  letters and digits only. That difference is asserted as it is, not hidden.

The Responses renderer writes user items with ``"type": "message"`` when the request's own
user items do (OpenClaw); Pi's have none (``test_dialect_replay``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.transcripts import loading, view
from proxy.transcripts.render import RenderOptions
from proxy.transcripts.sqlite import AgentDatabase, SqliteTranscript
from proxy.wire.anthropic import render_messages
from proxy.wire.responses import render_items
from proxy.wire.tool_ids import call_id_key
from tests.transcripts.capture_replay import _PREFIX, CONTINUE, INTERNAL, stored_part
from tests.transcripts.test_dialect_replay import comparable

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "dialects" / "openclaw"
APIS = ("openai-responses", "anthropic-messages")
DB = Path("state/agents/main/agent/openclaw-agent.sqlite")
RUNTIME = "Runtime: agent="


def _fail(kind: str, where: str, detail: str) -> None:
    raise AssertionError(f"transcript error {kind} at {where}: {detail}")


def _key(api: str) -> str:
    return "input" if api == "openai-responses" else "messages"


def recorded(api: str) -> list[tuple[dict[str, Any], list[Any]]]:
    """Each recorded request with its items, ``same_as_previous`` resolved."""
    out = []
    previous: list[Any] = []
    for request in json.loads((ROOT / api / "requests.json").read_text()):
        value = request["body"][_key(api)]
        items = previous[:value["same_as_previous"]] + value["then"]
        out.append((request, items))
        previous = items
    return out


def views(api: str) -> list[list[dict[str, Any]]]:
    """The context view after each entry of each OpenClaw session in the database."""
    db = AgentDatabase(ROOT / api / DB, _fail)
    out = []
    for row in db.sessions():
        store = SqliteTranscript(db, row.session_id, _fail)
        entries = list(store.read_window(None).entries)
        for end in range(1, len(entries) + 1):
            plan = view.context_plan(view.active_branch(entries[:end]).entries)
            out.append(loading.render_plan(store, plan, RenderOptions(flavor="openclaw")))
    return out


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    return content if isinstance(content, str) else "".join(
        b.get("text", "") for b in content or [] if isinstance(b, dict))


def never_stored_dropped(items: list[Any]) -> list[Any]:
    """The request's items without what OpenClaw never stores (``stored_part``): its
    internal-context user message (the last item of a turn's first request, then kept in
    place, after the prompt, for the rest of a tool loop), the "Continue ..." message and a
    Runtime line ending the first user message."""
    assert stored_part([]) == []  # the same rules, applied to dialect items below
    out = []
    for item in items:
        text = _PREFIX.sub("", _text(item)) if item.get("role") == "user" else ""
        if text.startswith(INTERNAL) or text.startswith(CONTINUE):
            continue
        out.append(item)
    assert not any(RUNTIME in _text(i) for i in out), "a Runtime line in the conversation"
    return out


def _as_block(item: Any) -> Any:
    """OpenClaw's Anthropic user text sent as a plain string, as one text block (the form
    tailfloor renders, Pi's)."""
    if item.get("role") == "user" and isinstance(item.get("content"), str):
        return {**item, "content": [{"type": "text", "text": item["content"]}]}
    return item


def normalised(api: str, items: list[Any], sent: bool = False) -> list[Any]:
    if sent and api == "anthropic-messages":
        items = [_as_block(i) for i in items]
    out = comparable(items)
    for item in out:
        if "call_id" in item:
            item["call_id"] = call_id_key(item["call_id"])
        content = item.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            for field in ("id", "tool_use_id"):
                if field in block:
                    block[field] = call_id_key(block[field])
    return out


def is_summarization(request: dict[str, Any], items: list[Any]) -> bool:
    return not request["body"].get("tools") and "<conversation>" in json.dumps(items[-1:])


@pytest.mark.parametrize("api", APIS)
def test_every_request_is_openclaw_rendering_of_its_transcript(api: str) -> None:
    if api == "openai-responses":
        def render(messages: list[dict[str, Any]]) -> list[Any]:
            return render_items(messages, typed_user=True)
    else:
        render = render_messages
    rendered = [normalised(api, render([m for m in v if m.get("role") != "system"]))
                for v in views(api)]
    checked = summaries = 0
    for request, items in recorded(api):
        if is_summarization(request, items):
            summaries += 1
            continue
        sent = normalised(api, never_stored_dropped(
            [i for i in items if i.get("role") not in ("system", "developer")]), sent=True)
        assert sent in rendered, f"request {request['n']} is no rendering of the view"
        checked += 1
    assert checked >= 14 and summaries >= 1


@pytest.mark.parametrize("api", APIS)
def test_openclaw_sends_verbatim_call_ids(api: str) -> None:
    """The one difference kept: OpenClaw's dialect ids keep their ``_``; the openclaw
    flavor's rendering (its chat-completions form) does not."""
    sent = {i.get("call_id") for _r, items in recorded(api) for i in items if "call_id" in i} | {
        b.get("id") for _r, items in recorded(api) for i in items
        if isinstance(i.get("content"), list) for b in i["content"] if b.get("type") == "tool_use"}
    sent.discard(None)
    assert sent and all("_" in i for i in sent), sent
    ours = {c["id"] for v in views(api) for m in v for c in m.get("tool_calls") or []}
    assert ours and all("_" not in i and "|" not in i for i in ours), ours
    assert {call_id_key(i) for i in sent} == {call_id_key(i) for i in ours}
