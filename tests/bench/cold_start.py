"""Cold start and idle cost: ``tailfloor serve`` over a sessions root full of Pi transcripts.

    python -m tests.bench.cold_start [--dirs 100] [--per-dir 100] [--idle 30] [--storm N] [--rules]
                                     [--idle-pairs N]

Writes ``dirs`` x ``per_dir`` Pi sessions (~20 messages, ~19 KB each, as a year of an agent's
work looks) into a temporary root, then starts ``python -m proxy serve`` on it and reports:

- ``first_health_s``: from the process start to the first answer of the admin ``/healthz``;
- ``health_max_ms`` / ``health_p99_ms``: its latency, polled every 10 ms, until ready;
- ``ready_s``: until ``/readyz`` answers 200 (the first transcript scan done);
- ``cpu_until_ready_s``: the CPU the process used until then, every thread and the scan
  workers it started (``--scan-workers``), which have ended by then (what the start
  costs whatever else the machine runs: a loaded machine stretches ``ready_s``, not this);
- ``chat_during_indexing``: chat requests sent while not ready: their latency and verdict;
- ``rss_ready_mb``; ``idle_cpu_ms_per_s``: CPU of the process (every thread) over ``idle``
  seconds once ready, with nothing happening;
- with ``--storm N``: N new session files written at once (by another process) into the
  root, ``/healthz`` polled every 10 ms until tailfloor tracks them all, beside its latency
  over the quiet seconds before;
- ``health_process`` (and the storm's ``health_process_during``): the same for the
  ``/healthz`` of the health process (``--health-listen``), probed right before the admin
  one each time, and ``health_process_rss_mb``, its memory;
- with ``--idle-pairs N``: ``idle_cpu_ms_per_s`` of the root full of sessions once ready,
  without the health process and with it, N times each, alternated (what it costs while
  nobody probes).

The baseline, in the same run: the same process over an empty root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.bench.bench_transcripts import session_text
from tests.bench.procs import rss_mb, tree_cpu_ns, tree_cpu_seconds
from tests.bench.watch import child_memory_mb

SESSION_BYTES = 19_000  # ~20 messages in session_text's shape
POLL = 0.01  # seconds between /healthz probes
CHAT = {"model": "gpt-5-mini", "stream": False,
        "messages": [{"role": "user", "content": "hello during the scan"}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def generate(root: Path, dirs: int, per_dir: int) -> int:
    """``dirs`` x ``per_dir`` Pi session files under ``root``; their bytes in all."""
    rng = random.Random(28)
    total = 0
    for d in range(dirs):
        folder = root / f"--home-user-project{d}--"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_dir):
            sid, text = session_text(d * per_dir + i, SESSION_BYTES, rng)
            (folder / f"2026-01-01T00-00-00-000Z_{sid}.jsonl").write_text(text)
            total += len(text)
    return total


async def _probe(http: aiohttp.ClientSession, url: str) -> tuple[int, float] | None:
    began = time.perf_counter()
    try:
        async with http.get(url) as resp:
            await resp.read()
            return resp.status, time.perf_counter() - began
    except aiohttp.ClientError:
        return None


class Probes:
    """One probe URL's answers: when the first came, their latencies, how many were not 200."""

    def __init__(self, url: str, started: float) -> None:
        self.url, self.started = url, started
        self.first: float | None = None
        self.seconds: list[float] = []
        self.not_ok = 0

    async def probe(self, http: aiohttp.ClientSession) -> None:
        got = await _probe(http, self.url)
        if got is None:
            return
        if self.first is None:
            self.first = time.monotonic() - self.started
        self.seconds.append(got[1])
        self.not_ok += got[0] != 200

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.seconds) or [0.0]
        return {"first_s": round(self.first or 0.0, 3), "probes": len(self.seconds),
                "not_200": self.not_ok,
                "p99_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 2),
                "max_ms": round(ordered[-1] * 1000, 2),
                "over_20ms": sum(1 for s in self.seconds if s > 0.02)}


async def _chat(http: aiohttp.ClientSession, port: int) -> dict[str, Any]:
    began = time.perf_counter()
    async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT) as resp:
        await resp.read()
        return {"status": resp.status, "ms": round((time.perf_counter() - began) * 1000, 1),
                "x_tailfloor": resp.headers.get("x-tailfloor")}


