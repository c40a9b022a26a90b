"""Benchmark: what overflow recovery costs the proxy itself.

1. Applying a stored compaction to a ~100k-token request (``before_send``: prefix lookup in
   the SQLite store, the token estimate for preflight, the new body): first sight of the
   request (token counts not cached yet) and steady state (an agent resending its history).
2. A full recovery (``on_error``: detection, cut, summarizer call, store write, new body),
   with the summarizer answering at once from memory, so what is left is tailfloor's share;
   the time inside the summarizer transport is measured and subtracted.

Usage: python tests/bench/bench_overflow.py [--runs N] [--check]
(--check exits 1 when the steady-state p50 of 1. is above 5 ms.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dataclasses import replace

import orjson

from proxy.answer import UpstreamAnswer
from proxy.chat import ChatRequest, Draft
from proxy.context import build_context
from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.identity.lineage import Lineage
from proxy.policy.records import RuleSet
from proxy.recovery.request import RecoveryRequest
from proxy.recovery.stage import Recovery
from proxy.tokens import TokenCounter
from tests.fake_behaviour import SUMMARY_TEXT, overflow_error

HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}


def conversation(turns: int, tag: str) -> list[dict[str, Any]]:
    """About 1k tokens (4 KB) a turn: user, tool call, 2.4 KB of code as its result, reply."""
    out: list[dict[str, Any]] = []
    for n in range(turns):
        out.append({"role": "user", "content": [{"type": "text", "text": f"{tag} turn {n} " * 20}]})
        out.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{tag}_{n}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": f"cat f{n}.py"})}}]})
        out.append({"role": "tool", "tool_call_id": f"call_{tag}_{n}", "content": "".join(
            f"    value_{i} = compute(value_{i - 1}, factor={i})  # step {i} of {tag}\n"
            for i in range(28))})
        out.append({"role": "assistant", "content": f"done {n} " * 100})
    return out


def chat(system: str, messages: list[dict[str, Any]]) -> ChatRequest:
    body = {"model": "gpt-4o", "stream": True, "max_completion_tokens": 4096,
            "messages": [{"role": "system", "content": system}, *messages]}
    raw = orjson.dumps(body)
    return ChatRequest.parse(raw, body, None)


class InstantSummarizer:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._answer = orjson.dumps({"choices": [{"message": {"role": "assistant",
                                                              "content": SUMMARY_TEXT},
                                                  "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    async def complete(self, body: bytes, headers: Mapping[str, str],
                       timeout: float) -> tuple[int, bytes]:  # noqa: ASYNC109
        started = time.perf_counter()
        self.calls += 1
        orjson.loads(body)  # what a real transport's peer would have to do at least
        self.seconds += time.perf_counter() - started
        return 200, self._answer


def percentiles(samples: list[float]) -> str:
    samples = sorted(samples)
    p99 = samples[max(0, int(len(samples) * 0.99) - 1)]
    return f"p50 {statistics.median(samples) * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"


class Rules:
    rules = RuleSet()


async def inline(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def view_of(recovery: Recovery, request: ChatRequest, windows: LearnedWindows,
            session: str | None = None) -> RecoveryRequest:
    ctx = build_context(request, HEADERS, Rules.rules, sessions=None,
                        models=ModelFactsResolver(windows, TokenRatios(), "bench"))
    if session is not None:
        ctx = replace(ctx, lineage=Lineage("header", session_id=session, trusted=True))
    found = recovery.view(ctx, Draft(request.raw))
    assert found is not None
    return found


async def main(runs: int, check: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tokens = TokenCounter()
        tokens.encodings.get("o200k_base")
        windows = LearnedWindows()
        transport = InstantSummarizer()  # no network in a bench
        recovery = Recovery(rules=Rules(), tokens=tokens,
                            models=ModelFactsResolver(windows, TokenRatios(), "bench"),
                            transport=transport, offload=inline)
        recovery.open(Path(tmp))
        messages = conversation(100, "bench")  # ~100k tokens
        request = chat("You are a coding agent.", messages)
        counted = tokens.request(request.body, "o200k_base").total
        # a stored summary of the first 380 messages, as a recovery would leave it
        store = recovery._store
        assert store is not None
        session = "bench-session"
        store.put(session, messages[:380], SUMMARY_TEXT, 90000)
        recovery._sessions.add(session)  # what a recovery's own put does

        recovery._tokens = TokenCounter(tokens.encodings)  # cold token cache
        started = time.perf_counter()
        applied = await recovery.before_send(view_of(recovery, request, windows, session))
        first = time.perf_counter() - started
        assert applied is not None and applied.compaction is not None, applied
        assert applied.compaction.label == "reused", applied
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            await recovery.before_send(view_of(recovery, request, windows, session))
            samples.append(time.perf_counter() - started)
        print(f"apply a stored compaction to a {len(messages)}-message, {counted}-token "
              f"request ({len(request.raw) / 1e6:.2f} MB): first sight {first * 1e3:.2f} ms; "
              f"steady state {percentiles(samples)} over {runs} runs")
        steady_p50 = statistics.median(samples)
        other = chat("You are another agent.", messages)
        await recovery.before_send(view_of(recovery, other, windows))  # counts cached
        passes = []
        kept = None
        for _ in range(runs):
            started = time.perf_counter()
            kept = await recovery.before_send(view_of(recovery, other, windows))
            passes.append(time.perf_counter() - started)
        assert kept is None
        print(f"the same request in a session with nothing stored (preflight estimate only): "
              f"{percentiles(passes)}")

        # as if the window were 64k: the recovery summarizes ~60k tokens in one call
        error = overflow_error(400000)
        error["message"] = error["message"].replace("8192", "64000")
        overflow = UpstreamAnswer(400, "application/json", orjson.dumps({"error": error}))
        shares = []
        for n in range(max(10, runs // 10)):
            # a new session each time (else the stored compaction is simply reused)
            fresh = chat(f"You are coding agent number {n}.", messages)
            transport.seconds = 0.0
            started = time.perf_counter()
            step = await recovery.on_error(view_of(recovery, fresh, windows), None, overflow,
                                           attempt=0)
            total = time.perf_counter() - started
            assert step.compaction is not None
            assert step.compaction.label == "compacted:overflow", step.compaction.label
            shares.append(total - transport.seconds)
        print(f"full recovery of the same request, summarizer excluded ({transport.calls} "
              f"summarizer calls in all): {percentiles(shares)} over {len(shares)} runs")
        await recovery.close()
    if check and steady_p50 > 0.005:
        print("FAIL: applying a stored compaction takes over 5 ms (p50)")
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.runs, args.check)))
