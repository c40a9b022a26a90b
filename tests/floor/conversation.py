"""Deterministic synthetic conversations for tests and benchmarks of the floor parts."""

from __future__ import annotations

import random
from typing import Any

_TEXT = (
    "the model reads files and runs commands then reports what it found in the repository "
    "config value error path test build deploy cluster session summary token window agent "
    "compaction request response stream proxy upstream header tool result message user"
)
_WORDS = tuple(_TEXT.split(" "))


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def conversation(n_messages: int = 500, words_per_message: int = 150,
                 seed: int = 7) -> list[dict[str, Any]]:
    """System prompt plus ``n_messages`` user/assistant/tool messages (~1.3 tokens a word)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful agent.\n" + text(rng, 300)}]
    call = 0
    while len(messages) < n_messages + 1:
        messages.append({"role": "user", "content": [
            {"type": "text", "text": text(rng, words_per_message)}]})
        if rng.random() < 0.4:
            call += 1
            call_id = f"call_{call:016x}"
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "bash", "arguments": '{"command":"ls -la"}'}}]})
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": text(rng, words_per_message)})
        messages.append({"role": "assistant", "content": text(rng, words_per_message)})
    return messages[: n_messages + 1]


def openclaw_request(n_messages: int = 500, words_per_message: int = 150,
                     seed: int = 7) -> dict[str, Any]:
    """An OpenClaw 2026.9-shaped request body: 40 KB system prompt, summary with the Runtime
    part, timestamp-prefixed user turns, ids without '_', trailing internal context."""
    rng = random.Random(seed)
    runtime = ("Runtime: agent=main | session=agent:main:main | "
               "sessionId=dc99badc-cc56-4bbc-911e-08925dee1509 | host=vm | model=m")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "<!-- openclaw:attempt:STABLE -->\n" + text(rng, 6000)},
        {"role": "user", "content": [
            {"type": "text", "text": "The conversation history before this point was compacted "
                                     "into the following summary:\n\n<summary>\n## Goal\n"
                                     + text(rng, 300) + "\n</summary>"},
            {"type": "text", "text": runtime}]}]
    for original in conversation(n_messages - 1, words_per_message, seed)[1:]:
        message = original
        if message["role"] == "user":
            body = message["content"][0]["text"]
            message = {"role": "user", "content": "[Mon 2026-11-30 02:27 UTC] " + body}
        elif message.get("tool_calls"):
            call_id = message["tool_calls"][0]["id"].replace("_", "")
            message = {**message, "tool_calls": [{**message["tool_calls"][0], "id": call_id}]}
        elif message["role"] == "tool":
            message = {**message, "tool_call_id": message["tool_call_id"].replace("_", "")}
        messages.append(message)
    messages.append({"role": "user", "content": [
        {"type": "text", "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nnone\n"
                                 "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}]})
    return {"model": "fake-model", "messages": messages, "stream": True, "tools": []}
