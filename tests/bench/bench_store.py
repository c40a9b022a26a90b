"""Benchmark: the compaction store on SQLite and on Redis, side by side in one run.

1. Lookups with 10,000 stored compactions (1,000 sessions of 10): the longest-prefix lookup
   of a 60-message request that repeats a stored prefix (a hit) and of one that does not (a
   miss), through the same interface recovery uses (worker thread for SQLite, asyncio for
   Redis), each against a real local redis-server started here.
2. The added latency of a reused compaction through a real ``tailfloor serve``: a request
   whose stored summary replaces its history, sent through tailfloor with SQLite (``--state``)
   and with Redis (``--store``), beside the same final request sent directly to the upstream.

Usage: python tests/bench/bench_store.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy.recovery.compaction_store import LocalCompactions
from proxy.recovery.sqlite_store import CompactionStore
from proxy.replicas.client import SharedClient
from proxy.replicas.compactions import SharedCompactions
from proxy.replicas.config import parse_store_url
from tests.conftest import ProxyProcess, ThreadedFake
from tests.fake_behaviour import AgentBehaviour
from tests.recovery.conversation import AUTH, history, rules_dir
from tests.shared.redis_server import RedisServer

SESSIONS, PER_SESSION = 1000, 10


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[max(0, int(len(ordered) * 0.99) - 1)]
    return f"p50 {statistics.median(ordered) * 1e3:7.3f} ms   p99 {p99 * 1e3:7.3f} ms"


def conversation(session: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a benchmark agent."},
            *({"role": "user" if k % 2 == 0 else "assistant",
               "content": f"session {session} message {k} " + "words " * 40}
              for k in range(60))]


async def to_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


async def fill_and_look_up(store: Any, runs: int) -> tuple[list[float], list[float]]:
    for session in range(SESSIONS):
        messages = conversation(session)
        for k in range(PER_SESSION):
            await store.put(f"s{session}", messages[:20 + 2 * k], f"summary {session}/{k}", 900)
    hits, misses = [], []
    for n in range(runs):
        session = n % SESSIONS
        messages = conversation(session)
        started = time.perf_counter()
        found = await store.find_for(messages, f"s{session}")
        hits.append(time.perf_counter() - started)
        assert found is not None and found.message_count == 20 + 2 * (PER_SESSION - 1)
        other = [messages[0], {"role": "user", "content": f"unknown {n}"}, *messages[2:]]
        started = time.perf_counter()
        assert await store.find_for(other, f"s{session}") is None
        misses.append(time.perf_counter() - started)
    return hits, misses


async def lookups(redis_url: str, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = CompactionStore(Path(tmp), max_total=SESSIONS * PER_SESSION)
        local = LocalCompactions(sqlite, to_thread, max_sessions=SESSIONS * PER_SESSION)
        print(f"{SESSIONS * PER_SESSION} compactions stored, 60-message requests, {runs} runs")
        hits, misses = await fill_and_look_up(local, runs)
        print(f"  sqlite  hit  {percentiles(hits)}   miss {percentiles(misses)}")
        client = SharedClient(parse_store_url(redis_url))
        with tempfile.TemporaryDirectory() as spare:
            fallback = LocalCompactions(CompactionStore(Path(spare)), to_thread, max_sessions=10)
            shared = SharedCompactions(client, fallback, to_thread,
                                       max_per_session=PER_SESSION)
            hits, misses = await fill_and_look_up(shared, runs)
            print(f"  redis   hit  {percentiles(hits)}   miss {percentiles(misses)}")
            await client.close()
            await fallback.close()
        await local.close()


def post(url: str, body: dict[str, Any]) -> tuple[float, str]:
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": AUTH})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        verdict = response.headers.get("x-tailfloor", "")
    return time.perf_counter() - started, verdict


def reused_through(redis_url: str, runs: int) -> None:
    fake = ThreadedFake()
    fake.fake.behaviour = AgentBehaviour(max_chars=9000)
    with tempfile.TemporaryDirectory() as tmp:
        rules = rules_dir(Path(tmp))
        messages = [*history("bench", 8, 700), {"role": "user", "content": "what now?"}]
        body = {"model": "fake-model", "messages": messages, "max_completion_tokens": 64}
        print(f"a reused compaction through tailfloor ({runs} requests each)")
        for name, extra in (("sqlite", ()), ("redis", ("--store", redis_url))):
            proxy = ProxyProcess(fake.fake.url, "--rules", str(rules),
                                 "--state", str(Path(tmp) / name), *extra)
            try:
                _seconds, verdict = post(proxy.url, body)
                assert verdict == "compacted:overflow", verdict
                final = fake.fake.chat_requests()[-1].body
                times = []
                for _ in range(runs):
                    seconds, verdict = post(proxy.url, body)
                    assert verdict == "reused", verdict
                    times.append(seconds)
                direct = []
                for _ in range(runs):  # the same compacted request, straight to the upstream
                    direct.append(post(fake.fake.url, json.loads(final))[0])
                added = statistics.median(times) - statistics.median(direct)
                print(f"  {name:7} {percentiles(times)}   direct p50 "
                      f"{statistics.median(direct) * 1e3:.3f} ms   added p50 {added * 1e3:.3f} ms")
            finally:
                proxy.stop()
    fake.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    server = RedisServer()
    try:
        asyncio.run(lookups(server.url, args.runs))
        with server.client() as client:
            client.flushdb()
        reused_through(server.url, max(args.runs // 10, 50))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
