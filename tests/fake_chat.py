"""The fake upstream's chat-completions answers: a whole completion, or its SSE chunks."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from tests.fake_upstream import Reply


def _completion(model: str, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    finish = "stop"
    if reply.tool_call:
        message["tool_calls"] = [{"id": reply.tool_call["id"], "type": "function", "function": {
            "name": reply.tool_call["name"], "arguments": reply.tool_call["arguments"]}}]
        finish = "tool_calls"
    finish = reply.finish or finish
    body: dict[str, Any] = {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
        "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    if reply.usage is not None:
        body["usage"] = reply.usage
    return body


def _sse_chunks(model: str, reply: Reply, include_usage: bool) -> list[bytes]:
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
            "model": model}
    null_usage = {"usage": None} if include_usage and reply.usage_in_every_chunk_null else {}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if reply.tool_call:
        deltas.append({"tool_calls": [{"index": 0, "id": reply.tool_call["id"],
                                       "type": "function", "function": {
                                           "name": reply.tool_call["name"], "arguments": ""}}]})
        deltas.append({"tool_calls": [{"index": 0, "function": {
            "arguments": reply.tool_call["arguments"]}}]})
    text = reply.text
    step = max(1, len(text) // max(reply.pieces, 1))
    deltas.extend({"content": text[i:i + step]} for i in range(0, len(text), step))
    finish = reply.finish or ("tool_calls" if reply.tool_call else "stop")
    events = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}],
               **null_usage} for d in deltas]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                   **null_usage})
    if include_usage and reply.usage is not None:
        events.append({**base, "choices": [], "usage": reply.usage})
    out = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]
    out.append(b"data: [DONE]\n\n")
    return out
