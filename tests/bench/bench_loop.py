"""Benchmark: does one pathological input stall everybody else?

Starts the scripted fake upstream and a real ``tailfloor serve`` following a transcript root,
then, for each input below, pings ``/healthz`` every 10 ms on its own connection while the
input is processed, and reports the worst and p99 ping latency (target: worst <= 20 ms).
In the same run the fake upstream (another aiohttp server on this machine, which receives
the same inputs) is pinged the same way: the ``baseline_`` figures show what the machine
itself adds on a 2-core box while megabytes move between the processes.

- ``repeat_4mb``: a chat request with 4 MB of one repeated character (``--big``: also 30 MB,
  over the 8 MiB parsing bound: forwarded unread);
- ``empty_1m``: a chat request of one million ``{}`` messages;
- ``tools_50k``: 50,000 tool exchanges in one request (over the 50,000-object bound:
  forwarded unread); ``tools_8k``: 8,000 (under it: parsed, floored, counted, compacted);
- ``transcript_52mb``: the first floor read of a 52 MB transcript (a request after the
  agent's compaction, identified, restored);
- ``store_900``: a request whose 900-message prefix has stored compactions (looked up);
- ``garbage_200mb``: 200 MB of garbage appended to a watched transcript (``--quick``: 20 MB).

Usage: python tests/bench/bench_loop.py [--quick] [--big] [--repo DIR] [--json out.json]
(``--repo`` runs the tailfloor of another checkout, for before/after figures.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
import orjson

from proxy.transcripts.catalog import Catalog
from tests.bench.bench_proxy import wait_http
from tests.conftest import free_port
from tests.floor.synthetic import Transcript, conversation, put, request_for

ROOT = Path(__file__).resolve().parents[2]
BIG = "01a22c00-0000-7000-8000-0000000b16b1"
RULES = """[defaults]
min_tail_messages = 30
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Pinger:
    """GET ``path`` every 10 ms; latencies of the pings sent while ``active``."""

    def __init__(self, url: str, path: str = "/healthz") -> None:
        self.url = url
        self.path = path
        self.samples: list[float] = []
        self.active = False
        self._stop = False

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while not self._stop:
                started = time.perf_counter()
                async with session.get(self.url + self.path) as response:
                    await response.read()
                elapsed = time.perf_counter() - started
                if self.active:
                    self.samples.append(elapsed)
                await asyncio.sleep(max(0.0, 0.01 - elapsed))

    def stop(self) -> None:
        self._stop = True


def write_session(root: Path, t: Transcript, stamp: str) -> Path:
    folder = root / "--bench--"
    folder.mkdir(parents=True, exist_ok=True)
    header = {"type": "session", "version": 3, "id": t.session_id,
              "timestamp": "2026-11-30T02:00:00.000Z", "cwd": "/bench"}
    path = folder / f"{stamp}_{t.session_id}.jsonl"
    with path.open("wb") as out:
        for obj in [header, *t.objs]:
            out.write(orjson.dumps(obj) + b"\n")
    return path


def big_session(root: Path, megabytes: int) -> dict[str, Any]:
    """A Pi session of about ``megabytes`` MB, compacted near its end; returns the request Pi
    sends next (summary, the kept messages, a new user turn)."""
    t = Transcript(BIG)
    filler = "x" * 20_000
    while len(t.objs) * 20_000 < megabytes * 1_000_000:
        t.user("question " + str(len(t.objs)) + " " + filler)
        _entry, ids = t.tool_calls(["bash"])
        t.tool_result(ids[0], "result " + filler)
        t.assistant("answer " + str(len(t.objs)))
    users = [o["id"] for o in t.objs if o["type"] == "message"
             and o["message"]["role"] == "user"]
    t.compaction("## Goal\nbench", users[-2])  # Pi cuts before a user turn
    t.user("the next question")
    write_session(root, t, "2026-11-30T02-00-00-000Z")
    catalog = Catalog()
    put(catalog, t)
    return request_for(catalog, BIG)


