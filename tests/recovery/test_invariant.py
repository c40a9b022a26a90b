"""The compacted request satisfies the design's invariant, for generated conversations.

Runs ``OverflowRecovery.on_error`` in process with a summarizer transport that answers from
memory: system prompt unchanged, one summary, a raw tail that is the original's own suffix and
holds the current turn and (unless trimmed to fit) ``min_tail_messages`` raw messages, tool
exchanges whole, the same bytes for the same inputs, and the stored summary reused.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.model import ChatRequest, Rewrite, UpstreamAnswer
from proxy.recovery.plan import turn_start
from proxy.recovery.stage import OverflowRecovery
from proxy.server.state import ProxyState
from proxy.settings import Settings
from proxy.upstream.pool import Upstream
from proxy.wire.boundary import legal_starts, role_problems
from proxy.wire.summary import unwrap_summary
from tests.fake_behaviour import SUMMARY_TEXT, overflow_error
from tests.recovery.test_plan import conversation

OVERFLOW = UpstreamAnswer(400, "application/json", orjson.dumps({"error": overflow_error(1)}))


class MemorySummarizer:
    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, body: bytes, headers: Mapping[str, str],
                       timeout: float) -> tuple[int, bytes]:  # noqa: ASYNC109
        self.calls += 1
        return 200, orjson.dumps({"choices": [{"message": {"content": SUMMARY_TEXT},
                                               "finish_reason": "stop"}]})


@pytest.fixture(scope="module")
def recovery() -> Iterator[tuple[OverflowRecovery, MemorySummarizer]]:
    with tempfile.TemporaryDirectory() as tmp:
        settings_ = Settings(state=Path(tmp), upstream="http://127.0.0.1:9")
        state = ProxyState(settings=settings_, metrics=Metrics(CollectorRegistry()),
                           upstream=Upstream(settings_.upstream, 1.0, 1.0))
        instance = OverflowRecovery(state)
        transport = MemorySummarizer()
        instance.summaries.transport = transport  # an in-memory summarizer
        instance.open()
        yield instance, transport
        instance.close()


SESSIONS = itertools.count()


def _request(messages: list[dict[str, Any]]) -> ChatRequest:
    body = {"model": "fake-model", "messages": messages, "max_completion_tokens": 64}
    return ChatRequest.parse(orjson.dumps(body), body, None)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 3), min_size=2, max_size=80),
       words=st.integers(5, 400))
def test_compacted_requests_keep_the_invariant(
        recovery: tuple[OverflowRecovery, MemorySummarizer], shape: list[int],
        words: int) -> None:
    instance, transport = recovery
    system = {"role": "system", "content": f"agent {next(SESSIONS)}"}
    body = conversation(shape)
    for message in body:
        if isinstance(message.get("content"), str):
            message["content"] += " lorem ipsum" * words
    messages = [system, *body]
    chat = _request(messages)
    calls = transport.calls
    result = asyncio.run(instance.on_error(chat, Rewrite(body=chat.raw), OVERFLOW, {},
                                           attempt=0))
    if not isinstance(result, Rewrite):
        # a 400 for the agent only when nothing can go: all of it is the current turn, or it
        # is the min_tail floor and fits by our count (the upstream disagreeing, the agent's
        # own recovery takes over)
        estimate = instance._state.tokens.request(chat.body, "o200k_base", 0.2).total
        whole_turn = turn_start(body, legal_starts(body)) == 0
        assert whole_turn or (len(body) <= 30 and estimate <= 8192 - 2048)
        return
    assert result.messages is not None
    sent = list(result.messages)
    assert sent[0] == system
    if result.verdict == "compacted:overflow":
        assert unwrap_summary(sent[1]) == SUMMARY_TEXT.strip()
        assert transport.calls > calls
    tail = sent[2:]
    assert tail == messages[len(messages) - len(tail):]  # the original's own suffix
    assert tail and tail[-1] == messages[-1]
    assert not role_problems(tail)
    assert sum(1 for m in sent if unwrap_summary(m) is not None) <= 1
    # same inputs, same bytes; and now the stored summary is reused, no new call
    calls = transport.calls
    again = asyncio.run(instance.before_send(chat, Rewrite(body=chat.raw), {}))
    if result.verdict == "compacted:overflow":
        assert again.body == result.body and transport.calls == calls


def test_a_bug_in_recovery_costs_the_recovery_not_the_request(
        recovery: tuple[OverflowRecovery, MemorySummarizer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    instance, _ = recovery
    messages = [{"role": "system", "content": "bug"}, *conversation([0, 1] * 40 + [0])]
    chat = _request(messages)
    original = Rewrite(body=chat.raw)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(instance, "_compact", broken)
    monkeypatch.setattr(instance, "_prior", broken)
    assert asyncio.run(instance.before_send(chat, original, {})) is original
    assert asyncio.run(instance.on_error(chat, original, OVERFLOW, {}, attempt=0)) is None
