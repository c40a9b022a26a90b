"""OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true: what the model was sent, on the
attempt's span, at a real OTLP receiver. The oracles are the request the test sent and the
bodies the fake upstream received, mapped to the conventions' shape here, by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from tests.fake_behaviour import AgentBehaviour, is_summarization
from tests.fake_upstream import FakeUpstream
from tests.inprocess import InProcessProxy
from tests.otlp_receiver import OtlpReceiver, attributes
from tests.recovery.conversation import history, rules_dir
from tests.telemetry.test_otlp_export import (
    CANARY_HEADER,
    CANARY_KEY,
    CLIENT,
    SERVER,
    otel_env,
    post,
    receiver,
    spans_of,
)

__all__ = ["receiver"]  # the fixture, for pytest
CAPTURE = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
PIXELS = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk-pixels-canary"
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "what is 2+2? secret-content-canary"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "calc", "arguments": "{\"x\": 2, \"y\": 2}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    {"role": "user", "content": [
        {"type": "text", "text": "thanks, and this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXELS}"}},
        {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}}]},
]


def attempt_spans(receiver: OtlpReceiver, count: int) -> list[dict[str, Any]]:
    return [attributes(s.attributes) for s in spans_of(receiver, count)
            if s.kind == CLIENT and "tailfloor.retry" in attributes(s.attributes)]


def test_the_messages_sent_are_on_the_attempt_span_when_asked(
        clean_fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver, **CAPTURE))
    try:
        status, _, _ = post(proxy, "/v1/chat/completions",
                            {"model": "fake-model", "messages": MESSAGES})
        assert status == 200
        found = spans_of(receiver, 2)
        [attempt] = [attributes(s.attributes) for s in found if s.kind == CLIENT]
        assert json.loads(attempt["gen_ai.system_instructions"]) == [
            {"type": "text", "content": "You are terse."}]
        assert json.loads(attempt["gen_ai.input.messages"]) == [
            {"role": "user", "parts": [
                {"type": "text", "content": "what is 2+2? secret-content-canary"}]},
            {"role": "assistant", "parts": [
                {"type": "tool_call", "id": "call_1", "name": "calc",
                 "arguments": {"x": 2, "y": 2}}]},
            {"role": "tool", "parts": [
                {"type": "tool_call_response", "id": "call_1", "response": "4"}]},
            {"role": "user", "parts": [
                {"type": "text", "content": "thanks, and this?"},
                {"type": "blob", "modality": "image", "mime_type": "image/png"},
                {"type": "uri", "modality": "image", "uri": "https://example.test/cat.png"}]},
        ]
        [server] = [attributes(s.attributes) for s in found if s.kind == SERVER]
        assert not any(name.startswith("gen_ai.input") for name in server)
        raw = b"".join(receiver.raw)  # bodies and header blocks
        # content, yes; an image's bytes or the client's key, never (the collector's own
        # header is in the receiver's header blocks, as it should be)
        assert b"secret-content-canary" in raw
        assert CANARY_HEADER.encode() in raw
        for secret in (PIXELS, CANARY_KEY):
            assert secret.encode() not in raw
    finally:
        proxy.stop()


def test_without_the_variable_no_content_goes_out(clean_fake: FakeUpstream,
                                                  receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        post(proxy, "/v1/chat/completions", {"model": "fake-model", "messages": MESSAGES})
        [attempt] = attempt_spans(receiver, 2)
        assert "gen_ai.input.messages" not in attempt
        assert b"secret-content-canary" not in b"".join(receiver.raw)
    finally:
        proxy.stop()


def test_a_compacted_retry_shows_the_summary_the_model_was_sent_within_the_limit(
        clean_fake: FakeUpstream, receiver: OtlpReceiver, tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=9000)
    proxy = InProcessProxy(clean_fake, "--rules", str(rules_dir(tmp_path)), "--state",
                           str(tmp_path / "state"), env=otel_env(
                               receiver, **CAPTURE, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT="4000"))
    try:
        messages = [*history("a", 8, 700), {"role": "user", "content": "what now?"}]
        status, _, headers = post(proxy, "/v1/chat/completions", {
            "model": "fake-model", "messages": messages, "max_completion_tokens": 256})
        assert status == 200 and headers["x-tailfloor"] == "compacted:overflow"
        attempts = sorted(attempt_spans(receiver, 4), key=lambda a: a["tailfloor.retry"])
        assert [a["tailfloor.retry"] for a in attempts] == [0, 1]
        first, retry = attempts
        assert "gen_ai.input.messages" not in first  # what the last attempt sent, only
        captured = retry["gen_ai.input.messages"]
        assert len(captured) <= 4000
        # The retry's first conversation message, as the upstream got it: the summary.
        [sent] = [r for r in clean_fake.chat_requests()[1:]
                  if not is_summarization(orjson.loads(r.body)["messages"])]
        summary = orjson.loads(sent.body)["messages"][1]["content"]
        summary_text = summary if isinstance(summary, str) else summary[0]["text"]
        assert json.dumps(summary_text)[1:200] in captured
    finally:
        proxy.stop()
