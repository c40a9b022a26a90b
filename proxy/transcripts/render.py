"""Transcript messages -> OpenAI chat messages, exactly as each agent renders them. Pure.

Pi (openai-completions provider): user content verbatim (a string stays a string, blocks
become ``text``/``image_url`` parts); assistant text blocks joined into one string, thinking
echoed in the field named by its signature, ``toolCall`` blocks -> ``tool_calls`` with
compact JSON arguments; ``toolResult`` -> ``role: tool`` with its text parts joined by
newlines. Replay transforms: failed (``error``/``aborted``) assistant turns are dropped and
a tool call left without a result gets ``No result provided``.

OpenClaw renders the same, plus: a ``[Day YYYY-MM-DD HH:MM TZ] `` prefix on user text (the
time of the user message, in the agent's timezone), tool-call ids with everything but
letters and digits removed (``call_ab12`` -> ``callab12``), and consecutive assistant
messages merged before failed turns are dropped (so a failed turn's placeholder text glues
onto the reply that follows it, as OpenClaw 2026.7 sends it).

Summaries are user messages with the wrappers of transcripts.md 1.3.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Any, Literal

from proxy.wire.openclaw import render_prefix
from proxy.wire.summary import BRANCH_PREFIX, BRANCH_SUFFIX, agent_summary
from proxy.wire.tool_ids import openclaw_form

__all__ = ["Flavor", "RenderOptions", "Source", "edited", "render"]

Flavor = Literal["pi", "openclaw"]
NO_RESULT = "No result provided"
# The APIs whose thinkingSignature is the name of the field the thinking came in.
_NAMED_THINKING = (None, "openai-completions")


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """How to render: which agent, and (OpenClaw) the timezone of its user-text prefix."""

    flavor: Flavor = "pi"
    tz: tzinfo = UTC


@dataclass(frozen=True, slots=True)
class Source:
    """One transcript item to render: its entry kind, raw JSON object and entry timestamp."""

    kind: str
    obj: Mapping[str, Any]
    timestamp: float | None = None


Message = dict[str, Any]


_EDITABLE = ("user", "assistant", "toolResult", "custom")


def edited(kind: str, obj: Mapping[str, Any], edit: Mapping[str, Any]) -> Mapping[str, Any]:
    """A transcript object with the content of a Pi context edit's replacement (the edit
    object itself). Pi keeps role and metadata; string content becomes one text block for the
    roles that need blocks."""
    replacement = edit.get("replacement")
    content = replacement.get("content") if isinstance(replacement, Mapping) else None
    if not isinstance(content, str | list):
        return obj
    if kind == "custom_message":
        return {**obj, "content": content}
    msg = obj.get("message")
    if kind != "message" or not isinstance(msg, Mapping):
        return obj
    role = msg.get("role")
    if not isinstance(role, str) or role not in _EDITABLE:
        return obj
    if isinstance(content, str) and role in ("assistant", "toolResult"):
        content = [{"type": "text", "text": content}]
    return {**obj, "message": {**msg, "content": content}}


def _bash_text(msg: Mapping[str, Any]) -> str:
    text = f"Ran `{msg.get('command', '')}`\n"
    output = msg.get("output")
    text += f"```\n{output}\n```" if output else "(no output)"
    code = msg.get("exitCode")
    if msg.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif isinstance(code, int) and code != 0:
        text += f"\n\nCommand exited with code {code}"
    if msg.get("truncated") and msg.get("fullOutputPath"):
        text += f"\n\n[Output truncated. Full output: {msg['fullOutputPath']}]"
    return text


def _as_blocks(content: object) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _agent_messages(items: Sequence[Source]) -> list[dict[str, Any]]:
    """Transcript items -> agent-level messages (Pi's convertToLlm)."""
    out: list[dict[str, Any]] = []
    for item in items:
        obj = item.obj
        if item.kind == "compaction":
            out.append({"role": "summary", "text": agent_summary(str(obj.get("summary", "")))})
        elif item.kind == "branch_summary":
            out.append({"role": "summary", "text": BRANCH_PREFIX + str(obj.get("summary", ""))
                        + BRANCH_SUFFIX})
        elif item.kind == "custom_message":
            out.append({"role": "custom", "content": _as_blocks(obj.get("content"))})
        elif item.kind == "message":
            msg = obj.get("message")
            if not isinstance(msg, Mapping):
                continue
            role = msg.get("role")
            if role == "bashExecution":
                if not msg.get("excludeFromContext"):
                    out.append({"role": "custom",
                                "content": [{"type": "text", "text": _bash_text(msg)}]})
            elif role in ("custom", "hookMessage"):
                out.append({"role": "custom", "content": _as_blocks(msg.get("content"))})
            elif role in ("user", "assistant", "toolResult"):
                ts = msg.get("timestamp")
                when = ts / 1000.0 if isinstance(ts, int | float) else item.timestamp
                out.append({**msg, "_when": when})
    return out


def _merge_assistants(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for msg in msgs:
        prev = merged[-1] if merged else None
        if prev is not None and prev.get("role") == "assistant" and msg.get("role") == "assistant":
            merged[-1] = {**msg, "content": _as_blocks(prev.get("content"))
                          + _as_blocks(msg.get("content"))}
        else:
            merged.append(msg)
    return merged


def _replay(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop failed assistant turns; give orphaned tool calls a synthetic result."""
    result: list[dict[str, Any]] = []
    pending: list[Mapping[str, Any]] = []
    answered: set[str] = set()

    def flush() -> None:
        for call in pending:
            if call.get("id") not in answered:
                result.append({"role": "toolResult", "toolCallId": call.get("id"),
                               "content": [{"type": "text", "text": NO_RESULT}], "isError": True})
        pending.clear()
        answered.clear()

    for msg in msgs:
        role = msg.get("role")
        if role == "assistant":
            flush()
            if msg.get("stopReason") in ("error", "aborted"):
                continue
            calls = [b for b in _as_blocks(msg.get("content"))
                     if isinstance(b, Mapping) and b.get("type") == "toolCall"]
            pending.extend(calls)
            result.append(msg)
        elif role == "toolResult":
            answered.add(str(msg.get("toolCallId")))
            result.append(msg)
        else:
            if role in ("user", "custom", "summary"):
                flush()
            result.append(msg)
    return result


def _user_parts(blocks: list[Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif block.get("type") == "image":
            url = f"data:{block.get('mimeType', '')};base64,{block.get('data', '')}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _render_user(msg: Mapping[str, Any], opts: RenderOptions) -> Message | None:
    content = msg.get("content")
    prefix = ""
    when = msg.get("_when")
    if opts.flavor == "openclaw" and msg.get("role") == "user" and isinstance(when, float):
        prefix = render_prefix(when, opts.tz)
    if isinstance(content, str):
        return {"role": "user", "content": prefix + content}
    parts = _user_parts(_as_blocks(content))
    if not parts:
        return None
    if prefix:
        for part in parts:
            if part["type"] == "text" and isinstance(part["text"], str):
                part["text"] = prefix + part["text"]
                break
    return {"role": "user", "content": parts}


def _tool_id(call_id: object, opts: RenderOptions) -> str:
    text = call_id if isinstance(call_id, str) else ""
    # A Responses call is stored as ``<call_id>|<item id>`` (OpenClaw runs Pi's transport);
    # OpenClaw sends the call id alone, so its form is taken of that part only.
    return openclaw_form(text.split("|", 1)[0]) if opts.flavor == "openclaw" else text


def _render_assistant(msg: Mapping[str, Any], opts: RenderOptions) -> Message | None:
    blocks = [b for b in _as_blocks(msg.get("content")) if isinstance(b, Mapping)]
    texts = [str(b.get("text", "")) for b in blocks
             if b.get("type") == "text" and str(b.get("text", "")).strip()]
    out: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
    thinking = [b for b in blocks
                if b.get("type") == "thinking" and str(b.get("thinking", "")).strip()]
    signature = thinking[0].get("thinkingSignature") if thinking else None
    # Only Pi's chat-completions thinking names the field it came in (reasoning_content...);
    # an Anthropic signature or a Responses reasoning item is no field name.
    if isinstance(signature, str) and signature and msg.get("api") in _NAMED_THINKING:
        out[signature] = "\n".join(str(b.get("thinking", "")) for b in thinking)
    calls = [{"id": _tool_id(b.get("id"), opts), "type": "function",
              "function": {"name": b.get("name", ""),
                           "arguments": json.dumps(b.get("arguments", {}), ensure_ascii=False,
                                                   separators=(",", ":"))}}
             for b in blocks if b.get("type") == "toolCall"]
    if calls:
        out["tool_calls"] = calls
    if out["content"] is None and not calls:
        return None
    return out


def _render_tool(msg: Mapping[str, Any], opts: RenderOptions) -> Message:
    blocks = [b for b in _as_blocks(msg.get("content")) if isinstance(b, Mapping)]
    text = "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    if not text and any(b.get("type") == "image" for b in blocks):
        text = "(see attached image)"
    return {"role": "tool", "content": text, "tool_call_id": _tool_id(msg.get("toolCallId"), opts)}


def render(items: Sequence[Source], opts: RenderOptions | None = None, *,
           replay: bool = True) -> list[Message]:
    """Render transcript items as the agent sends them.

    ``replay=False`` renders each item on its own (no merging, no dropping, no synthetic
    results): used for tails, where each record maps to its own messages.
    """
    opts = opts or RenderOptions()
    msgs = _agent_messages(items)
    if replay:
        if opts.flavor == "openclaw":
            msgs = _merge_assistants(msgs)
        msgs = _replay(msgs)
    out: list[Message] = []
    for msg in msgs:
        role = msg.get("role")
        rendered: Message | None
        if role == "summary":
            rendered = {"role": "user", "content": [{"type": "text", "text": msg["text"]}]}
        elif role in ("user", "custom"):
            rendered = _render_user(msg, opts)
        elif role == "assistant":
            rendered = _render_assistant(msg, opts)
        else:
            rendered = _render_tool(msg, opts)
        if rendered is not None:
            out.append(rendered)
    return out
