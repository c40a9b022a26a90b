"""Profile tailfloor under load: where its own CPU goes, by function.

Starts the fake upstream and tailfloor, attaches py-spy (installed on demand into the
benchmark cache, tests/bench/peers.py) to tailfloor for each load in turn and prints, per
load, the top entries by own time (samples whose innermost Python frame is that function)
with their share of the load's samples and their inclusive share:

- ``c1``: non-streaming requests back to back on one connection;
- ``stream``: streams of 250 events, four at a time;
- ``restored`` (with ``--restored N``): N agent sessions after a compaction, each request
  identified and restored from the transcripts (tests/bench/sessions_scale.py).

py-spy samples from outside the process (no instrumentation in the measured path). Only
samples of a thread holding the GIL count (py-spy takes threads blocked in a native wait,
such as a thread pool's or the file watcher's, for busy ones), so shares are of tailfloor's
busy Python time. Time in C code (uvloop, aiohttp's parsers, orjson) and in the kernel's
socket calls is charged to the innermost Python frame: uvloop's loop shows as
``Runner.run``; ``--native`` names the C frames too.

Usage: python tests/bench/profile_proxy.py [--requests 3000] [--streams 24] [--restored 50]
           [--top 25] [--native] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import peers, sessions_scale
from tests.bench.bench_proxy import script_stream_replies, start_tailfloor
from tests.bench.loadgen import BODY, measure_latency, measure_stream
from tests.bench.peers import Services, wait_http
from tests.bench.procs import settle
from tests.conftest import free_port

_SITE = re.compile(r"^.*/(?:site|dist)-packages/")


def short(frame: str) -> str:
    """``name (path)`` with the path made short: site-packages and this checkout dropped."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    where = _SITE.sub("", where).replace(str(peers.ROOT) + "/", "")
    return f"{name} ({where})" if where else name


def top_entries(raw: str, top: int) -> tuple[int, list[tuple[str, int, int]]]:
    """From py-spy's raw (collapsed) output: total samples and, for the ``top`` functions by
    own samples, (function, own, inclusive)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [short(f) for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return total, [(name, n, inclusive[name]) for name, n in own.most_common(top)]


class Recording:
    """py-spy attached to one process until ``stop()``; the raw samples in ``path``."""

    def __init__(self, py_spy: Path, pid: int, path: Path, *, native: bool, rate: int,
                 gil: bool) -> None:
        argv = [str(py_spy), "record", "--pid", str(pid), "--format", "raw", "--nolineno",
                "--rate", str(rate), "--output", str(path)]
        if native:
            argv.append("--native")
        if gil:
            argv.append("--gil")
        self.path = path
        self.log = path.with_suffix(".log")
        self.proc = subprocess.Popen(argv, stdout=self.log.open("wb"),
                                     stderr=subprocess.STDOUT)
        time.sleep(1.0)  # attached and sampling
        if self.proc.poll() is not None:
            raise peers.SetupError(f"py-spy exited: {self.log.read_text()[-500:]}")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        return self.path.read_text() if self.path.exists() else ""


def print_top(label: str, raw: str, top: int, seconds: float) -> None:
    total, entries = top_entries(raw, top)
    print(f"\n{label}: {total} busy samples over {seconds:.1f} s")
    print(f"{'own':>7} {'incl':>7}  function")
    for name, own, inclusive in entries:
        print(f"{own / total:>7.1%} {inclusive / total:>7.1%}  {name}")


async def restored_load(upstream_port: int, port: int, generated: list[sessions_scale.Session],
                        ) -> None:
    sessions = [sessions_scale.session_copy(s) for s in generated]
    sessions_scale.script_replies(upstream_port, len(sessions) * 3, 40, 0.005)
    await sessions_scale.phase(port, sessions, 3, 0.05, write=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="c1 requests")
    parser.add_argument("--streams", type=int, default=24, help="streams of 250 events")
    parser.add_argument("--restored", type=int, default=0, metavar="N",
                        help="also profile N restored sessions (3 turns each)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--native", action="store_true", help="include C extension frames")
    parser.add_argument("--all-threads", action="store_true",
                        help="samples of threads not holding the GIL too (py-spy counts "
                             "threads blocked in native waits as busy)")
    parser.add_argument("--out", type=Path, help="keep the raw profiles here")
    args = parser.parse_args()
    try:
        py_spy = peers.ensure_py_spy()
    except peers.SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="tailfloor-profile-"))
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    services = Services(work)
    try:
        upstream_port = free_port()
        upstream = services.start([sys.executable, "tests/fake_upstream.py", "--port",
                                   str(upstream_port)], "upstream")
        wait_http(f"http://127.0.0.1:{upstream_port}/v1/models", 15, upstream)
        extra: list[str] = []
        generated: list[sessions_scale.Session] = []
        if args.restored:
            root = work / "sessions"
            generated = sessions_scale.generate(root, args.restored, args.restored + 1000)
            extra = ["--sessions", str(root)]
        target, _admin = start_tailfloor(services, upstream_port, extra=extra)

        async def warm() -> None:
            await measure_latency(target.port, BODY, 1, 200)
            if generated:
                sessions_scale.script_replies(upstream_port, 1, 10, 0.0)
                await measure_stream(target.port, orjson.dumps(generated[-1].body))

        asyncio.run(warm())
        settle(target.pid)  # a tokenizer table loads in a thread on first use
        loads: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            (f"c1: {args.requests} non-streaming requests back to back",
             lambda: measure_latency(target.port, BODY, 1, args.requests)),
            (f"stream: {args.streams} streams of 250 events, 4 at a time",
             lambda: streams(upstream_port, target.port, args.streams)),
        ]
        if generated:
            loads.append((f"restored: {args.restored} sessions x 3 turns, each restored",
                          lambda: restored_load(upstream_port, target.port, generated[:-1])))
        for number, (label, load) in enumerate(loads):
            recording = Recording(py_spy, target.pid, out / f"profile-{number}.txt",
                                  native=args.native, rate=args.rate, gil=not args.all_threads)
            began = time.perf_counter()
            asyncio.run(run_load(load))
            seconds = time.perf_counter() - began
            print_top(label, recording.stop(), args.top, seconds)
    finally:
        services.stop()
    print(f"\n(raw profiles in {out})")
    return 0


async def run_load(load: Callable[[], Awaitable[Any]]) -> None:
    await load()


async def streams(upstream_port: int, port: int, count: int) -> None:
    script_stream_replies(upstream_port, count, 250, 0.001)
    for start in range(0, count, 4):
        await asyncio.gather(*(measure_stream(port) for _ in range(min(4, count - start))))


if __name__ == "__main__":
    sys.exit(main())
