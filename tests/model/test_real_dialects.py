"""The Responses and Anthropic Messages dialects against the real llama.cpp server (it serves
``/v1/responses`` and ``/v1/messages``), through a real ``tailfloor serve``, with the official
openai and anthropic SDKs. The oracle is the real server: its own refusal, its usage counts
and the bytes it sent, recorded by the relay in front of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.model.conftest import ModelServer
from tests.model.relay import Exchange, RecordingRelay
from tests.model.test_real_overflow import KEEPALIVE, MODEL, conversation, start

SUMMARIZER = "context summarization assistant"


@pytest.fixture
def proxy(relay: RecordingRelay, tmp_path: Path) -> Iterator[ProxyProcess]:
    process = start(relay, tmp_path)
    yield process
    process.stop()


def oai(proxy: ProxyProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-local", max_retries=0,
                         timeout=600)


def claude(proxy: ProxyProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="sk-local", max_retries=0,
                               timeout=600)


def responses_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "developer" if m["role"] == "system" else m["role"],
             "content": [{"type": "output_text" if m["role"] == "assistant" else "input_text",
                          "text": m["content"]}]}
            if m["role"] != "assistant" else
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": m["content"], "annotations": []}]}
            for m in messages]


def anthropic_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
            for m in messages if m["role"] != "system"]


def is_summary(exchange: Exchange) -> bool:
    return SUMMARIZER in exchange.body.decode(errors="replace")


def on(relay: RecordingRelay, path: str) -> list[Exchange]:
    assert all(e.path == path for e in relay.exchanges), [e.path for e in relay.exchanges]
    return list(relay.exchanges)


def check_recovery(server: ModelServer, relay: RecordingRelay, proxy: ProxyProcess,
                   path: str) -> Exchange:
    """Refused by the server, its window learned, one summary by the real model made in the
    request's dialect, and the retry answered."""
    exchanges = on(relay, path)
    assert [(e.status, is_summary(e)) for e in exchanges] == [
        (400, False), (200, True), (200, False)], proxy.logs()
    refusal = orjson.loads(exchanges[0].answer)["error"]
    assert refusal["type"] == "exceed_context_size_error" and refusal["n_ctx"] == server.n_ctx
    assert f"learned the context window of {MODEL}: {server.n_ctx} tokens" in proxy.logs()
    assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 1
    return exchanges[-1]


def test_responses_overflow_recovered_by_the_real_model(
        model_server: ModelServer, relay: RecordingRelay, proxy: ProxyProcess) -> None:
    messages = conversation("r")
    raw = oai(proxy).responses.with_raw_response.create(
        model=MODEL, input=responses_input(messages),  # type: ignore[arg-type]
        max_output_tokens=16)
    answer = raw.parse()
    assert raw.headers["x-tailfloor"] == "compacted:overflow", proxy.logs()
    retry = check_recovery(model_server, relay, proxy, "/v1/responses")
    sent = retry.json()["input"]
    assert sent[0] == responses_input(messages)[0]  # the developer prompt, as the client sent it
    assert sent[-4:] == responses_input(messages)[-4:]  # the raw tail, item for item
    summary = orjson.loads(relay.exchanges[1].answer)["output"][0]["content"][0]["text"]
    assert summary.strip() in sent[1]["content"][0]["text"]
    usage = orjson.loads(retry.answer)["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] <= model_server.n_ctx
    assert answer.output_text


def test_anthropic_stream_overflow_recovered_and_relayed_byte_for_byte(
        model_server: ModelServer, relay: RecordingRelay, proxy: ProxyProcess) -> None:
    messages = conversation("m")
    with claude(proxy).messages.with_streaming_response.create(
            model=MODEL, max_tokens=16, stream=True, system=messages[0]["content"],
            messages=anthropic_turns(messages)) as response:  # type: ignore[arg-type]
        assert response.headers["x-tailfloor"] == "compacted:overflow", proxy.logs()
        received = b"".join(response.iter_bytes())
    retry = check_recovery(model_server, relay, proxy, "/v1/messages")
    assert received.replace(KEEPALIVE, b"") == retry.answer
    sent = retry.json()
    assert sent["system"] == messages[0]["content"]
    assert sent["messages"][-4:] == anthropic_turns(messages)[-4:]
    starts = [json.loads(line[6:]) for line in received.splitlines()
              if line.startswith(b"data: ") and b"message_start" in line]
    assert starts and starts[0]["message"]["usage"]["input_tokens"] <= model_server.n_ctx


@pytest.mark.parametrize("dialect", ["responses", "messages"])
def test_an_answer_that_fits_passes_through_untouched(
        relay: RecordingRelay, proxy: ProxyProcess, dialect: str) -> None:
    relay.exchanges.clear()
    if dialect == "responses":
        with oai(proxy).responses.with_streaming_response.create(
                model=MODEL, input="Say hello.", max_output_tokens=8,
                stream=True) as response:
            received = b"".join(response.iter_bytes())
            verdict = response.headers["x-tailfloor"]
    else:
        with claude(proxy).messages.with_streaming_response.create(
                model=MODEL, max_tokens=8, stream=True,
                messages=[{"role": "user", "content": "Say hello."}]) as response:
            received = b"".join(response.iter_bytes())
            verdict = response.headers["x-tailfloor"]
    (exchange,) = relay.exchanges
    assert verdict.startswith("none")
    assert received.replace(KEEPALIVE, b"") == exchange.answer
    assert proxy.sample("tailfloor_tokens_total", route=dialect, type="output") > 0
