"""Hostile load: the fuzz of all three chat routes, huge bodies near the body limit among it,
against a real ``tailfloor serve``; its peak RSS and how fast ``/healthz`` answers meanwhile.

Starts the fake upstream (``--lenient``: it answers any JSON) and ``tailfloor serve`` on an
empty sessions root with its default limits (bodies up to 32 MiB, ``--max-buffered-bytes``
48 MiB, the inspector on). A watcher process (tests/bench/watch.py) asks ``/healthz`` on the
admin port every 15 ms on a new connection and reads the process's ``VmRSS`` after each probe;
it asks the health process (``--health-listen``) the same way right after, and an idle
aiohttp server (a second fake upstream nobody sends to) after that: what the machine itself,
busy with the load, adds to an answer.

- baseline, in the same run: ``--idle`` seconds with no load once a few requests of each
  route warmed the process: its RSS, high-water mark and the /healthz latencies;
- fuzz: ``--clients`` connections for ``--seconds``, each sending requests one after the
  other to a random route of the three (chat completions, Responses, Messages; half of them
  under an ``/agents/<id>/`` prefix): small mutated bodies (tests/hostile_bodies.py), and
  with probability ``--huge`` a huge one (a 32 MB text with a length, chunked or gzip; 49,000
  messages or content blocks; 8 MB of tiny JSON values; 8 MB of text Python holds at four
  bytes a character; an 8 MB system prompt). Reported: the peak RSS (``VmHWM``), RSS after,
  the /healthz latencies and the huge kinds in flight during the slow probes, every answer's
  status by kind, and whether any answer was a 5xx that is not JSON or the log holds a
  traceback.

Usage: python tests/bench/hostile_load.py [--seconds 60] [--clients 6] [--huge 0.2]
           [--idle 10] [--seed 1] [--repo DIR] [--env NAME=VALUE] [-- serve options]
(``--repo`` runs the tailfloor of another checkout, for before/after figures.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.memory_peak import wait_ready
from tests.bench.watch import Watch, child_memory_mb, memory_mb, percentiles
from tests.conftest import free_port
from tests.hostile_bodies import HUGE_KINDS, ROUTES, fuzzed, huge

ROOT = Path(__file__).resolve().parents[2]
BODY_LIMIT = 32 * 1024 * 1024  # tailfloor's default --max-body-bytes
HEALTHZ_BAR_MS = 50.0
RSS_BAR_MB = 200.0
ANSWER_TIMEOUT = 180.0


@contextmanager
def processes(repo: Path, extra: list[str], env: dict[str, str] | None = None
              ) -> Iterator[tuple[subprocess.Popen[bytes], int, int, int, int, Path]]:
    """The fake upstream and ``tailfloor serve`` of ``repo`` (with its health process), and
    an idle server (another fake upstream nobody sends to): the server, its port, admin port
    and health process port, the idle one's, its log."""
    work = Path(tempfile.mkdtemp(prefix="tailfloor-hostile-"))
    (work / "sessions").mkdir()
    upstream, port, admin, idle = free_port(), free_port(), free_port(), free_port()
    health = free_port()
    fakes = [subprocess.Popen([sys.executable, "tests/fake_upstream.py", "--port", str(number),
                               "--lenient"], cwd=ROOT, stdout=subprocess.DEVNULL)
             for number in (upstream, idle)]
    log = work / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
             "--admin-listen", f"127.0.0.1:{admin}", "--upstream",
             f"http://127.0.0.1:{upstream}", "--sessions", str(work / "sessions"),
             "--health-listen", f"127.0.0.1:{health}", "--log-level", "WARNING", *extra],
            cwd=repo, env={**os.environ, **(env or {}), "PYTHONPATH": str(repo)},
            stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc, port, admin, health, idle, log
    finally:
        for child in (proc, *fakes):
            child.terminate()
            child.wait(30)


