"""The fake upstream's Anthropic Messages answers (see ``fake_dialects``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

try:
    from tests.fake_dialects import MESSAGES, _pieces, _tool_id, error_body, usage
except ModuleNotFoundError:  # run as a script: python tests/fake_upstream.py
    from fake_dialects import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        MESSAGES,
        _pieces,
        _tool_id,
        error_body,
        usage,
    )

if TYPE_CHECKING:
    from tests.fake_upstream import Reply


def _anthropic_blocks(reply: Reply, ident: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": reply.reasoning,
                       "signature": f"sig_{ident}_opaque"})
    if reply.text or not reply.tool_call:
        blocks.append({"type": "text", "text": reply.text})
    if reply.tool_call:
        blocks.append({"type": "tool_use", "id": _tool_id(MESSAGES, reply.tool_call["id"]),
                       "name": reply.tool_call["name"],
                       "input": orjson.loads(reply.tool_call["arguments"] or "{}")})
    return blocks


def _stop_reason(reply: Reply) -> str:
    if reply.finish == "length":
        return "max_tokens"
    return "tool_use" if reply.tool_call else "end_turn"


def message_body(payload: dict[str, Any], reply: Reply, ident: str) -> dict[str, Any]:
    return {"id": f"msg_{ident}", "type": "message", "role": "assistant",
            "model": payload.get("model", "fake-model"),
            "content": _anthropic_blocks(reply, ident), "stop_reason": _stop_reason(reply),
            "stop_sequence": None, "usage": usage(MESSAGES, reply.usage)}


def messages_events(payload: dict[str, Any], reply: Reply, ident: str) -> list[bytes]:
    events: list[dict[str, Any]] = []
    full = usage(MESSAGES, reply.usage)

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, **fields})

    start = {**message_body(payload, reply, ident), "content": [], "stop_reason": None,
             "usage": {**full, "output_tokens": 1}}
    emit("message_start", message=start)
    for index, block in enumerate(_anthropic_blocks(reply, ident)):
        if block["type"] == "thinking":
            emit("content_block_start", index=index,
                 content_block={"type": "thinking", "thinking": "", "signature": ""})
            deltas = [{"type": "thinking_delta", "thinking": p}
                      for p in _pieces(block["thinking"], reply.pieces)]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif block["type"] == "text":
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            deltas = [{"type": "text_delta", "text": p}
                      for p in _pieces(block["text"], reply.pieces)]
        else:
            emit("content_block_start", index=index,
                 content_block={**block, "input": {}})
            deltas = [{"type": "input_json_delta", "partial_json": p}
                      for p in _pieces(orjson.dumps(block["input"]).decode(), 2)]
        if index == 0:
            emit("ping")
        for delta in deltas:
            emit("content_block_delta", index=index, delta=delta)
        if reply.stream_error is not None and block["type"] == "text":
            break
        emit("content_block_stop", index=index)
    if reply.stream_error is not None:
        emit("error", error=error_body(MESSAGES, reply.stream_error, 500)["error"])
    else:
        emit("message_delta", delta={"stop_reason": _stop_reason(reply), "stop_sequence": None},
             usage={"output_tokens": full.get("output_tokens", 0)})
        emit("message_stop")
    return [b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
            for e in events]
