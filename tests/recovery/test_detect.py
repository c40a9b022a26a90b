"""Overflow detection from real-shaped error answers of every provider in the pattern table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.recovery.detect import (
    InvalidPatternError,
    OverflowDetector,
    context_length_exceeded_body,
)
from proxy.recovery.patterns import OVERFLOW_ROWS, numbers_from_text

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compaction"
PROVIDER_ERRORS: list[dict[str, Any]] = json.loads(
    (FIXTURES / "provider_errors.json").read_text())
DETECTOR = OverflowDetector()


def _body_bytes(body: object) -> bytes:
    return body.encode() if isinstance(body, str) else json.dumps(body).encode()


@pytest.mark.parametrize(
    "case", PROVIDER_ERRORS, ids=[f"{c['row']}-{c['provider']}" for c in PROVIDER_ERRORS])
def test_every_row_recognised_from_a_realistic_body(case: dict[str, Any]) -> None:
    verdict = DETECTOR.classify_response(
        case["status"], case["content_type"], _body_bytes(case["body"]))
    assert verdict.is_overflow, verdict
    assert verdict.pattern == case.get("pattern", case["row"])
    assert verdict.window == case.get("window")
    assert verdict.prompt_tokens == case.get("prompt_tokens")
    assert verdict.requested_output_tokens == case.get("output_tokens")
    if "shape" in case:
        assert verdict.shape == case["shape"]


def test_the_fixture_covers_every_row_of_the_table() -> None:
    covered = {case["row"] for case in PROVIDER_ERRORS}
    assert {row.name for row in OVERFLOW_ROWS} <= covered


@pytest.mark.parametrize("row", OVERFLOW_ROWS, ids=[r.name for r in OVERFLOW_ROWS])
def test_every_row_is_its_own_witness(row: Any) -> None:
    # the row named by a fixture matches that fixture's text on its own (not only via another row)
    texts = [json.dumps(c["body"]) if not isinstance(c["body"], str) else c["body"]
             for c in PROVIDER_ERRORS if c["row"] == row.name]
    if row.name == "no_body":
        texts = ["400 status code (no body)", "413 (no body)"]
    assert texts
    assert all(row.regex.search(t.replace('\\"', '"')) for t in texts)


def test_the_fake_upstreams_real_400_body() -> None:
    body = (FIXTURES / "fake_upstream_400.json").read_bytes()
    verdict = DETECTOR.classify_response(400, "application/json; charset=utf-8", body)
    assert verdict.is_overflow
    assert verdict.pattern == "openai_code"
    assert verdict.shape == "openai"
    assert (verdict.window, verdict.prompt_tokens) == (8192, 9000)
    assert verdict.is_overflow and verdict.window == 8192


def test_error_messages_the_agents_recorded_are_overflow() -> None:
    lines = (FIXTURES / "captured_overflow_entries.jsonl").read_text().splitlines()
    assert len(lines) >= 2
    for line in lines:
        message = json.loads(line)["message"]["errorMessage"]
        verdict = DETECTOR.classify_text(message)
        assert verdict.is_overflow and verdict.window == 8192, message


def test_llamacpp_structured_error_teaches_n_ctx() -> None:
    body = {"error": {"code": 400, "message": "request (13392 tokens) exceeds the available "
                      "context size (4096 tokens), try increasing it",
                      "type": "exceed_context_size_error", "n_prompt_tokens": 13392,
                      "n_ctx": 4096}}
    verdict = DETECTOR.classify_response(400, "application/json", json.dumps(body).encode())
    assert verdict.is_overflow and verdict.pattern == "llamacpp_type"
    assert verdict.shape == "llamacpp"
    assert (verdict.window, verdict.prompt_tokens) == (4096, 13392)


def test_llamacpp_fields_win_over_the_text() -> None:
    # n_ctx is the per-slot window; the message may be generic
    body = {"error": {"code": 400, "message": "context full", "type": "exceed_context_size_error",
                      "n_prompt_tokens": 5000, "n_ctx": 2048}}
    verdict = DETECTOR.classify_response(400, "application/json", orjson.dumps(body))
    assert (verdict.is_overflow, verdict.window, verdict.prompt_tokens) == (True, 2048, 5000)


def test_openai_code_alone_is_enough() -> None:
    body = {"error": {"message": "", "type": "invalid_request_error",
                      "code": "context_length_exceeded"}}
    verdict = DETECTOR.classify_response(400, "application/json", orjson.dumps(body))
    assert verdict.is_overflow and verdict.pattern == "openai_code"
    assert verdict.window is None


EXCLUDED = [
    (429, {"error": {"message": "Rate limit reached for gpt-4o in organization org-abc on tokens "
                     "per min (TPM): Limit 30000, Used 28000, Requested 9000.",
                     "type": "tokens", "code": "rate_limit_exceeded"}}, "status_429"),
    (400, {"error": {"message": "Rate limit reached: too many tokens per minute",
                     "code": "context_length_exceeded"}}, "rate_limit"),
    (400, {"message": "Throttling error: Too many tokens, please wait before trying again."},
     "throttling_or_unavailable"),
    (503, {"message": "Service unavailable: model overloaded, too many tokens queued"},
     "throttling_or_unavailable"),
    (400, "Too Many Requests: token limit exceeded for this minute", "too_many_requests"),
]


@pytest.mark.parametrize(("status", "body", "excluded_by"), EXCLUDED)
def test_exclusions_are_not_overflow(status: int, body: object, excluded_by: str) -> None:
    verdict = DETECTOR.classify_response(status, "application/json", _body_bytes(body))
    assert not verdict.is_overflow
    assert verdict.excluded_by == excluded_by


NOT_OVERFLOW = [
    (401, "application/json", {"error": {"message": "Incorrect API key provided: sk-***",
                                         "type": "invalid_request_error",
                                         "code": "invalid_api_key"}}),
    (404, "application/json", {"error": {"message": "The model `gpt-9` does not exist",
                                         "code": "model_not_found"}}),
    (400, "application/json", {"error": {"message": "Invalid schema for function 'bash'",
                                         "code": "invalid_function_parameters"}}),
    (500, "application/json", {"object": "error", "message": "CUDA out of memory",
                                "code": 500}),
    (413, "text/html", "<html><head><title>413 Request Entity Too Large</title></head>"
                       "<body><center><h1>413 Request Entity Too Large</h1></center>"
                       "<hr><center>nginx</center></body></html>"),
    (500, None, ""),
    (502, "text/plain", "upstream connect error or disconnect/reset before headers"),
    (200, "application/json", {"id": "chatcmpl-1", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "maximum context length is "
                                 "8192 tokens, as you asked"}, "finish_reason": "stop"}]}),
    (200, "text/plain", "prompt is too long"),
    (200, "application/json", {"model": "llama3", "done": True, "message": {
        "role": "assistant", "content": "Ollama native answer: prompt is too long"}}),
    (200, "application/json", {"detail": "prompt is too long"}),
]


@pytest.mark.parametrize(("status", "content_type", "body"), NOT_OVERFLOW)
def test_other_errors_and_normal_answers_are_not_overflow(
        status: int, content_type: str | None, body: object) -> None:
    verdict = DETECTOR.classify_response(status, content_type, _body_bytes(body))
    assert not verdict.is_overflow, verdict


def test_a_2xx_answer_carrying_an_error_object_is_classified() -> None:
    body = {"error": {"message": "This model's maximum context length is 2048 tokens."}}
    verdict = DETECTOR.classify_response(200, "application/json", orjson.dumps(body))
    assert verdict.is_overflow and verdict.window == 2048


def test_non_json_plain_text_body() -> None:
    verdict = DETECTOR.classify_response(
        400, "text/plain; charset=utf-8",
        b"Bad Request: prompt too long; exceeded max context length by 12 tokens\n")
    assert verdict.is_overflow and verdict.shape == "text"
    assert verdict.pattern == "ollama_prompt_too_long"


def test_json_content_type_with_broken_json_falls_back_to_text() -> None:
    verdict = DETECTOR.classify_response(
        400, "application/json", b'{"error": {"message": "prompt is too long: 9 tokens')
    assert verdict.is_overflow and verdict.shape == "text"


def test_openrouter_nested_raw_provider_error() -> None:
    raw = json.dumps({"error": {"message": "This model's maximum context length is 32768 tokens."
                                " However, you requested 8192 output tokens and your prompt "
                                "contains at least 24577 input tokens"}})
    body = {"error": {"message": "Provider returned error", "code": 400,
                      "metadata": {"raw": raw, "provider_name": "DeepInfra"}}}
    verdict = DETECTOR.classify_response(400, "application/json", orjson.dumps(body))
    assert verdict.is_overflow
    assert (verdict.window, verdict.prompt_tokens, verdict.requested_output_tokens) == (
        32768, 24577, 8192)


def test_stream_error_events() -> None:
    event = {"error": {"message": "This model's maximum context length is 16384 tokens. However,"
                       " your messages resulted in 17001 tokens.",
                       "type": "invalid_request_error", "code": "context_length_exceeded"}}
    verdict = DETECTOR.classify_stream_event(event)
    assert verdict.is_overflow and (verdict.window, verdict.prompt_tokens) == (16384, 17001)
    assert not DETECTOR.classify_stream_event(
        {"error": {"message": "upstream overloaded", "code": 503}}).is_overflow
    assert not DETECTOR.classify_stream_event({"choices": [], "usage": {}}).is_overflow
    assert DETECTOR.classify_stream_event({"error": "prompt is too long"}).is_overflow
    vllm = {"object": "error", "message": "This model's maximum context length is 4096 tokens.",
            "type": "BadRequestError", "param": None, "code": 400}
    assert DETECTOR.classify_stream_event(vllm).window == 4096
    # a chunk that merely has a message field is content, not an error
    assert not DETECTOR.classify_stream_event({"message": "prompt is too long"}).is_overflow


def test_extra_patterns_from_rules() -> None:
    body = b'{"error": {"message": "Kontextfenster von 8000 Tokens \\u00fcberschritten"}}'
    assert not DETECTOR.classify_response(400, "application/json", body).is_overflow
    custom = OverflowDetector(extra_patterns=[r"kontextfenster .* \w+berschritten"])
    verdict = custom.classify_response(400, "application/json", body)
    assert verdict.is_overflow and verdict.pattern == "rules[0]"
    # exclusions still come first for extra rows
    assert not custom.classify_text("Rate limit: Kontextfenster x überschritten").is_overflow
    assert len(custom.rows) == len(OVERFLOW_ROWS) + 1
    assert len(DETECTOR.rows) == len(OVERFLOW_ROWS)  # no state shared between detectors


def test_invalid_extra_pattern_names_the_culprit() -> None:
    with pytest.raises(InvalidPatternError, match=r"pattern 1 \('\(unclosed'\)"):
        OverflowDetector(extra_patterns=["fine", "(unclosed"])


@pytest.mark.parametrize(("text", "window", "prompt"), [
    ("This model's maximum context length is 8192 tokens. However, your messages resulted in "
     "9000 tokens.", 8192, 9000),
    ("This model's maximum prompt length is 131072 but the request contains 537812 tokens",
     131072, 537812),
    ("prompt token count of 200000 exceeds the limit of 128000", 128000, 200000),
    ("Input length 131393 exceeds the maximum allowed input length of 131,040 tokens.",
     131040, 131393),
    ("Input exceeds the model's maximum context limit of 8192 tokens.", 8192, None),
    ("Your input exceeds the context window of this model.", None, None),
    ("invalid params, context window exceeds limit (2013)", None, None),
    ("maximum context length is 3 tokens", None, None),  # implausible window is ignored
])
def test_window_learning(text: str, window: int | None, prompt: int | None) -> None:
    found = numbers_from_text(text)
    assert (found.window, found.prompt_tokens) == (window, prompt)


def test_the_error_body_tailfloor_returns() -> None:
    body = context_length_exceeded_body(8192, 12000)
    error = orjson.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages"
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 8192 tokens" in error["message"]
    assert "12000" in error["message"]
    # what the OpenAI SDKs raise, as Pi and OpenClaw see it, is matched by the wire table row
    sdk_line = f"400 {error['message']}"
    row = next(r for r in OVERFLOW_ROWS if r.name == "maximum_context_length")
    assert row.regex.search(sdk_line)
    # and our own detector reads the window back
    verdict = DETECTOR.classify_response(400, "application/json", body)
    assert (verdict.is_overflow, verdict.window, verdict.prompt_tokens) == (True, 8192, 12000)
    unknown = orjson.loads(context_length_exceeded_body(4096))["error"]["message"]
    assert re.search(r"maximum context length is 4096 tokens", unknown)


@settings(max_examples=300, deadline=None)
@given(status=st.integers(100, 599), content_type=st.sampled_from(
    [None, "application/json", "text/plain", "text/html"]), body=st.binary(max_size=512))
def test_garbage_never_crashes(status: int, content_type: str | None, body: bytes) -> None:
    verdict = DETECTOR.classify_response(status, content_type, body)
    # A success or a rate limit is never an overflow, whatever the bytes; the message kept
    # for the log stays bounded; and the same bytes give the same verdict.
    if status < 400 or status == 429:
        assert not verdict.is_overflow
    assert len(verdict.message) <= 500
    assert DETECTOR.classify_response(status, content_type, body) == verdict


@settings(max_examples=200, deadline=None)
@given(value=st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["error", "message", "code", "type", "n_ctx", "detail", "x"]),
        inner, max_size=4),
    max_leaves=20))
def test_arbitrary_json_never_crashes(value: object) -> None:
    DETECTOR.classify_response(400, "application/json", json.dumps(value).encode())
    if isinstance(value, dict):
        DETECTOR.classify_stream_event(value)


def test_huge_body_is_bounded() -> None:
    body = b'{"error": {"message": "' + b"x" * 5_000_000 + b'"}}'
    verdict = DETECTOR.classify_response(400, "application/json", body)
    assert not verdict.is_overflow
    assert len(verdict.message) <= 500