async def watch_start(proc: subprocess.Popen[bytes], started: float, port: int, admin: int,
                      *, own: int, give_up: float = 300.0) -> dict[str, Any]:
    """Poll the probes from the process start until ready (the health process's ``/healthz``
    on ``own`` first in each round); a chat request every 0.5 s while not ready (once the
    proxy answers)."""
    own_probes = Probes(f"http://127.0.0.1:{own}/healthz", started)
    health = f"http://127.0.0.1:{admin}/healthz"
    ready = f"http://127.0.0.1:{admin}/readyz"
    first: float | None = None
    latencies: list[float] = []
    stamped: list[tuple[float, float]] = []  # (latency, seconds since the start)
    pending: list[asyncio.Task[dict[str, Any]]] = []
    next_chat = 0.0
    after: list[dict[str, Any]] = []
    ready_at = 0.0
    cpu_ready = 0.0
    timeouts = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeouts) as http:
        while time.monotonic() - started < give_up:
            if proc.poll() is not None:
                raise RuntimeError(f"tailfloor exited with {proc.returncode}")
            await own_probes.probe(http)
            got = await _probe(http, health)
            if got is None:
                await asyncio.sleep(POLL)
                continue
            first = first if first is not None else time.monotonic() - started
            latencies.append(got[1])
            stamped.append((got[1], time.monotonic() - started))
            answered = await _probe(http, ready)
            if answered is not None and answered[0] == 200:
                ready_at = time.monotonic() - started
                cpu_ready = tree_cpu_seconds(proc.pid)
                # The same request once ready, twice: the first request's own cost (a new
                # upstream connection) apart from indexing's.
                after = [await _chat(http, port) for _ in range(2)]
                break
            if time.monotonic() >= next_chat:
                # Beside the probes, not between them: a stall shows in both.
                pending.append(asyncio.create_task(_chat(http, port)))
                next_chat = time.monotonic() + 0.5
            await asyncio.sleep(POLL)
        else:
            raise RuntimeError("tailfloor was not ready in time")
        chats = list(await asyncio.gather(*pending))
    latencies.sort()
    return {"chat_after_ready_ms": [c["ms"] for c in after],
            "first_health_s": round(first or 0.0, 3),
            "ready_s": round(ready_at, 3),
            "cpu_until_ready_s": round(cpu_ready, 2),
            "health_probes": len(latencies),
            "health_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
            "health_max_ms": round(latencies[-1] * 1000, 2),
            "health_worst_at_s": [round(at, 2) for _l, at in sorted(stamped)[-5:]],
            "health_process": own_probes.summary(),
            "chat_during_indexing": {
                "count": len(chats),
                "ms": [c["ms"] for c in chats],
                "verdicts": sorted({str(c["x_tailfloor"]) for c in chats}),
                "statuses": sorted({c["status"] for c in chats})}}


def write_storm(root: Path, count: int) -> None:
    """``count`` new Pi sessions (small, 100 to a new folder) as fast as they can be written:
    run in a process of its own, so the writing does not slow the probing."""
    rng = random.Random(4)
    for n in range(count):
        folder = root / f"--home-user-storm{n // 100}--"
        folder.mkdir(parents=True, exist_ok=True)
        sid, text = session_text(900_000 + n, 2500, rng)
        (folder / f"2026-02-01T00-00-00-000Z_{sid}.jsonl").write_text(text)


async def storm(root: Path, admin: int, own: int, count: int, quiet: float = 2.0
                ) -> dict[str, Any]:
    """/healthz every 10 ms for ``quiet`` s (the baseline), then while ``count`` new
    session files appear and until tailfloor tracks them all; the health process's right
    before each."""
    health = f"http://127.0.0.1:{admin}/healthz"
    own_probes = Probes(f"http://127.0.0.1:{own}/healthz", time.monotonic())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        before: list[float] = []
        ends = time.monotonic() + quiet
        while time.monotonic() < ends:
            got = await _probe(http, health)
            before.append(got[1] if got else float("inf"))
            await asyncio.sleep(POLL)
        tracked = await _tracked(http, admin)
        began = time.monotonic()
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.bench.cold_start", "--write-storm", str(root),
            "--dirs", "0", "--per-dir", str(count))
        during: list[float] = []
        written = None
        while time.monotonic() - began < 300:
            await own_probes.probe(http)
            got = await _probe(http, health)
            during.append(got[1] if got else float("inf"))
            if written is None and writer.returncode is not None:
                written = time.monotonic() - began
            if written is not None and len(during) % 20 == 0 and \
                    await _tracked(http, admin) >= tracked + count:
                break
            await asyncio.sleep(POLL)
        await writer.wait()
        ended = time.monotonic()
        # Files the storm wrote that tailfloor does not track (300 s after the start).
        missed = max(0, round(tracked + count - await _tracked(http, admin)))
    return {"files": count, "written_s": round(written or 0.0, 2),
            "tracked_s": round(ended - began, 2), "not_tracked": missed,
            "health_max_ms_before": round(max(before) * 1000, 2),
            "health_max_ms_during": round(max(during) * 1000, 2),
            "health_p99_ms_during": round(sorted(during)[int(len(during) * 0.99)] * 1000, 2),
            "over_20ms_during": sum(1 for d in during if d > 0.02),
            "health_process_during": own_probes.summary()}


async def _tracked(http: aiohttp.ClientSession, admin: int) -> float:
    async with http.get(f"http://127.0.0.1:{admin}/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tailfloor_sessions{"))


