"""Overflow recovery against a real llama.cpp server (SmolLM2-135M, n_ctx from conftest),
through a real ``tailfloor serve`` and the openai SDK. The oracle is the real server: its own
errors, its usage counts and the bytes it sent, recorded by the relay in front of it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.model.conftest import ModelServer
from tests.model.relay import Exchange, RecordingRelay

MODEL = "smollm2"
KEEPALIVE = b": keep-alive\n\n"
RULES = """[defaults]
min_tail_messages = 4
summary_max_tokens = 64
summarizer_timeout = 300
report_usage = "upstream"

[[rules]]
name = "warm-up"
model = "warm-up"
preflight = false
on_overflow = "passthrough"
"""
MODELS = """
[[models]]
pattern = "warm-up"
context_window = 256
encoding = "o200k_base"
margin = 0.2
"""
PROSE = ("The nightly export reads the orders table, writes parquet files to the shared bucket "
         "and posts a short report to the team channel. When the warehouse is busy the export "
         "waits for a lock and sometimes gives up. ")
LOG = "2026-11-30 14:02:17 worker-3 INFO export step finished, wrote part-0042.parquet\n"


def conversation(tag: str) -> list[dict[str, Any]]:
    """Just over the window by the server's count: what goes before the raw tail (the last
    four messages) fits one summarizer call, and the tail leaves room for a few more turns."""
    return [
        {"role": "system", "content": "You are a helpful assistant for the data team."},
        {"role": "user", "content": f"[{tag}] Our nightly export job is flaky. Its config is "
                                    "/etc/export/nightly.toml. Never restart the database."},
        {"role": "assistant", "content": "Noted. Please describe the job."},
        {"role": "user", "content": "The job: " + PROSE * 15},
        {"role": "assistant", "content": "I see no failure in that description yet."},
        {"role": "user", "content": "Recent log lines: " + PROSE * 13 + LOG * 4},
        {"role": "assistant", "content": "Still normal so far."},
        {"role": "user", "content": PROSE * 3 + "The error was ERR_EXPORT_TIMEOUT. What now?"},
    ]


def start(relay: RecordingRelay, tmp_path: Path, models: str = "") -> ProxyProcess:
    """tailfloor in front of the relay, its tokenizer loaded: a fresh process counts by the
    estimate until its table is there, and these tests plan sizes by the real count."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "00.toml").write_text(RULES + MODELS + models)
    process = ProxyProcess(relay.url, "--rules", str(rules), "--state", str(tmp_path / "state"))
    # counted (over its 256-token window), refused by the server at once, passed through
    over = [{"role": "user", "content": PROSE * 60}]
    with pytest.raises(openai.BadRequestError):
        client(process).chat.completions.create(model="warm-up", messages=over,  # type: ignore[arg-type]
                                                max_tokens=1)
    deadline = time.monotonic() + 30
    while "tokenizer o200k_base loaded" not in process.logs():
        assert time.monotonic() < deadline, process.logs()
        time.sleep(0.05)
    relay.exchanges.clear()
    return process


@pytest.fixture
def proxy(relay: RecordingRelay, tmp_path: Path) -> Iterator[ProxyProcess]:
    process = start(relay, tmp_path)
    yield process
    process.stop()


def client(proxy: ProxyProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-local", max_retries=0,
                         timeout=600)


def server_count(server: ModelServer, messages: list[dict[str, Any]]) -> int:
    """The server's count of the message texts alone (its chat template adds more)."""
    return server.tokenize("\n".join(str(m["content"]) for m in messages))


def data_events(stream: bytes) -> list[str]:
    return [line[len(b"data: "):].decode() for line in stream.splitlines()
            if line.startswith(b"data: ")]


def summary_text(exchange: Exchange) -> str:
    content: str = orjson.loads(exchange.answer)["choices"][0]["message"]["content"]
    return content.strip()


