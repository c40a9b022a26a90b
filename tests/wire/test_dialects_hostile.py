"""Hostile bodies on the dialect routes: translation and rendering never raise, whatever JSON a
client sends, and an untouched request always renders back to what it was."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.chat import ChatRequest
from proxy.wire.anthropic import MESSAGES
from proxy.wire.responses import RESPONSES

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "role", "content", "text", "id", "call_id", "output",
                         "name", "arguments", "input", "tool_use_id", "thinking",
                         "signature", "cache_control", "encrypted_content"]), inner,
        max_size=5),
    max_leaves=20)
KINDS = st.sampled_from(["message", "function_call", "function_call_output", "reasoning",
                         "text", "tool_use", "tool_result", "thinking", "image", None])
ROLES = st.sampled_from(["user", "assistant", "system", "developer", "tool", None])
ITEM = st.fixed_dictionaries({"type": KINDS, "role": ROLES}, optional={
    "content": JSON, "call_id": JSON, "id": JSON, "output": JSON, "name": JSON,
    "arguments": JSON, "input": JSON})


@settings(max_examples=300, deadline=None)
@given(items=st.lists(ITEM | JSON, max_size=6), system=JSON, extra=JSON)
def test_responses_translation_and_render_never_raise(items: list[Any], system: Any,
                                                      extra: Any) -> None:
    body = {"model": "m", "input": items, "instructions": system, "metadata": extra}
    raw = orjson.dumps(body)
    chat = ChatRequest.translated(raw, orjson.loads(raw), None, RESPONSES)
    assert chat.outgoing(chat.raw) == raw
    rendered = chat.outgoing(orjson.dumps({**chat.body, "messages": chat.body["messages"][:1]}))
    assert isinstance(orjson.loads(rendered), dict)


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(st.fixed_dictionaries({"role": ROLES}, optional={
    "content": st.lists(ITEM | JSON, max_size=4) | JSON}) | JSON, max_size=6), system=JSON)
def test_anthropic_translation_and_render_never_raise(messages: list[Any],
                                                      system: Any) -> None:
    body = {"model": "m", "max_tokens": 10, "messages": messages, "system": system}
    raw = orjson.dumps(body)
    chat = ChatRequest.translated(raw, orjson.loads(raw), None, MESSAGES)
    assert chat.outgoing(chat.raw) == raw
    rendered = chat.outgoing(orjson.dumps({**chat.body, "messages": chat.body["messages"][1:]}))
    assert isinstance(orjson.loads(rendered), dict)


def test_deeper_than_orjson_writes_passes_through() -> None:
    deep = "[" * 300 + "]" * 300
    raw = ('{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":'
           '[{"type":"tool_use","id":"t","name":"n","input":{"x":' + deep + '}}]}]}').encode()
    chat = ChatRequest.translated(raw, orjson.loads(raw), None, MESSAGES)
    assert chat.pass_reason == "too_deep"
    assert chat.outgoing(chat.raw) == raw
