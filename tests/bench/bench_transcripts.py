"""Benchmark: follow many generated transcripts; time to ready, RSS, append-to-view latency.

usage: python tests/bench/bench_transcripts.py [--sessions 10000] [--total-mb 1024]
                                               [--appends 200] [--dir DIR] [--keep]

Generates ``--sessions`` Pi-style session files totalling about ``--total-mb`` MiB (spread
over directories of 100 files, realistic turns: user text, tool calls, large tool results,
replies), starts a TranscriptService over them, then appends one line at a time to random
files and measures how long until ``catalog.tail`` shows it. Prints a table and a JSON
line. Targets (issue 3): ready <= 5 s, RSS <= 200 MB, append-to-view p99 <= 100 ms.
It is a script, not a test: ``--sessions 500 --total-mb 50`` is a quick run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy.metrics import Metrics
from proxy.transcripts.service import TranscriptService
from tests.transcripts.waiting import until

FILLER = ("The quick brown fox jumps over the lazy dog while the build runs its tests; "
          "lines of output scroll past, some warnings, mostly passing. ")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _entry(kind: str, eid: str, parent: str | None, ts: str, **body: object) -> str:
    return json.dumps({"type": kind, "id": eid, "parentId": parent, "timestamp": ts, **body},
                      separators=(",", ":")) + "\n"


def session_text(n: int, size: int, rng: random.Random) -> tuple[str, str]:
    """One session file of about ``size`` bytes; returns (session id, text)."""
    sid = f"{n:08x}-0000-4000-8000-{rng.getrandbits(48):012x}"
    ts = "2026-11-30T02:00:00.000Z"
    out = [json.dumps({"type": "session", "version": 3, "id": sid, "timestamp": ts,
                       "cwd": f"/home/user/project{n % 100}"}) + "\n",
           _entry("model_change", "m0", None, ts, provider="p", modelId="model")]
    parent, total, turn = "m0", 0, 0
    while total < size:
        turn += 1
        u, a, r, f = (f"u{turn}", f"a{turn}", f"r{turn}", f"f{turn}")
        call = f"call_{n:06x}{turn:04x}{rng.getrandbits(24):06x}"
        result = FILLER * rng.randint(10, 60)
        lines = [
            _entry("message", u, parent, ts, message={
                "role": "user", "content": [{"type": "text",
                                             "text": f"Session {n} turn {turn}: please check"}],
                "timestamp": 1796004000000}),
            _entry("message", a, u, ts, message={
                "role": "assistant", "content": [{"type": "toolCall", "id": call, "name": "bash",
                                                  "arguments": {"command": f"make test {turn}"}}],
                "stopReason": "toolUse", "provider": "p", "model": "model"}),
            _entry("message", r, a, ts, message={
                "role": "toolResult", "toolCallId": call, "toolName": "bash",
                "content": [{"type": "text", "text": result}], "isError": False}),
            _entry("message", f, r, ts, message={
                "role": "assistant", "content": [{"type": "text", "text": FILLER * 4}],
                "stopReason": "stop", "provider": "p", "model": "model"}),
        ]
        out.extend(lines)
        total += sum(len(x) for x in lines)
        parent = f
    return sid, "".join(out)


def generate(root: Path, sessions: int, total_mb: int) -> list[tuple[str, Path]]:
    rng = random.Random(7)
    per_file = total_mb * 2**20 // sessions
    made: list[tuple[str, Path]] = []
    for n in range(sessions):
        folder = root / f"--home-user-project{n // 100}--"
        folder.mkdir(parents=True, exist_ok=True)
        sid, text = session_text(n, per_file, rng)
        path = folder / f"2026-11-30T02-00-00-000Z_{sid}.jsonl"
        path.write_text(text)
        made.append((sid, path))
    return made


def _shows(svc: TranscriptService, sid: str, eid: str) -> bool:
    tail = svc.catalog.tail(sid, 1)
    return bool(tail) and tail[0].entry_id == eid


async def measure(root: Path, made: list[tuple[str, Path]], appends: int) -> dict[str, float]:
    rss_before = _rss_mb()
    began = time.perf_counter()
    svc = TranscriptService([root], Metrics(), tail_limit=200)
    await svc.start()
    ready = time.perf_counter() - began
    rss_ready = _rss_mb()
    rng = random.Random(11)
    lat: list[float] = []
    for i in range(appends):
        sid, path = made[rng.randrange(len(made))]
        last = svc.catalog.tail(sid, 1)
        parent = last[0].entry_id if last else None
        eid = f"bench{i}"
        line = _entry("message", eid, parent, "2026-11-30T03:00:00.000Z", message={
            "role": "user", "content": [{"type": "text", "text": f"appended {i}"}],
            "timestamp": 1796007600000})
        t0 = time.perf_counter()
        with path.open("a") as f:
            f.write(line)
        ok = await until(functools.partial(_shows, svc, sid, eid), 2.0)
        lat.append((time.perf_counter() - t0) if ok else float("inf"))
        await asyncio.sleep(0.01)
    await svc.stop()
    lat.sort()
    return {
        "sessions": float(len(svc.catalog)), "ready_s": ready, "rss_mb": rss_ready,
        "rss_growth_mb": rss_ready - rss_before,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "append_p50_ms": 1000 * statistics.median(lat),
        "append_p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "append_max_ms": 1000 * lat[-1], "appends": float(len(lat)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--total-mb", type=int, default=1024)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None, help="where to generate (temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="tailfloor-bench-"))
    try:
        t0 = time.perf_counter()
        made = generate(root, args.sessions, args.total_mb)
        size = sum(p.stat().st_size for _s, p in made)
        gen = time.perf_counter() - t0
        result = asyncio.run(measure(root, made, args.appends))
        result.update({"files_mb": size / 2**20, "generate_s": gen})
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    targets = {"ready_s": 5.0, "rss_mb": 200.0, "append_p99_ms": 100.0}
    print(f"{'metric':<16}{'value':>12}{'target':>10}")
    for key, value in result.items():
        target = targets.get(key)
        mark = "" if target is None else (" ok" if value <= target else " MISSED")
        shown = f"<= {target:g}" if target is not None else ""
        print(f"{key:<16}{value:>12.2f}{shown:>10}{mark}")
    print(json.dumps({k: round(v, 3) for k, v in result.items()}))


if __name__ == "__main__":
    main()
