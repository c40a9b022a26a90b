"""Timings of the floor's pure parts: ``python -m tests.floor.bench_parts``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from proxy.identity.identify import identify
from proxy.policy.records import builtin_rules
from proxy.tokens import TokenCounter
from proxy.wire.boundary import fit_start, legal_starts, tail_start
from tests.floor.conversation import conversation, openclaw_request


def percentiles(samples: tuple[list[float], list[float]]) -> str:
    """Wall-clock and CPU-time p50/p99 (CPU time is steadier on a busy machine)."""
    parts = []
    for label, values in zip(("wall", "cpu"), samples, strict=True):
        ordered = sorted(values)
        p50 = statistics.median(ordered)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        parts.append(f"{label} p50 {p50 * 1e3:.3f} ms p99 {p99 * 1e3:.3f} ms")
    return "  ".join(parts) + f"  (n={len(samples[0])})"


def timed(fn: Callable[[], object], runs: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return wall, cpu


def bench_tokens() -> None:
    convo = conversation(500, words_per_message=215)
    body = {"messages": convo, "max_completion_tokens": 4096}
    counter = TokenCounter()
    counter.encodings.get("o200k_base")  # table load is a one-time start-up cost
    start = time.perf_counter()
    counted = counter.request(body, "o200k_base")
    cold = time.perf_counter() - start
    print(f"tokens: 500 messages, {counted.messages} tokens; cold count {cold * 1e3:.1f} ms")
    print("tokens: warm count (all cache hits)", percentiles(
        timed(lambda: counter.request(body, "o200k_base"), 300)))
    start = time.perf_counter()
    TokenCounter().encodings.get("o200k_base")
    print(f"tokens: loading o200k_base from the bundled table {time.perf_counter() - start:.2f} s")


def bench_identify() -> None:
    body = openclaw_request(500, words_per_message=215)
    headers = {"Content-Type": "application/json", "User-Agent": "OpenAI/JS 7.15.0",
               "traceparent": "00-513c515d8b9b3db6dde50b719848d0e3-cca6df2ac0d16bfd-01"}
    found = identify(None, headers, body)
    assert found.session_id and found.summary_index == 1, found
    print(f"identify: 500-message OpenClaw-style request ({found.raw_after_summary} raw after "
          "the summary)", percentiles(timed(lambda: identify(None, headers, body), 2000)))


def bench_boundary() -> None:
    convo = conversation(500, words_per_message=215)
    costs = TokenCounter().per_message(convo, "o200k_base")

    def cut() -> None:
        starts = legal_starts(convo)
        start = tail_start(convo, 30, starts=starts)
        fit_start(costs, 20000, starts, lo=0)
        assert start > 0

    print("boundary: legal starts + tail of 30 + budget fit, 500 messages",
          percentiles(timed(cut, 500)))


def bench_rules() -> None:
    rules = builtin_rules()
    rules.resolve("main", "gpt-4o", "agent:main:main")
    print("rules: resolve (cached) + model lookup", percentiles(timed(
        lambda: (rules.resolve("main", "gpt-4o", "agent:main:main"), rules.model("gpt-4o")),
        5000)))


def main() -> None:
    bench_tokens()
    bench_identify()
    bench_boundary()
    bench_rules()


if __name__ == "__main__":
    main()
