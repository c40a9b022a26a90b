"""Message fingerprints: equal for re-renderings of the same message, different otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.recovery.message_chain import (
    message_fingerprint,
    prefix_chain,
)
from proxy.wire.tool_ids import call_id_key

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compaction"
fp = message_fingerprint


def call(call_id: str, args: str, content: object = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "exec", "arguments": args}}]}


def test_renderings_of_the_same_message_match() -> None:
    assert fp({"role": "user", "content": "hi\nthere"}) == fp(
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "text", "text": "there"}]})
    assert fp(call("call_1", '{"command": "ls", "cwd": "/"}')) == fp(
        call("call_1", '{"cwd":"/","command":"ls"}'))
    assert fp(call("c", "{}", None)) == fp(call("c", "{}", ""))
    assert fp({"role": "assistant", "content": "ok", "reasoning_content": "hmm"}) == fp(
        {"role": "assistant", "content": "ok"})


def test_tool_call_ids_as_agents_rewrite_them() -> None:
    # OpenClaw sends the transcript's call_ee68... without the underscore (captures README)
    assert fp(call("call_ee6852ba1db54570", "{}")) == fp(call("callee6852ba1db54570", "{}"))
    # Pi's normalisation for another model: part before '|', odd characters replaced
    assert call_id_key("call_abc|fc_xyz") == call_id_key("call_abc")
    assert call_id_key("call.a+b") == call_id_key("call_a_b")
    assert fp({"role": "tool", "tool_call_id": "call_abc|fc_1", "content": "x"}) == fp(
        {"role": "tool", "tool_call_id": "call_abc", "content": "x"})
    assert call_id_key(None) == ""


def test_what_the_model_reads_differently_differs() -> None:
    base = {"role": "user", "content": "hello"}
    variants: list[dict[str, Any]] = [
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "hello!"},
        {"role": "user", "content": [{"type": "text", "text": "hello"},
                                     {"type": "image_url", "image_url": {"url": "data:a"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "hello"},
    ]
    fps = {fp(base)} | {fp(v) for v in variants}
    assert len(fps) == len(variants) + 1
    assert fp(call("a", '{"command":"ls"}')) != fp(call("a", '{"command":"ls -l"}'))
    assert fp(call("a", "{}")) != fp(call("b", "{}"))
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:a"}}]}
    other = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:b"}}]}
    assert fp(image) != fp(other)


def test_prefix_chain_names_prefixes() -> None:
    captured = json.loads((FIXTURES / "captured_requests.json").read_text())
    messages = captured["oc_request18_messages"]
    chain = prefix_chain(messages)
    assert len(chain) == len(messages) and len(set(chain)) == len(chain)
    assert prefix_chain(messages[:4]) == chain[:4]
    reordered = [messages[1], messages[0], *messages[2:]]
    assert prefix_chain(reordered)[1] != chain[1]
    assert prefix_chain(reordered)[-1] != chain[-1]  # the chain remembers the order
    assert prefix_chain([]) == []


def test_odd_values_do_not_crash() -> None:
    big = call("x", json.dumps({"n": 10**30}))
    assert fp(big) == fp(call("x", json.dumps({"n": 10**30})))
    assert fp({"role": "user", "content": "\ud800 lone surrogate"})
    assert fp({"role": "user", "content": [{"type": "input_audio", "input_audio": {"d": 10**30}}]})
    assert fp({"content": 5, "tool_calls": "nope", "tool_call_id": 3})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "tool_calls", "id", "function",
                         "arguments", "name", "tool_call_id", "image_url", "url"]),
        inner, max_size=4),
    max_leaves=15)


@settings(max_examples=300, deadline=None)
@given(message=st.dictionaries(st.sampled_from(["role", "content", "tool_calls",
                                                "tool_call_id"]), json_values))
def test_any_message_has_a_stable_fingerprint(message: dict[str, Any]) -> None:
    first = fp(message)
    assert first == fp(json.loads(json.dumps(message)))
    assert len(first) == 32