async def post(url: str, body: bytes) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json", "Authorization": "Bearer sk-bench"},
            timeout=aiohttp.ClientTimeout(total=600)) as response:
        await response.read()
        return response.status, response.headers.get("x-tailfloor", "")


def chat(messages: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"model": "fake-model", "messages": messages, "max_tokens": 64})


def tool_exchanges(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for i in range(n):
        out.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]})
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"})
    out.append({"role": "user", "content": "done?"})
    return out


def store_request(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a bench."}]
    for i in range(n // 2):
        out.append({"role": "user", "content": f"store question {i} " + "words " * 40})
        out.append({"role": "assistant", "content": f"store answer {i} " + "words " * 40})
    return out


def script_overflow(fake: str) -> None:
    error = {"message": "This model's maximum context length is 30000 tokens. However, your "
             "messages resulted in 40000 tokens.", "type": "invalid_request_error",
             "param": "messages", "code": "context_length_exceeded"}
    request = urllib.request.Request(fake + "/_control/script", data=json.dumps(
        [{"status": 400, "error": error}]).encode(), headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).read()


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def garbage(url: str, path: Path, megabytes: int) -> tuple[int, str]:
    line = b"this line is not json at all " * 3 + b"\n"
    block = line * (1_000_000 // len(line))
    with path.open("ab") as out:
        for _ in range(megabytes):
            out.write(block)
    # Done when the proxy has read the garbage: its error and line counters stop moving.
    last, still = -1.0, 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and still < 10:
        await asyncio.sleep(0.2)
        try:
            now = await asyncio.to_thread(metric, url, "tailfloor_transcript_errors_total")
        except OSError:  # a proxy stalled for longer than the fetch's timeout
            continue
        still = still + 1 if now == last and now > 0 else 0
        last = now
    return 200, f"{last:.0f} errors counted"


async def many_files(url: str, folder: Path, count: int) -> tuple[int, str]:
    """``count`` new small Pi session files appear at once in a new directory; done when the
    proxy tracks them all."""
    def write() -> None:
        folder.mkdir(parents=True)
        for i in range(count):
            sid = f"01a22c00-0000-7000-8000-{i:012d}"
            header = {"type": "session", "version": 3, "id": sid,
                      "timestamp": "2026-11-30T02:00:00.000Z", "cwd": "/bench"}
            (folder / f"2026-11-30T02-00-00-000Z_{sid}.jsonl").write_bytes(
                orjson.dumps(header) + b"\n")

    started = time.monotonic()
    await asyncio.to_thread(write)
    deadline = time.monotonic() + 180
    seen = 0.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        try:
            seen = await asyncio.to_thread(metric, url, "tailfloor_sessions")
        except OSError:
            continue
        if seen >= count:
            break
    return 200, f"{seen:.0f} sessions tracked {time.monotonic() - started:.1f} s after the first"


async def scenario(pinger: Pinger, work: Callable[[], Awaitable[tuple[int, str]]],
                   baseline: Pinger | None = None) -> dict[str, Any]:
    """``baseline`` pings the fake upstream meanwhile (another aiohttp server on the same
    machine): what the machine itself adds while the input is sent and answered."""
    for p in (pinger, baseline):
        if p is not None:
            p.samples, p.active = [], True
    started = time.perf_counter()
    status, verdict = await work()
    took = time.perf_counter() - started
    await asyncio.sleep(0.05)
    result = {"status": status, "verdict": verdict, "seconds": round(took, 3)}
    for name, p in (("", pinger), ("baseline_", baseline)):
        if p is None:
            continue
        p.active = False
        samples = p.samples or [float("nan")]
        result.update({f"{name}pings": len(samples),
                       f"{name}worst_ms": round(max(samples) * 1e3, 1),
                       f"{name}p99_ms": round(percentile(samples, 0.99) * 1e3, 1)})
    return result


async def run(args: argparse.Namespace, url: str, fake: str, big_request: dict[str, Any],
              garbage_path: Path) -> dict[str, dict[str, Any]]:
    pinger = Pinger(url)
    ping_task = asyncio.create_task(pinger.run())
    baseline = Pinger(fake, "/v1/models")
    baseline_task = asyncio.create_task(baseline.run())
    # The tokenizer tables load in the background on first use; a request larger in bytes
    # than the default budget in tokens makes the proxy count, so they are there from here.
    words = " ".join(f"warm{i}" for i in range(30_000))
    await post(url, chat([{"role": "user", "content": words}]))
    await asyncio.sleep(3)
    results: dict[str, dict[str, Any]] = {}
    cases: list[tuple[str, Callable[[], Awaitable[tuple[int, str]]]]] = [
        ("repeat_4mb", lambda: post(url, chat([{"role": "user", "content": "a" * 4_000_000}]))),
        ("empty_1m", lambda: post(url, chat([{}] * 1_000_000))),
        ("tools_50k", lambda: post(url, chat(tool_exchanges(50_000)))),
        ("tools_8k", lambda: post(url, chat(tool_exchanges(8_000)))),
        ("transcript_52mb", lambda: post(url, orjson.dumps({**big_request, "stream": False}))),
    ]
    if args.big:
        cases.insert(1, ("repeat_30mb", lambda: post(
            url, chat([{"role": "user", "content": "a" * 30_000_000}]))))
    for name, work in cases:
        results[name] = await scenario(pinger, work, baseline)
        print(f"{name:16} {results[name]}", flush=True)
    # Store a compaction for a 900-message prefix (an overflow recovered), then look it up.
    script_overflow(fake)
    messages = store_request(900)
    await post(url, chat([*messages, {"role": "user", "content": "first"}]))
    results["store_900"] = await scenario(pinger, lambda: post(url, chat(
        [*messages, {"role": "user", "content": "second"}])), baseline)
    print(f"{'store_900':16} {results['store_900']}", flush=True)
    files = 2_000 if args.quick else 20_000
    results[f"new_files_{files}"] = await scenario(
        pinger, lambda: many_files(url, garbage_path.parent.parent / "--many--", files),
        baseline)
    print(f"{f'new_files_{files}':16} {results[f'new_files_{files}']}", flush=True)
    size = 20 if args.quick else 200
    results[f"garbage_{size}mb"] = await scenario(
        pinger, lambda: garbage(url, garbage_path, size), baseline)
    print(f"{f'garbage_{size}mb':16} {results[f'garbage_{size}mb']}", flush=True)
    pinger.stop()
    baseline.stop()
    await ping_task
    await baseline_task
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller transcript and garbage")
    parser.add_argument("--big", action="store_true", help="also the 30 MB request")
    parser.add_argument("--repo", type=Path, default=ROOT, help="checkout whose proxy to run")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tailfloor-bench-loop-"))
    sessions, rules = work / "sessions", work / "rules"
    rules.mkdir()
    (rules / "bench.toml").write_text(RULES)
    big_request = big_session(sessions, 5 if args.quick else 52)
    small = Transcript("01a22c00-0000-7000-8000-00000000a11e")
    conversation(small, 4)
    garbage_path = write_session(sessions, small, "2026-11-30T03-00-00-000Z")
    fake_port, port = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "tests/fake_upstream.py", "--port",
                               str(fake_port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    log = (work / "tailfloor.log").open("wb")
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
         "--admin-listen", "127.0.0.1:0", "--upstream", f"http://127.0.0.1:{fake_port}",
         "--sessions", str(sessions), "--rules", str(rules), "--max-body-bytes",
         str(64 * 1024 * 1024)], cwd=args.repo, stdout=log, stderr=subprocess.STDOUT,
        env={"PYTHONPATH": str(args.repo), "PATH": "/usr/bin:/bin"}))
    try:
        fake = f"http://127.0.0.1:{fake_port}"
        url = f"http://127.0.0.1:{port}"
        wait_http(fake + "/v1/models", 15)
        wait_http(url + "/readyz", 120)
        results = asyncio.run(run(args, url, fake, big_request, garbage_path))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(20)
        log.close()
    worst = max(r["worst_ms"] for r in results.values())
    print(f"\nworst ping over all inputs: {worst} ms (target <= 20 ms); proxy log: "
          f"{work / 'tailfloor.log'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
