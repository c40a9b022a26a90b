"""Timings of the floor's pure parts: ``python -m tests.floor.bench_parts``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from proxy.tokens import TokenCounter
from tests.floor.conversation import conversation


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50 * 1e3:.3f} ms  p99 {p99 * 1e3:.3f} ms  (n={len(ordered)})"


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


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


def main() -> None:
    bench_tokens()


if __name__ == "__main__":
    main()