async def send(port: int, path: str, body: bytes, headers: dict[str, str], chunked: bool
               ) -> tuple[int, str]:
    """One request on its own connection: the answer's status (0: none) and, for a 5xx,
    its error code (``not-json`` when its body is not JSON)."""
    head = f"POST {path} HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n" \
           "Connection: close\r\n"
    head += "".join(f"{name.replace('_', '-')}: {value}\r\n" for name, value in headers.items())
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else \
        f"Content-Length: {len(body)}\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode())
        step = 1 << 20
        for start in range(0, len(body), step):
            piece = body[start:start + step]
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
    except ConnectionError:
        pass  # answered (refused) before the whole body went: the answer is still there
    try:
        answer = await asyncio.wait_for(reader.read(), ANSWER_TIMEOUT)
    except (ConnectionError, TimeoutError):
        answer = b""
    finally:
        writer.close()
    if not answer.startswith(b"HTTP/1.1 "):
        return 0, "no-answer"
    status = int(answer[9:12])
    if status < 500:
        return status, ""
    payload = answer.partition(b"\r\n\r\n")[2]
    try:
        error = json.loads(payload)["error"]
        return status, str(error.get("code") or error.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return status, "not-json"


class Fuzz:
    def __init__(self, port: int, seed: int, huge_share: float) -> None:
        self.port, self.huge_share = port, huge_share
        self.rng = random.Random(seed)
        self.bodies = {(kind, route): huge(kind, route, BODY_LIMIT)
                       for kind in HUGE_KINDS for route in ROUTES}
        self.answers: Counter[str] = Counter()
        self.in_flight: list[tuple[float, float, str]] = []  # huge: (start, end, kind)
        self.small_ms: list[float] = []

    async def client(self, number: int, deadline: float) -> None:
        rng = random.Random(self.rng.random())
        while time.monotonic() < deadline:
            route = rng.choice(list(ROUTES))
            prefix = f"/agents/fuzz-{number}" if rng.random() < 0.5 else ""
            kind = rng.choice(HUGE_KINDS) if rng.random() < self.huge_share else "small"
            if kind == "small":
                body, headers = fuzzed(rng, route)
                chunked = False
            else:
                body, headers, chunked = self.bodies[(kind, route)]
            began = time.monotonic()
            status, code = await send(self.port, prefix + ROUTES[route], body, headers,
                                      chunked)
            if kind == "small":
                self.small_ms.append((time.monotonic() - began) * 1000)
            else:
                self.in_flight.append((began, time.monotonic(), kind))
            self.answers[f"{kind} {status}{' ' + code if code else ''}"] += 1

    def during(self, moments: list[float]) -> dict[str, int]:
        """How many of ``moments`` each huge kind was in flight at."""
        seen: Counter[str] = Counter()
        for at in moments:
            seen.update({kind for start, end, kind in self.in_flight if start <= at <= end})
        return dict(seen.most_common())


async def warm(port: int) -> None:
    """A few requests of each route, and one long enough to be counted: the tokenizer's
    tables (~45 MB) load on first use, in every process that serves agents."""
    rng = random.Random(0)
    for route in ROUTES:
        for _ in range(5):
            await send(port, ROUTES[route], *fuzzed(rng, route), False)
    text = "a warm-up turn long enough to be counted in tokens; " * 40_000
    await send(port, ROUTES["chat"], json.dumps(
        {"model": "fake", "messages": [{"role": "user", "content": text}]}).encode(), {}, False)
    await asyncio.sleep(3)  # the tables load in a thread of their own


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = dict(item.split("=", 1) for item in args.env)
    with processes(Path(args.repo).resolve(), args.serve, env) as (proc, port, admin, health,
                                                                   idle_port, log):
        asyncio.run(wait_ready(admin, 60))
        asyncio.run(warm(port))
        with Watch(proc.pid, admin, other=idle_port, health=health) as idle:
            time.sleep(args.idle)
        idle_memory = memory_mb(proc.pid)
        fuzz = Fuzz(port, args.seed, args.huge)
        with Watch(proc.pid, admin, other=idle_port, health=health) as loaded:
            deadline = time.monotonic() + args.seconds

            async def clients() -> None:
                await asyncio.gather(*(fuzz.client(n, deadline) for n in range(args.clients)))
            asyncio.run(clients())
        memory = memory_mb(proc.pid)
        health_rss = child_memory_mb(proc.pid)
        after = proc.poll() is None and asyncio.run(_still_answers(port))
        text = log.read_text(errors="replace")
    slow = loaded.slow(HEALTHZ_BAR_MS)
    peak_at, peak_sampled = loaded.peak_sample()
    return {
        "baseline": {"rss_idle_mb": round(idle_memory["VmRSS"], 1),
                     "hwm_idle_mb": round(idle_memory["VmHWM"], 1),
                     "healthz_ms": idle.healthz(),
                     "health_process_healthz_ms": idle.health_process_healthz(),
                     "idle_server_healthz_ms": idle.other_healthz()},
        "fuzz": {
            "seconds": args.seconds, "clients": args.clients, "huge_share": args.huge,
            "requests": sum(fuzz.answers.values()),
            "peak_rss_mb": round(memory["VmHWM"], 1),
            "max_sampled_rss_mb": round(peak_sampled, 1),
            "huge_in_flight_at_peak": fuzz.during([peak_at]),
            "rss_after_mb": round(memory["VmRSS"], 1),
            "healthz_ms": loaded.healthz(),
            "healthz_over_bar": len(slow),
            "health_process_healthz_ms": loaded.health_process_healthz(),
            "health_process_rss_mb": round(health_rss, 1),
            "idle_server_healthz_ms": loaded.other_healthz(),
            "huge_in_flight_during_slow_probes": fuzz.during([at for at, _ in slow]),
            "small_request_ms": percentiles(fuzz.small_ms),
            "answers": dict(sorted(fuzz.answers.items())),
            "answers_after": after,
            "log_tracebacks": text.count("Traceback"),
        },
        "bars": {f"peak_rss_le_{RSS_BAR_MB:.0f}_mb": memory["VmHWM"] <= RSS_BAR_MB,
                 f"healthz_max_le_{HEALTHZ_BAR_MS:.0f}_ms":
                     loaded.healthz()["max"] <= HEALTHZ_BAR_MS,
                 f"health_process_healthz_max_le_{HEALTHZ_BAR_MS:.0f}_ms":
                     loaded.health_process_healthz()["max"] <= HEALTHZ_BAR_MS},
    }


async def _still_answers(port: int) -> bool:
    status, _ = await send(port, ROUTES["chat"], b'{"model":"m","messages":[]}', {}, False)
    return status == 200


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--huge", type=float, default=0.2,
                        help="share of requests that are huge bodies")
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repo", default=str(ROOT), help="the checkout whose tailfloor runs")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for tailfloor serve only")
    parser.add_argument("serve", nargs="*", help="extra options for tailfloor serve")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
