"""The floor's decision for a session nothing is kept of yet: the cold burst's unit of work.

    python -m tests.bench.cold_floor [--sessions 300] [--busy-loop] [--long-pins]

Writes ``sessions`` active agent sessions as ``sessions_scale`` does (compacted Pi
conversations, ~70 messages to restore from, identified by content), tracks them in a
``Catalog`` with the thousand-agents run's cache size (192 MiB), then decides each one's
request once, cold (nothing rendered, counted or pinned yet), then once more, warm. Prints
CPU and wall time per decision.

``--busy-loop``: the cold decisions run in a thread of their own while the main thread
does what a busy event loop does to it (Python for 2 ms, then 0.5 ms of rest, with the
server's switch interval of 1 ms): every system call of the floor's thread lets go of the
interpreter's lock, and taking it back waits for the loop.

``--long-pins``: the first read of the pins of nine sessions of 4,000 messages (one pin
each), as a session's first request after a start pays it.

It runs against any tree with these classes, so a tree before a change is measured with
the same script: ``git archive`` it elsewhere and run this file from there.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson

from proxy.chat import ChatRequest
from proxy.floor.pin_index import PinIndex
from proxy.policy.records import Policy, builtin_rules
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.jsonl import JsonlTranscript
from proxy.transcripts.records import SessionInfo
from tests.bench.sessions_scale import active_session
from tests.floor.conversation import text
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import Holder, Transcript, chat

CACHE_BYTES = 192 * 1024 * 1024


def _catalog(paths: list[tuple[str, Path]]) -> Catalog:
    catalog = Catalog(tail_limit=1000, cache_bytes=CACHE_BYTES)
    for sid, path in paths:
        store = JsonlTranscript.open(path, lambda *a: None)
        info = SessionInfo(session_id=sid, source="pi", era="pi", location="bench",
                           agent_id="pi", group=str(path.parent))
        catalog.put(info, store, store.read_window(None))
    catalog.relink()
    return catalog


def _busy(stop: threading.Event) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.002:
            pass
        time.sleep(0.0005)


def decisions(root: Path, count: int, busy_loop: bool) -> None:
    sessions = [active_session(root, i) for i in range(count)]
    catalog = _catalog([(s.transcript.session_id, s.path) for s in sessions])
    tokens = TokenCounter()
    tokens.encodings.get("o200k_base")
    harness = FloorHarness(Holder(builtin_rules()), tokens, catalog)
    requests: list[ChatRequest] = [chat(s.body) for s in sessions]
    walls: list[float] = []
    cpu = [0.0]
    restored = [0]

    def cold() -> None:
        start_cpu = time.thread_time()
        for request in requests:
            start = time.perf_counter()
            decision = harness.decide(request, {})
            walls.append(time.perf_counter() - start)
            restored[0] += "restored" in decision.verdict
        cpu[0] = time.thread_time() - start_cpu

    stop = threading.Event()
    loop = threading.Thread(target=_busy, args=(stop,)) if busy_loop else None
    interval = sys.getswitchinterval()
    try:
        if loop is not None:
            sys.setswitchinterval(0.001)  # the server's
            loop.start()
        lane = threading.Thread(target=cold)
        lane.start()
        lane.join()
    finally:
        stop.set()
        if loop is not None:
            loop.join()
        sys.setswitchinterval(interval)
    walls.sort()
    print(f"cold, {count} sessions ({restored[0]} restored){' beside a busy loop' * busy_loop}:"
          f" CPU {cpu[0] * 1e3 / count:.2f} ms a decision; wall mean "
          f"{statistics.fmean(walls) * 1e3:.2f}, p50 {walls[len(walls) // 2] * 1e3:.2f}, "
          f"p99 {walls[int(len(walls) * 0.99)] * 1e3:.2f} ms")
    start_cpu = time.thread_time()
    for request in requests:
        harness.decide(request, {})
    print(f"warm: CPU {(time.thread_time() - start_cpu) * 1e3 / count:.2f} ms a decision")


def long_pins(root: Path) -> None:
    rng = random.Random(5)
    paths: list[tuple[str, Path]] = []
    for n in range(10):
        t = Transcript(f"long{n:04d}-0000")
        for turn in range(2000):
            t.user(("!pin keep the schema " if turn == 77 else "") + text(rng, 40))
            t.assistant(text(rng, 80))
        path = root / f"2026-11-30T02-00-00-000Z_{t.session_id}.jsonl"
        header = {"type": "session", "version": 3, "id": t.session_id,
                  "timestamp": "2026-11-30T02:00:00.000Z", "cwd": "/w"}
        path.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in [header, *t.objs]))
        paths.append((t.session_id, path))
    index = PinIndex(_catalog(paths))
    policy = Policy()
    index.own(paths[0][0], policy)  # the first one pays for imports and tables
    times: list[float] = []
    for sid, _path in paths[1:]:
        start = time.perf_counter()
        found = index.own(sid, policy)
        times.append(time.perf_counter() - start)
        assert len(found.pins) == 1, found
    size = paths[-1][1].stat().st_size
    print(f"first pin read of a 4,000-message session ({size // 1024} KB): median "
          f"{statistics.median(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--busy-loop", action="store_true")
    parser.add_argument("--long-pins", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cold-floor-") as tmp:
        if args.long_pins:
            long_pins(Path(tmp))
        else:
            decisions(Path(tmp), args.sessions, args.busy_loop)


if __name__ == "__main__":
    main()
