"""The cost of parsing a chat body, estimated before it is parsed, is never below what the
parse and the translation really make, whatever the body's shape; the bodies whose parse
would take too long are not parsed; no collection runs inside a parse."""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

import orjson
import pytest

from proxy.chat import ChatRequest
from proxy.server.body_cost import MAX_PARSED_BYTES, MAX_VALUES, body_cost
from proxy.server.parsing import parsed, parses_running
from proxy.wire.anthropic import MESSAGES
from proxy.wire.dialect import Dialect
from proxy.wire.responses import RESPONSES


def _body(route: str, content: Any, extra: bytes = b"") -> bytes:
    key = "input" if route == "responses" else "messages"
    body = orjson.dumps({"model": "m", "max_tokens": 5, key: [
        {"role": "user", "content": content}]})
    return body[:1] + extra + body[1:] if extra else body


SHAPES = {
    "text": lambda route: _body(route, "plain words and more " * 100_000),
    "tiny strings": lambda route: _body(route, "x", b'"m":[' + b",".join([b'"a"'] * 90_000)
                                        + b"],"),
    "empty lists": lambda route: _body(route, "x", b'"m":[' + b",".join([b"[]"] * 90_000)
                                       + b"],"),
    "empty objects": lambda route: _body(route, "x", b'"m":[' + b",".join([b"{}"] * 90_000)
                                         + b"],"),
    "text blocks": lambda route: _body(route, [{"type": "text", "text": f"block {i}"}
                                               for i in range(45_000)]),
    "wide text": lambda route: _body(route, "\U0001f600" + "w" * 1_000_000),
    "escaped wide text": lambda route: orjson.dumps(orjson.loads(_body(
        route, "\U0001f600" + "w" * 1_000_000)), option=orjson.OPT_INDENT_2).replace(
        "\U0001f600".encode(), b"\\ud83d\\ude00"),
}
DIALECTS: dict[str, Dialect | None] = {"chat": None, "responses": RESPONSES,
                                       "messages": MESSAGES}


def _size(value: object, seen: set[int]) -> int:
    """Bytes the objects reachable from ``value`` take (each once)."""
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(_size(k, seen) + _size(v, seen) for k, v in value.items())
    elif isinstance(value, list | tuple):
        size += sum(_size(item, seen) for item in value)
    return size


def _made(raw: bytes, dialect: Dialect | None) -> int:
    """Bytes the parse and the translation keep, counted object by object (the body's own
    bytes aside): the parsed body, the translation and the chat bytes made of it."""
    chat = parsed(raw, None, dialect)
    assert chat.inspected
    seen = {id(raw)}
    parts: list[object] = [chat.body, chat.raw]
    if chat.translation is not None:
        parts += [chat.translation.body, chat.translation.items, chat.translation.chat,
                  chat.translation.sources]
    return sum(_size(part, seen) for part in parts)


@pytest.mark.parametrize("route", list(DIALECTS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_estimate_is_never_below_what_parsing_makes(shape: str, route: str) -> None:
    raw = SHAPES[shape](route)
    dialect = DIALECTS[route]
    cost = body_cost(raw, dialect=dialect is not None)
    assert cost.parsable, (len(raw), cost.values)
    made = _made(raw, dialect)
    assert cost.memory >= len(raw) + made, (cost.memory, len(raw), made)


def test_wide_text_is_seen_raw_or_escaped_and_plain_text_is_not() -> None:
    assert body_cost("\u00e9t\u00e9".encode(), dialect=False).wide
    assert body_cost(b'{"t":"\\u00e9"}', dialect=False).wide
    assert not body_cost(b'{"t":"line\\nline \\"quoted\\""}', dialect=False).wide


def test_values_are_counted_from_above() -> None:
    values = 1234
    raw = b"[" + b",".join([b"[]"] * values) + b"]"
    assert body_cost(raw, dialect=False).values >= values
    # Commas inside text count too: never fewer than the values.
    assert body_cost(b'{"t":"a, b, c"}', dialect=False).values >= 1


def test_bodies_of_too_many_values_or_bytes_are_not_parsed() -> None:
    many = b"[" + b",".join([b"0"] * (MAX_VALUES + 1)) + b"]"
    assert not body_cost(many, dialect=False).parsable
    long = b'{"t":"' + b"x" * MAX_PARSED_BYTES + b'"}'
    assert not body_cost(long, dialect=False).parsable
    assert body_cost(b'{"t":"' + b"x" * (MAX_PARSED_BYTES - 16) + b'"}', dialect=False).parsable


def test_no_collection_runs_inside_a_parse() -> None:
    # 90,000 lists: enough allocations for a collection every few hundred of them.
    raw = b'{"model":"m","messages":[],"m":[' + b",".join([b"[]"] * 90_000) + b"]}"
    runs: list[str] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            runs.append(phase)

    # A parse another test began in a worker thread (a request whose client left goes on
    # parsing) pauses the collector of this whole process until it ends: wait for it.
    waited = time.monotonic() + 60
    while parses_running() and time.monotonic() < waited:
        time.sleep(0.05)
    assert not parses_running() and gc.isenabled(), "the collector is off outside any parse"
    gc.collect()
    gc.callbacks.append(seen)
    try:
        orjson.loads(raw)  # the same parse, bare: collections do run in it
        bare = len(runs)
        runs.clear()
        chat = parsed(raw, None, None)
    finally:
        gc.callbacks.remove(seen)
    # A collection every 700 new containers: ~130 in the bare parse. Paused, none runs in
    # it; one may run when the collector is back, for all of them at once.
    assert bare > 10, "few collections ran in a bare parse: the check below proves nothing"
    assert len(runs) <= 1, runs
    assert isinstance(chat, ChatRequest) and gc.isenabled()
