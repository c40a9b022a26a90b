"""The async Summarizer through a scripted transport, and reading the summarizer's answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from proxy.recovery.summarize.response import MalformedSummary, parse_summary_response
from proxy.recovery.summarize.summarizer import (
    Summarizer,
    SummarizerConfig,
    SummarizerError,
)
from proxy.wire.summary import unwrap_summary


def tokens(message: dict[str, Any]) -> int:
    return len(json.dumps(message)) // 4 + 1


def completion(text: str, prompt: int = 100, out: int = 20, finish: str = "stop") -> bytes:
    return orjson.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": out,
                  "total_tokens": prompt + out}})


@dataclass
class Scripted:
    """A transport that answers from a script and records what it was sent."""

    answers: list[tuple[int, bytes] | BaseException | float]
    sent: list[dict[str, Any]] = field(default_factory=list)
    headers: list[Mapping[str, str]] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)

    async def complete(self, body: bytes, headers: Mapping[str, str],
                       timeout: float) -> tuple[int, bytes]:  # noqa: ASYNC109
        self.sent.append(orjson.loads(body))
        self.headers.append(headers)
        self.timeouts.append(timeout)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, float):
            await asyncio.sleep(answer)
            return 200, completion("late")
        return answer


def conversation(turns: int, size: int = 400) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"turn {n}: " + "u" * size})
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": f"ls /tmp/{n}"})}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": "r" * size})
    return messages


def user_text(body: dict[str, Any]) -> str:
    return str(body["messages"][1]["content"][0]["text"])


AUTH = {"authorization": "Bearer sk-client-own", "Content-Type": "text/plain",
        "Content-Length": "99"}


async def test_single_call_summary() -> None:
    transport = Scripted([(200, completion("## Goal\nship it", 321, 45))])
    summarizer = Summarizer(transport, SummarizerConfig(context_window=32_000), tokens)
    result = await summarizer.summarize(conversation(3), model="m", headers=AUTH)
    assert (result.text, result.prompt_tokens, result.completion_tokens) == (
        "## Goal\nship it", 321, 45)
    assert result.calls == 1 and not result.truncated and result.duration >= 0
    body = transport.sent[0]
    assert body["stream"] is False and body["model"] == "m" and "tools" not in body
    assert body["max_completion_tokens"] == 4096
    assert 'bash(command="ls /tmp/2")' in user_text(body)
    assert transport.headers[0]["authorization"] == "Bearer sk-client-own"
    assert {k.lower(): v for k, v in transport.headers[0].items()} == {
        "authorization": "Bearer sk-client-own", "content-type": "application/json"}


async def test_chunked_summary_carries_the_previous_summary_forward() -> None:
    messages = conversation(12, size=800)  # ~ 12 * 450 tokens
    config = SummarizerConfig(context_window=3000, max_output_tokens=500,
                              prompt_overhead_tokens=200)
    budget = config.chunk_budget(0)
    assert sum(map(tokens, messages)) > budget
    answers: list[tuple[int, bytes] | BaseException | float] = [
        (200, completion(f"## Goal\nsummary {n}", 1000, 100)) for n in range(20)]
    transport = Scripted(answers)
    result = await Summarizer(transport, config, tokens).summarize(
        messages, model="m", headers=AUTH, previous_summary="## Goal\nagent's own")
    calls = len(transport.sent)
    assert calls > 1 and result.calls == calls
    assert result.text == f"## Goal\nsummary {calls - 1}"
    assert result.prompt_tokens == 1000 * calls and result.completion_tokens == 100 * calls
    # the agent's summary is updated first, then each answer is carried into the next call
    assert "<previous-summary>\n## Goal\nagent's own\n</previous-summary>" in user_text(
        transport.sent[0])
    for n in range(1, calls):
        assert f"<previous-summary>\n## Goal\nsummary {n - 1}\n" in user_text(transport.sent[n])
    # every turn was read exactly once, in order
    seen = "".join(user_text(b) for b in transport.sent)
    positions = [seen.index(f"turn {n}: ") for n in range(12)]
    assert positions == sorted(positions)
    assert all(seen.count(f"turn {n}: ") == 1 for n in range(12))


async def test_too_many_chunks_is_refused_before_any_call() -> None:
    config = SummarizerConfig(context_window=2200, max_output_tokens=500,
                              prompt_overhead_tokens=200, max_calls=2)
    transport = Scripted([])
    with pytest.raises(SummarizerError) as err:
        await Summarizer(transport, config, tokens).summarize(
            conversation(30, 800), model="m", headers=AUTH)
    assert err.value.kind == "too_large" and transport.sent == []


async def test_non_200_is_a_typed_error_with_the_body() -> None:
    body = b'{"error": {"message": "Incorrect API key", "code": "invalid_api_key"}}'
    transport = Scripted([(401, body)])
    with pytest.raises(SummarizerError) as err:
        await Summarizer(transport, SummarizerConfig(context_window=32_000), tokens).summarize(
            conversation(1), model="m", headers=AUTH)
    assert (err.value.kind, err.value.status, err.value.calls) == ("status", 401, 1)
    assert err.value.body == body
    assert "sk-client-own" not in str(err.value)


async def test_timeout() -> None:
    transport = Scripted([5.0])
    config = SummarizerConfig(context_window=32_000, call_timeout=0.05)
    with pytest.raises(SummarizerError) as err:
        await Summarizer(transport, config, tokens).summarize(
            conversation(1), model="m", headers=AUTH)
    assert err.value.kind == "timeout"
    assert transport.timeouts == [0.05]


async def test_total_deadline_shrinks_the_last_calls() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    class Slow(Scripted):
        async def complete(self, body: bytes, headers: Mapping[str, str],
                           timeout: float) -> tuple[int, bytes]:  # noqa: ASYNC109
            now[0] += 40.0
            return await super().complete(body, headers, timeout)

    config = SummarizerConfig(context_window=3000, max_output_tokens=500,
                              prompt_overhead_tokens=200, timeout=100.0, call_timeout=60.0)
    transport = Slow([(200, completion("s")) for _ in range(10)])
    with pytest.raises(SummarizerError) as err:
        await Summarizer(transport, config, tokens, clock=clock).summarize(
            conversation(12, 800), model="m", headers=AUTH)
    assert err.value.kind == "timeout"
    assert transport.timeouts == [60.0, 60.0, 20.0]


async def test_transport_failure_and_malformed_answers() -> None:
    config = SummarizerConfig(context_window=32_000)
    transport = Scripted([ConnectionResetError("peer reset")])
    with pytest.raises(SummarizerError) as err:
        await Summarizer(transport, config, tokens).summarize(
            conversation(1), model="m", headers=AUTH)
    assert err.value.kind == "transport" and "ConnectionResetError" in err.value.detail
    for answer in (b"<html>oops</html>", completion("   "), b'{"choices": []}'):
        with pytest.raises(SummarizerError) as err:
            await Summarizer(Scripted([(200, answer)]), config, tokens).summarize(
                conversation(1), model="m", headers=AUTH)
        assert err.value.kind == "malformed"


async def test_cancellation_is_not_swallowed() -> None:
    transport = Scripted([asyncio.CancelledError()])
    with pytest.raises(asyncio.CancelledError):
        await Summarizer(transport, SummarizerConfig(context_window=32_000), tokens).summarize(
            conversation(1), model="m", headers=AUTH)


async def test_nothing_new_returns_the_previous_summary_without_a_call() -> None:
    transport = Scripted([])
    summarizer = Summarizer(transport, SummarizerConfig(context_window=32_000), tokens)
    result = await summarizer.summarize([], model="m", headers=AUTH, previous_summary="old")
    assert (result.text, result.calls) == ("old", 0)
    with pytest.raises(SummarizerError):
        await summarizer.summarize([], model="m", headers=AUTH)


def test_config_refuses_a_window_with_no_room() -> None:
    with pytest.raises(ValueError, match="no room"):
        SummarizerConfig(context_window=4000, max_output_tokens=2000)


def test_parse_completion_variants() -> None:
    answer = parse_summary_response(completion("## Goal\nx", 10, 2, "length"))
    assert (answer.text, answer.prompt_tokens, answer.completion_tokens,
            answer.finish_reason) == ("## Goal\nx", 10, 2, "length")
    parts = orjson.dumps({"choices": [{"message": {"content": [
        {"type": "text", "text": "<think>plan it</think>\n## Goal\ny"}]}}]})
    answer = parse_summary_response(parts)
    assert answer.text == "## Goal\ny" and answer.prompt_tokens == 0
    sse = (b'data: {"choices":[{"delta":{"content":"## Go"}}]}\n\n'
           b': keep-alive\n\n'
           b'data: {"choices":[{"delta":{"content":"al\\nz"},"finish_reason":"stop"}]}\n\n'
           b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
           b'data: [DONE]\n\n')
    answer = parse_summary_response(sse)
    assert (answer.text, answer.prompt_tokens, answer.completion_tokens,
            answer.finish_reason) == ("## Goal\nz", 7, 3, "stop")


@pytest.mark.parametrize(("body", "reason"), [
    (b"", "empty body"),
    (b"[1, 2]", "not an object"),
    (b"not json", "not JSON"),
    (b'{"error": {"message": "overloaded"}}', "error object"),
    (b'{"choices": [{"index": 0}]}', "no message"),
    (orjson.dumps({"choices": [{"message": {"content": None, "tool_calls": [{"id": "x"}]}}]}),
     "called a tool"),
    (orjson.dumps({"choices": [{"message": {"content": "<think>only thinking</think>"}}]}),
     "empty"),
    (b'data: {"error": {"message": "boom"}}\n\n', "stream carried an error"),
    (b"data: {broken\n\n", "not JSON"),
])
def test_parse_errors_say_what_is_wrong(body: bytes, reason: str) -> None:
    with pytest.raises(MalformedSummary, match=reason):
        parse_summary_response(body)


async def test_result_wraps_into_a_recognised_summary_message() -> None:
    from proxy.wire.summary import summary_message
    transport = Scripted([(200, completion("## Goal\nkeep `src/a.py:12`"))])
    result = await Summarizer(transport, SummarizerConfig(context_window=32_000), tokens
                              ).summarize(conversation(1), model="m", headers=AUTH)
    assert unwrap_summary(summary_message(result.text)) == "## Goal\nkeep `src/a.py:12`"


async def test_large_tool_outputs_are_sized_as_clipped() -> None:
    messages = conversation(10, size=100_000)  # 10 x 100 KB tool outputs, 10 x 100 KB users
    for m in messages:
        if m["role"] == "user":
            m["content"] = "short question"
    transport = Scripted([(200, completion("## Goal\nx"))])
    config = SummarizerConfig(context_window=32_000, max_output_tokens=2000)
    result = await Summarizer(transport, config, tokens).summarize(
        messages, model="m", headers=AUTH)
    assert result.calls == 1  # sized by the 2000 characters each output is clipped to
    assert len(user_text(transport.sent[0])) < 40_000


async def test_one_message_larger_than_the_window_is_clipped_to_fit() -> None:
    pasted = "START " + "p" * 400_000 + " END"
    messages = [{"role": "user", "content": pasted}, {"role": "assistant", "content": "ok"}]
    transport = Scripted([(200, completion("## Goal\nx")), (200, completion("## Goal\ny"))])
    config = SummarizerConfig(context_window=8000, max_output_tokens=1000,
                              prompt_overhead_tokens=500)
    result = await Summarizer(transport, config, tokens).summarize(
        messages, model="m", headers=AUTH)
    assert result.calls == 2  # the oversized message alone, then the reply
    sent = user_text(transport.sent[0])
    assert "START" in sent and "END" in sent and "characters omitted" in sent
    assert len(sent) // 4 < config.context_window - config.max_output_tokens