def check_recovery(server: ModelServer, relay: RecordingRelay, proxy: ProxyProcess,
                   sent: list[dict[str, Any]]) -> Exchange:
    """The server refused the request, its window was learned, the model wrote the summary
    that opens the retry, and the retry fitted by the server's count."""
    seen = [(e.status, e.is_summary, len(e.body)) for e in relay.chats()]
    assert len(seen) == 3, (seen, proxy.logs())  # one summarizer call: the material fits one
    first, *summaries, retry = relay.chats()
    assert first.status == 400
    refusal = orjson.loads(first.answer)["error"]
    assert refusal["type"] == "exceed_context_size_error" and refusal["n_ctx"] == server.n_ctx
    assert first.json()["messages"] == sent
    assert summaries and all(s.is_summary and s.status == 200 for s in summaries)
    assert not retry.is_summary and retry.status == 200
    assert f"learned the context window of {MODEL}: {server.n_ctx} tokens" in proxy.logs()
    messages = retry.json()["messages"]
    assert messages[0] == sent[0] and messages[-4:] == sent[-4:]
    opening = "".join(p["text"] for p in messages[1]["content"])
    assert summary_text(summaries[-1]) in opening  # the last chunk's summary, as written
    assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 1
    return retry


def test_non_streaming_overflow_is_recovered_and_the_summary_reused(
        model_server: ModelServer, relay: RecordingRelay, proxy: ProxyProcess) -> None:
    messages = conversation("a")
    assert server_count(model_server, messages) > model_server.n_ctx  # it cannot fit
    raw = client(proxy).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=16)  # type: ignore[arg-type]
    answer = raw.parse()
    assert raw.headers["x-tailfloor"] == "compacted:overflow", proxy.logs()
    retry = check_recovery(model_server, relay, proxy, messages)
    usage = orjson.loads(retry.answer)["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= model_server.n_ctx
    assert answer.usage is not None and answer.usage.prompt_tokens == usage["prompt_tokens"]

    # the next turn repeats the history: the stored summary replaces it, no summarizer call
    relay.exchanges.clear()
    follow = [*messages, {"role": "assistant", "content": answer.choices[0].message.content},
              {"role": "user", "content": "And after that?"}]
    raw = client(proxy).chat.completions.with_raw_response.create(
        model=MODEL, messages=follow, max_tokens=16)  # type: ignore[arg-type]
    raw.parse()
    assert raw.headers["x-tailfloor"] == "reused"
    (sent,) = relay.chats()
    assert sent.status == 200 and not sent.is_summary
    assert sent.json()["messages"][1] == retry.json()["messages"][1]
    assert proxy.sample("tailfloor_compactions_total", trigger="reused") == 1


def test_streaming_overflow_is_recovered_and_relayed_byte_for_byte(
        model_server: ModelServer, relay: RecordingRelay, proxy: ProxyProcess) -> None:
    messages = conversation("a")  # as above: the server's prompt cache saves CI time
    with client(proxy).chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, max_tokens=16, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}) as response:
        assert response.headers["x-tailfloor"] == "compacted:overflow"
        received = b"".join(response.iter_bytes())
    retry = check_recovery(model_server, relay, proxy, messages)
    # the server's SSE byte for byte, plus the comments tailfloor writes into an idle stream
    # (a slow machine keeps the first token waiting past --keepalive-interval)
    keepalives = received.count(KEEPALIVE)
    assert received.replace(KEEPALIVE, b"") == retry.answer
    assert proxy.sample("tailfloor_stream_keepalives_total") == keepalives
    events = [json.loads(e) for e in data_events(received) if e != "[DONE]"]
    usage = events[-1]["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= model_server.n_ctx


def test_an_output_limit_past_the_window_is_lowered_to_what_the_server_holds(
        model_server: ModelServer, relay: RecordingRelay, tmp_path: Path) -> None:
    proxy = start(relay, tmp_path, f'[[models]]\npattern = "{MODEL}"\n'
                                   f'context_window = {model_server.n_ctx}\n'
                                   'encoding = "o200k_base"\nmargin = 0.2\n')
    try:
        messages = [{"role": "user", "content": PROSE * 4 + "Reply with the word OK."}]
        raw = client(proxy).chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=4000,  # type: ignore[arg-type]
            stop=["\n", "."])
        raw.parse()
        assert raw.headers["x-tailfloor"] == "clamped:preflight"
        (sent,) = relay.chats()
        limit = sent.json()["max_tokens"]
        assert limit < 4000 and sent.json()["messages"] == messages
        prompt = orjson.loads(sent.answer)["usage"]["prompt_tokens"]  # the server's count
        assert prompt + limit <= model_server.n_ctx
        assert limit >= 1000  # never below min(min_output_tokens, a quarter of 4000)
        assert proxy.sample("tailfloor_output_lowered_total", trigger="preflight") == 1
    finally:
        proxy.stop()


