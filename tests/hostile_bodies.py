"""Hostile request bodies for the three chat routes, seeded: small valid bodies with random
parts replaced by random JSON (some cut short, some gzip), and huge ones near the body limit
built to cost the most for their size (one long text, many messages or content blocks, many
tiny JSON values, text that Python holds at four bytes a character, a system prompt of
megabytes), sent with a length, chunked or compressed. The e2e fuzz and
``tests/bench/hostile_load.py`` share them."""

from __future__ import annotations

import gzip
import random
from typing import Any

import orjson

__all__ = ["HUGE_KINDS", "ROUTES", "fuzzed", "huge", "messages_of"]

# The route's path on the proxy port (an /agents/<id> prefix may go before it).
ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses",
          "messages": "/v1/messages"}
HUGE_KINDS = ("long_text", "long_text_chunked", "long_text_gzip", "many_messages",
              "many_blocks", "many_values", "many_lists", "wide_text", "long_system")
# Kinds parsed by a proxy that parses bodies up to 8 MiB: built just under it.
_PARSED_SIZE = 8 * 1024 * 1024 - 64 * 1024
# Messages or blocks in one body: just under the 50,000 JSON objects a proxy parses at most.
_OBJECTS = 49_000


def _base(route: str, stream: bool) -> dict[str, Any]:
    """A small valid request of ``route`` with a tool exchange in its history."""
    if route == "responses":
        return {"model": "fake", "stream": stream, "instructions": "sys", "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "out"}]}
    if route == "messages":
        return {"model": "fake", "stream": stream, "max_tokens": 64, "system": "sys",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"}]}]}
    return {"model": "fake", "stream": stream,
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "call_1", "type": "function",
                              "function": {"name": "bash", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "out"}]}


def messages_of(route: str) -> str:
    """The member that holds the conversation in ``route``'s requests."""
    return "input" if route == "responses" else "messages"


def fuzzed(rng: random.Random, route: str = "chat") -> tuple[bytes, dict[str, str]]:
    """One small body: a valid one with random parts replaced by random JSON of random
    depth, sometimes cut short, sometimes gzip (valid or not)."""
    body = _base(route, rng.random() < 0.5)
    for _ in range(rng.randint(1, 4)):
        _mutate(body, rng)
    raw = orjson.dumps(body) if rng.random() < 0.95 else _deep(rng)
    if rng.random() < 0.05:
        raw = raw[:rng.randint(0, len(raw))]
    headers: dict[str, str] = {}
    if rng.random() < 0.05:
        headers["Content_Encoding"] = "gzip"
        raw = gzip.compress(raw) if rng.random() < 0.7 else raw
    return raw, headers


def huge(kind: str, route: str, size: int) -> tuple[bytes, dict[str, str], bool]:
    """A body of ``kind`` for ``route``: its bytes, extra headers, and whether it is to be
    sent chunked (no length). ``size`` is the body limit: long texts come close to it,
    the kinds a proxy parses stay just under 8 MiB."""
    stream = False
    if kind.startswith("long_text"):
        text = "The build failed; the log says the linker could not find the symbol. "
        body = _with_messages(route, stream, [
            {"role": "user", "content": text * ((size - 4096) // len(text))}])
        raw = orjson.dumps(body)
        if kind == "long_text_gzip":
            return gzip.compress(raw, compresslevel=1), {"Content_Encoding": "gzip"}, False
        return raw, {}, kind == "long_text_chunked"
    if kind == "many_messages":
        turn = "a turn of an agent's conversation, one of very many; " * 2
        return orjson.dumps(_with_messages(route, stream, [
            {"role": "user" if i % 2 == 0 else "assistant", "content": turn}
            for i in range(_OBJECTS)])), {}, False
    if kind == "many_blocks":
        block = {"type": "text", "text": "one block of a message of very many blocks; " * 3}
        return orjson.dumps(_with_messages(route, stream, [
            {"role": "user", "content": [block] * _OBJECTS}])), {}, False
    if kind in ("many_values", "many_lists"):
        # Millions of JSON values and no object among them: each a Python object once parsed.
        value = b'"a"' if kind == "many_values" else b"[]"
        count = _PARSED_SIZE // (len(value) + 1)
        head = orjson.dumps(_with_messages(route, stream, [{"role": "user", "content": "x"}]))
        filler = b'"metadata":[' + b",".join([value] * count) + b"],"
        return head[:1] + filler + head[1:], {}, False
    if kind == "long_system":
        # A system prompt of megabytes: what ties sessions together is normalised from it.
        line = "You are a coding agent; today is 2026-11-30 02:27 and the workspace is big. "
        body = _base(route, stream)
        text = line * (_PARSED_SIZE // len(line))
        if route == "chat":
            body["messages"][0]["content"] = text
        else:
            body["instructions" if route == "responses" else "system"] = text
        return orjson.dumps(body), {}, False
    if kind == "wide_text":
        # One character outside the BMP: Python holds the whole string at 4 bytes a character.
        return orjson.dumps(_with_messages(route, stream, [
            {"role": "user", "content": "\U0001f600" + "w" * (_PARSED_SIZE - 4096)}])), {}, False
    raise ValueError(f"no such kind of huge body: {kind}")


def _with_messages(route: str, stream: bool, messages: list[dict[str, Any]]
                   ) -> dict[str, Any]:
    body = _base(route, stream)
    body[messages_of(route)] = messages
    return body


def _deep(rng: random.Random) -> bytes:
    depth = rng.randint(200, 1100)
    inner = "[" * depth + "]" * depth
    return (f'{{"model":"fake","stream":true,"stream_options":{{}},'
            f'"messages":[{{"role":"user","content":{inner}}}]}}').encode()


def _junk(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randint(0, 9 if depth < 6 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, -1, 2**63, 1e308, 3.5])
    if choice == 3:
        letters = "ab\u20ac\U0001f600\n\"\\{}[]"
        return "".join(rng.choice(letters) for _ in range(rng.randint(0, 40)))
    if choice == 4:
        return ""
    if choice == 5:
        return rng.choice(["user", "assistant", "tool", "system", "developer", "call_1"])
    if choice <= 7:
        return [_junk(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["role", "content", "tool_calls", "id", "type", "function", "name",
                        "arguments", "text", "tool_call_id", "x"]): _junk(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


def _mutate(node: Any, rng: random.Random) -> None:
    """Replace one random member somewhere inside ``node`` by junk."""
    while True:
        if isinstance(node, dict) and node:
            key = rng.choice(list(node))
        elif isinstance(node, list) and node:
            key = rng.randrange(len(node))
        else:
            return
        child = node[key]
        if not isinstance(child, dict | list) or not child or rng.random() < 0.35:
            node[key] = _junk(rng)
            return
        node = child
