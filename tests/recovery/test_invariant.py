"""The compacted request satisfies the design's invariant, for generated conversations.

Runs ``Recovery.on_error`` in process with a summarizer transport that answers from memory and
checks: the system prompt unchanged, at most one summary (the summarizer's), a raw tail that is
the original's own suffix and ends with the request's last message, no tool exchange cut, the
same bytes for the same inputs, and the stored summary reused without a summarizer call.
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

from proxy.answer import UpstreamAnswer
from proxy.chat import ChatRequest, Draft
from proxy.context import build_context
from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.policy.records import RuleSet
from proxy.recovery.plan import turn_start
from proxy.recovery.request import RecoveryRequest
from proxy.recovery.stage import Recovery
from proxy.tokens import TokenCounter
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


class Rules:
    rules = RuleSet()


TOKENS = TokenCounter()
WINDOWS = LearnedWindows()


async def inline(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The worker pool's seam, run in place."""
    return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def recovery() -> Iterator[tuple[Recovery, MemorySummarizer]]:
    with tempfile.TemporaryDirectory() as tmp:
        transport = MemorySummarizer()
        instance = Recovery(rules=Rules(), tokens=TOKENS,
                            models=ModelFactsResolver(WINDOWS, TokenRatios(), "test"),
                            transport=transport, offload=inline)
        instance.open(Path(tmp))
        yield instance, transport
        asyncio.run(instance.close())


SESSIONS = itertools.count()


def _request(instance: Recovery, messages: list[dict[str, Any]]
             ) -> tuple[ChatRequest, RecoveryRequest]:
    body = {"model": "fake-model", "messages": messages, "max_completion_tokens": 64}
    chat = ChatRequest.parse(orjson.dumps(body), body, None)
    ctx = build_context(chat, {}, Rules.rules, sessions=None,
                        models=ModelFactsResolver(WINDOWS, TokenRatios(), "test"))
    view = instance.view(ctx, Draft(chat.raw))
    assert view is not None
    return chat, view


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 3), min_size=2, max_size=80),
       words=st.integers(5, 400))
def test_compacted_requests_keep_the_invariant(
        recovery: tuple[Recovery, MemorySummarizer], shape: list[int],
        words: int) -> None:
    instance, transport = recovery
    system = {"role": "system", "content": f"agent {next(SESSIONS)}"}
    body = conversation(shape)
    for message in body:
        if isinstance(message.get("content"), str):
            message["content"] += " lorem ipsum" * words
    messages = [system, *body]
    chat, view = _request(instance, messages)
    calls = transport.calls
    step = asyncio.run(instance.on_error(view, None, OVERFLOW, attempt=0))
    result = step.compaction
    if step.action != "retry" or result is None:
        # a 400 for the agent only when nothing can go: all of it is the current turn, or it
        # is the min_tail floor and fits by our count (the upstream disagreeing, the agent's
        # own recovery takes over)
        assert step.action == "reply"
        estimate = TOKENS.request(chat.body, "o200k_base", 0.2).total
        starts = legal_starts(body)
        whole_turn = turn_start(body, starts) == 0
        # the min_tail floor (30 raw messages) reaches back to the first legal cut
        later = [s for s in starts if s > 0]
        floor_covers_all = not later or len(body) - later[0] < 30
        assert whole_turn or (floor_covers_all and estimate <= 8192 - 2048)
        return
    sent = list(result.messages)
    assert sent[0] == system
    if result.label == "compacted:overflow":
        assert unwrap_summary(sent[1]) == SUMMARY_TEXT.strip()
        assert transport.calls > calls
    tail = sent[2:]
    assert tail == messages[len(messages) - len(tail):]  # the original's own suffix
    # Where each sent message came from: the agent's system prompt and tail, the summary
    # between (tailfloor's, standing for every conversation message the tail does not keep).
    origins = result.origins
    assert origins is not None and len(origins) == len(sent)
    words = [o.provenance for o in origins]
    if result.label.startswith("dropped"):
        assert words == ["agent", "inserted", *["agent"] * len(tail)]
    else:
        assert words == ["agent", "summary", *["agent"] * len(tail)]
        assert origins[1].author == "tailfloor" and origins[1].replaced == len(body) - len(tail)
    assert tail and tail[-1] == messages[-1]
    assert not role_problems(tail)
    assert sum(1 for m in sent if unwrap_summary(m) is not None) <= 1
    # same inputs, same bytes; and now the stored summary is reused, no new call
    calls = transport.calls
    again = asyncio.run(instance.before_send(_request(instance, messages)[1]))
    if result.label == "compacted:overflow":
        assert again is not None and again.compaction is not None and again.clamp is None
        assert again.compaction.label == "reused"
        assert again.compaction.body == result.body and transport.calls == calls