def test_a_length_finish_at_the_window_is_not_a_silent_overflow(
        model_server: ModelServer, relay: RecordingRelay, tmp_path: Path) -> None:
    """llama.cpp refuses a prompt that fills its window, and one that fits generates until the
    window is full and stops with ``length``: an answer with output, which the silent-overflow
    rules leave alone (only a length finish with no output at a full window is one)."""
    proxy = start(relay, tmp_path, f'[[models]]\npattern = "{MODEL}"\n'
                                   f'context_window = {model_server.n_ctx}\n'
                                   'encoding = "o200k_base"\nmargin = 0.2\n'
                                   f'[[rules]]\nname = "as sent"\nmodel = "{MODEL}"\n'
                                   'preflight = false\n')
    try:
        # a few tokens of room left, by the server's own count of the prompt
        question = "What now?"
        messages = [*conversation("a")[:-1], {"role": "user", "content": question}]
        while model_server.prompt_tokens(messages) < model_server.n_ctx - 6:
            question = "Please, " + question
            messages[-1] = {"role": "user", "content": question}
        assert model_server.prompt_tokens(messages) < model_server.n_ctx
        answer = client(proxy).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=400)  # type: ignore[arg-type]
        (sent,) = relay.chats()
        assert sent.json()["messages"] == messages and sent.json()["max_tokens"] == 400
        usage = orjson.loads(sent.answer)["usage"]  # the server's own counts
        assert answer.choices[0].finish_reason == "length"
        assert 0 < usage["completion_tokens"] < 400
        assert model_server.n_ctx - 2 <= usage["prompt_tokens"] + usage["completion_tokens"] \
            <= model_server.n_ctx
        assert proxy.sample("tailfloor_overflow_total", outcome="silent") == 0
        assert "silent context overflow" not in proxy.logs()
    finally:
        proxy.stop()


def test_a_retry_is_cut_by_the_servers_count_when_ours_is_low(
        model_server: ModelServer, relay: RecordingRelay, tmp_path: Path) -> None:
    """No margin and no reserve: a compaction planned by our count alone would fill the window
    and be refused again. The refusal's n_prompt_tokens against our count of the same request
    cuts the retry to fit by the server's measure."""
    proxy = start(relay, tmp_path, f'[[models]]\npattern = "{MODEL}"\n'
                                   f'context_window = {model_server.n_ctx}\n'
                                   'encoding = "o200k_base"\nmargin = 0.0\n'
                                   f'[[rules]]\nname = "tight"\nmodel = "{MODEL}"\n'
                                   'reserve_tokens = 0\nmin_tail_messages = 30\n')
    try:
        messages = conversation("a")
        raw = client(proxy).chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=16)  # type: ignore[arg-type]
        raw.parse()
        assert raw.headers["x-tailfloor"] == "compacted:overflow", proxy.logs()
        refused, *_, retry = relay.chats()
        measured = orjson.loads(refused.answer)["error"]["n_prompt_tokens"]
        assert measured > model_server.n_ctx
        assert retry.status == 200 and not retry.is_summary
        usage = orjson.loads(retry.answer)["usage"]
        assert usage["prompt_tokens"] + 16 <= model_server.n_ctx
        assert model_server.prompt_tokens(retry.json()["messages"]) == usage["prompt_tokens"]
        assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 1
    finally:
        proxy.stop()
