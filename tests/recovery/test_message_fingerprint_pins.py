"""Message fingerprints name stored compactions and sessions (in a shared store, across
versions): they stay what they were, for every path of the canonical form (plain text,
parts, an integer beyond 64 bits that orjson refuses, tool calls, text outside ASCII).
The values were computed by the code before the canonical form was hashed as written."""

from __future__ import annotations

import pytest

from proxy.recovery.message_chain import message_fingerprint

PINNED = [
    ({"role": "user", "content": "hello"}, "13de834a73aefce6f272d423ff709688"),
    ({"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:x"}},
        {"type": "input_audio", "b": 1, "a": [2**70]}]}, "5bc7a32fbc68837ca99e5e50dcbd1600"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": '{"b": 1, "a": "\\ud800"}'}}]},
     "04bcd098bfcbb0927524020258d75ae3"),
    ({"role": "tool", "tool_call_id": "call_1", "content": "out \u00e9\U0001f600"},
     "1951f5b8306b85eca187ccd7153f4b4e"),
]


@pytest.mark.parametrize(("message", "expected"), PINNED)
def test_fingerprints_stay_what_they_were(message: dict[str, object], expected: str) -> None:
    assert message_fingerprint(message) == expected
