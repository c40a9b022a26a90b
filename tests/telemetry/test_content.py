"""The content attributes from hostile chat messages: never an exception, always bounded."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.telemetry.content import content_attributes

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)
MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "x"]) | JSON,
    "content": JSON, "tool_calls": JSON, "tool_call_id": JSON})


@settings(max_examples=300, deadline=None)
@given(st.lists(MESSAGE | JSON, max_size=6), st.integers(1, 400))
def test_any_messages_give_bounded_attributes(messages: list[Any], limit: int) -> None:
    for name, value in content_attributes(messages, limit):
        assert name in ("gen_ai.system_instructions", "gen_ai.input.messages")
        assert isinstance(value, str) and len(value) <= limit


def test_odd_text_is_escaped_not_raised() -> None:
    messages = [{"role": "user", "content": "lone \ud800 surrogate"},
                {"role": "assistant", "tool_calls": [{"id": "c", "function": {
                    "name": "f", "arguments": json.dumps({"n": 2 ** 70})}}]}]
    [(name, value)] = content_attributes(messages, 10_000)
    assert name == "gen_ai.input.messages"
    decoded = json.loads(value)
    assert decoded[0]["parts"][0]["content"] == "lone \ud800 surrogate"
    assert decoded[1]["parts"][0]["arguments"] == {"n": 2 ** 70}


def test_a_cut_value_is_the_limit_long() -> None:
    [(_name, value)] = content_attributes([{"role": "user", "content": "x" * 1000}], 100)
    assert value == json.dumps([{"role": "user", "parts": [
        {"type": "text", "content": "x" * 1000}]}], separators=(",", ":"))[:100]


def test_deep_arguments_stay_a_string_and_an_image_keeps_its_bytes_and_secrets() -> None:
    deep = "[" * 1000 + "]" * 1000
    messages = [
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {
            "name": "f", "arguments": deep}}]},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png,%89PNG-bytes-canary"}},
            {"type": "image_url", "image_url": {"url": "data:QUJD-bytes-canary"}},
            {"type": "image_url", "image_url": {
                "url": "https://user:pw-canary@img.test:8443/a.png?X-Amz-Signature=sig-canary"}}]},
    ]
    [(_name, value)] = content_attributes(messages, 100_000)
    decoded = json.loads(value)
    assert decoded[0]["parts"][0]["arguments"] == deep
    assert "canary" not in value
    parts = decoded[1]["parts"]
    assert [p.get("mime_type") for p in parts[:2]] == ["image/png", None]
    assert parts[2]["uri"] == "https://img.test:8443/a.png"
