"""Timings of the compaction building blocks (not a test; run ``python -m tests.recovery.bench``).

Prints p50/p99 of: classifying each provider error body, the prefix chain of a ~100k-token
request, and the store's put / find_for / touch with 10k stored compactions.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.recovery.detect import OverflowDetector
from proxy.recovery.message_chain import prefix_chain
from proxy.recovery.sqlite_store import CompactionStore

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compaction"


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def request(turns: int, tag: str) -> list[dict[str, Any]]:
    """~100k tokens at 4 chars/token when turns=100: user, tool call, 2.4 KB result, reply."""
    out: list[dict[str, Any]] = []
    for n in range(turns):
        out.append({"role": "user", "content": [{"type": "text", "text": f"{tag} turn {n} " * 20}]})
        out.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{tag}_{n}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": f"cat f{n}.py"})}}]})
        out.append({"role": "tool", "tool_call_id": f"call_{tag}_{n}", "content": "x = 1\n" * 400})
        out.append({"role": "assistant", "content": f"done {n} " * 100})
    return out


def main() -> None:
    detector = OverflowDetector()
    cases = json.loads((FIXTURES / "provider_errors.json").read_text())
    bodies = [(c["status"], c["content_type"],
               c["body"].encode() if isinstance(c["body"], str) else json.dumps(c["body"]).encode())
              for c in cases]

    def classify_all() -> None:
        for status, ctype, body in bodies:
            detector.classify_response(status, ctype, body)

    p50, p99 = timed(classify_all, 300)
    print(f"detector: {len(bodies)} bodies, per body p50 {p50 / len(bodies) * 1e6:.1f} us, "
          f"p99 {p99 / len(bodies) * 1e6:.1f} us")

    big = request(100, "live")
    chars = len(json.dumps(big))
    p50, p99 = timed(lambda: prefix_chain(big), 100)
    print(f"prefix_chain: {len(big)} messages, {chars // 4} tokens (chars/4): "
          f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")

    with tempfile.TemporaryDirectory() as tmp:
        store = CompactionStore(Path(tmp), max_total=20_000)
        summary = "## Goal\n" + "s" * 6000
        start = time.perf_counter()
        for n in range(10_000):
            store.put(f"agent:main:s{n % 2000}", request(2, f"r{n}")[: 1 + n % 8], summary, 5000)
        fill = time.perf_counter() - start
        store.put("agent:main:live", big[:300], summary, 75_000)
        print(f"store: 10k puts in {fill:.2f} s ({fill / 10_000 * 1e3:.3f} ms each), "
              f"file {Path(store.path).stat().st_size / 1e6:.1f} MB + wal")
        counter = iter(range(10**9))
        p50, p99 = timed(lambda: store.put(f"agent:main:x{next(counter) % 3000}",
                                           request(1, f"p{next(counter)}"), summary, 10), 500)
        print(f"store.put (10k rows): p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms")
        found = store.find_for(big, "agent:main:live")
        assert found is not None and found.message_count == 300
        p50, p99 = timed(lambda: store.find_for(big, "agent:main:live"), 200)
        print(f"store.find_for ({len(big)}-message ~{chars // 4}-token request, 10k rows): "
              f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
        p50, p99 = timed(lambda: store.touch(found.id), 500)
        print(f"store.touch: p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms")
        store.close()


if __name__ == "__main__":
    main()
