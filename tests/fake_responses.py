"""The fake upstream's OpenAI Responses answers (see ``fake_dialects``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

try:
    from tests.fake_dialects import RESPONSES, _pieces, _tool_id, error_body, usage
except ModuleNotFoundError:  # run as a script: python tests/fake_upstream.py
    from fake_dialects import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        RESPONSES,
        _pieces,
        _tool_id,
        error_body,
        usage,
    )

if TYPE_CHECKING:
    from tests.fake_upstream import Reply


def _responses_items(reply: Reply, ident: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        items.append({"type": "reasoning", "id": f"rs_{ident}",
                      "summary": [{"type": "summary_text", "text": reply.reasoning}],
                      "encrypted_content": f"enc_{ident}_opaque"})
    if reply.text or not reply.tool_call:
        items.append({"type": "message", "id": f"msg_{ident}", "status": "completed",
                      "role": "assistant", "content": [{"type": "output_text", "text": reply.text,
                                                        "annotations": [], "logprobs": []}]})
    if reply.tool_call:
        items.append({"type": "function_call", "id": f"fc_{ident}",
                      "call_id": _tool_id(RESPONSES, reply.tool_call["id"]),
                      "name": reply.tool_call["name"],
                      "arguments": reply.tool_call["arguments"], "status": "completed"})
    return items


def response_body(payload: dict[str, Any], reply: Reply, ident: str,
                  status: str | None = None) -> dict[str, Any]:
    incomplete = reply.finish == "length"
    final = status or ("incomplete" if incomplete else "completed")
    done = status is None
    return {
        "id": f"resp_{ident}", "object": "response", "created_at": int(time.time()),
        "status": final, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete and done else None,
        "instructions": payload.get("instructions"),
        "max_output_tokens": payload.get("max_output_tokens"),
        "model": payload.get("model", "fake-model"),
        "output": _responses_items(reply, ident) if done else [],
        "parallel_tool_calls": True, "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": payload.get("store", False),
        "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
        "tools": payload.get("tools") or [], "top_p": 1.0, "truncation": "disabled",
        "usage": usage(RESPONSES, reply.usage) if done and reply.usage is not None else None,
        "user": None, "metadata": {}}


def responses_events(payload: dict[str, Any], reply: Reply, ident: str) -> list[bytes]:
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    emit("response.created", response=response_body(payload, reply, ident, "in_progress"))
    emit("response.in_progress", response=response_body(payload, reply, ident, "in_progress"))
    for index, item in enumerate(_responses_items(reply, ident)):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            text = item["summary"][0]["text"]
            emit("response.output_item.added", output_index=index,
                 item={**item, "summary": [], "encrypted_content": None})
            part = {"type": "summary_text", "text": text}
            emit("response.reasoning_summary_part.added", **at, summary_index=0,
                 part={**part, "text": ""})
            for piece in _pieces(text, reply.pieces):
                emit("response.reasoning_summary_text.delta", **at, summary_index=0, delta=piece)
            emit("response.reasoning_summary_text.done", **at, summary_index=0, text=text)
            emit("response.reasoning_summary_part.done", **at, summary_index=0, part=part)
        elif item["type"] == "message":
            part = item["content"][0]
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "content": []})
            emit("response.content_part.added", **at, content_index=0,
                 part={**part, "text": ""})
            for piece in _pieces(part["text"], reply.pieces):
                emit("response.output_text.delta", **at, content_index=0, delta=piece,
                     logprobs=[])
            if reply.stream_error is not None:
                break
            emit("response.output_text.done", **at, content_index=0, text=part["text"],
                 logprobs=[])
            emit("response.content_part.done", **at, content_index=0, part=part)
        else:
            emit("response.output_item.added", output_index=index,
                 item={**item, "arguments": "", "status": "in_progress"})
            for piece in _pieces(item["arguments"], 2):
                emit("response.function_call_arguments.delta", **at, delta=piece)
            emit("response.function_call_arguments.done", **at, name=item["name"],
                 arguments=item["arguments"])
        emit("response.output_item.done", output_index=index, item=item)
    if reply.stream_error is not None:
        error = error_body(RESPONSES, reply.stream_error, 500)["error"]
        if reply.stream_error_event == "error":
            emit("error", code=error["code"], message=error["message"], param=error["param"])
        else:
            failed = response_body(payload, reply, ident, "failed")
            failed["error"] = {"code": error["code"] or "server_error",
                               "message": error["message"]}
            emit("response.failed", response=failed)
    else:
        final = response_body(payload, reply, ident)
        emit("response.incomplete" if final["status"] == "incomplete" else "response.completed",
             response=final)
    return [b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
            for e in events]