def idle_cpu(pid: int, seconds: float) -> float:
    """CPU milliseconds per second the process used over ``seconds`` of doing nothing."""
    time.sleep(2.0)  # what readiness set going (gauges, the first timers) settles
    before = tree_cpu_ns(pid)
    time.sleep(seconds)
    return (tree_cpu_ns(pid) - before) / 1e6 / seconds


def idle_pairs(root: Path, upstream: int, pairs: int, seconds: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"without_health_process": [], "with_health_process": []}
    for _ in range(pairs):
        for name, figures in out.items():
            extra = ("--health-listen", f"127.0.0.1:{free_port()}") \
                if name == "with_health_process" else ()
            with serving(root, upstream, *extra) as (proc, _port, admin):
                began = time.monotonic()
                while not _answers(f"http://127.0.0.1:{admin}/readyz"):
                    if proc.poll() is not None or time.monotonic() - began > 300:
                        raise RuntimeError("tailfloor was not ready in time")
                    time.sleep(0.1)
                figures.append(round(idle_cpu(proc.pid, seconds), 3))
    return out


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@contextmanager
def serving(root: Path, upstream: int, *extra: str
            ) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """``tailfloor serve`` on ``root`` in front of the fake upstream at ``upstream``: the
    process, its port and its admin port; stopped afterwards. (``--health-listen`` in
    ``extra`` adds the health process.)"""
    port, admin = free_port(), free_port()
    proc = subprocess.Popen([
        sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
        "--admin-listen", f"127.0.0.1:{admin}", "--upstream", f"http://127.0.0.1:{upstream}",
        "--sessions", str(root), "--log-level", "WARNING", *extra])
    try:
        yield proc, port, admin
    finally:
        proc.terminate()
        proc.wait(30)


def sessions_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a benchmark over generated sessions (``generate``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--dirs", type=int, default=100)
    parser.add_argument("--per-dir", type=int, default=100)
    return parser


@contextmanager
def fake_upstream(prefix: str) -> Iterator[tuple[Path, int]]:
    """A scratch directory and the fake upstream's port, both gone afterwards."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    port = free_port()
    upstream = subprocess.Popen([sys.executable, "tests/fake_upstream.py", "--port", str(port)],
                                stdout=subprocess.DEVNULL)
    try:
        yield work, port
    finally:
        upstream.terminate()
        upstream.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def run_one(root: Path, upstream: int, idle: float, storm_files: int = 0,
            rules: Path | None = None) -> dict[str, Any]:
    started = time.monotonic()
    own = free_port()
    with serving(root, upstream, "--tailfloor-header", "detailed",
                 "--health-listen", f"127.0.0.1:{own}",
                 *(["--rules", str(rules)] if rules is not None else [])) as (proc, port, admin):
        out = asyncio.run(watch_start(proc, started, port, admin, own=own))
        out["rss_ready_mb"] = round(rss_mb(proc.pid), 1)
        out["health_process_rss_mb"] = round(child_memory_mb(proc.pid), 1)
        if idle > 0:
            out["idle_cpu_ms_per_s"] = round(idle_cpu(proc.pid, idle), 2)
        if storm_files > 0:
            out["storm"] = asyncio.run(storm(root, admin, own, storm_files))
        return out


def main() -> None:
    parser = sessions_parser(__doc__ or "")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measure")
    parser.add_argument("--storm", type=int, default=0,
                        help="then this many new session files at once (target 4)")
    parser.add_argument("--rules", action="store_true",
                        help="serve with a rules directory too (its watcher's idle cost)")
    parser.add_argument("--idle-pairs", type=int, default=0,
                        help="then idle CPU without and with the health process, N each")
    parser.add_argument("--write-storm", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_storm is not None:
        write_storm(args.write_storm, args.per_dir)
        return
    with fake_upstream("tailfloor-cold-") as (work, upstream_port):
        empty, full = work / "empty", work / "full"
        empty.mkdir()
        rules = None
        if args.rules:
            rules = work / "rules"
            rules.mkdir()
            (rules / "floor.toml").write_text("[defaults]\nmin_tail_messages = 20\n")
        began = time.monotonic()
        size = generate(full, args.dirs, args.per_dir)
        print(f"wrote {args.dirs * args.per_dir} sessions, {size / 1e6:.0f} MB in "
              f"{time.monotonic() - began:.1f} s", file=sys.stderr)
        result = {"sessions": args.dirs * args.per_dir, "bytes": size,
                  "rules_directory": args.rules,
                  "baseline_empty_root": run_one(empty, upstream_port, args.idle, rules=rules),
                  "with_sessions": run_one(full, upstream_port, args.idle, args.storm, rules)}
        if args.idle_pairs > 0:
            result["idle_pairs"] = idle_pairs(full, upstream_port, args.idle_pairs, args.idle)
        print(json.dumps(result, indent=2))

if __name__ == "__main__":
    main()
