"""The shared store's parts against a real redis-server: the summary lock when Redis stalls,
fingerprints read from the store, the sessions other replicas stored compactions for."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.identity.prompt_prints import Fingerprints
from proxy.replicas.client import SharedClient
from proxy.replicas.config import parse_store_url
from proxy.replicas.facts import SharedFacts
from proxy.replicas.lock import SharedSummaryLock
from proxy.upstream.stream_options import StreamOptionsMemory
from tests.shared.redis_server import RedisServer


@pytest.fixture(scope="module")
def debug_redis() -> Iterator[RedisServer]:
    server = RedisServer("--enable-debug-command", "yes")
    yield server
    server.stop()


class Known:
    def __init__(self) -> None:
        self.sessions: list[str] = []

    def learn_sessions(self, sessions: list[str]) -> None:
        self.sessions.extend(sessions)


def facts(client: SharedClient, prints: Fingerprints | None = None) -> SharedFacts:
    return SharedFacts(client, windows=LearnedWindows(), stream_options=StreamOptionsMemory(),
                       prints=prints or Fingerprints(), compactions=Known())


# Round trips at the store timeout's highest setting: a loaded test machine exceeds the default
# 250 ms, and the client then rightly gives up, which these tests do not test.
GENEROUS = 1.0

async def test_a_lock_taken_while_redis_stalled_does_not_block_the_session(
        debug_redis: RedisServer) -> None:
    """The SET of an acquire that timed out lands when Redis wakes: that lock is nobody's.
    Its taker removes it (it knows its token), so the next summary waits seconds, not the
    lock's expiry or the summarizer's timeout."""
    url = parse_store_url(debug_redis.url)
    first, second = SharedClient(url), SharedClient(url)
    try:
        with debug_redis.client() as client:
            client.delete("tailfloor:lock:stalled")
        assert await first.ping()  # an open connection: the SET goes out, its answer is late
        sleeper = threading.Thread(target=lambda: debug_redis.client().execute_command(
            "DEBUG", "SLEEP", "1.5"))
        sleeper.start()
        await asyncio.sleep(0.1)
        async with SharedSummaryLock(first, expiry=60.0).hold("stalled", wait=30) as contended:
            assert contended is False  # summarized alone: the store did not answer
        sleeper.join()
        # The late SET has landed by now (or was already removed by its taker).
        started = time.monotonic()
        async with SharedSummaryLock(second, expiry=60.0).hold("stalled", wait=30):
            waited = time.monotonic() - started
        assert waited < 5, f"waited {waited:.1f} s for a lock nobody held"
    finally:
        await first.close()
        await second.close()


async def test_a_holder_keeps_its_lock_while_it_summarizes(debug_redis: RedisServer) -> None:
    url = parse_store_url(debug_redis.url)
    holder, other = SharedClient(url, timeout=GENEROUS), SharedClient(url, timeout=GENEROUS)
    try:
        async with SharedSummaryLock(holder, expiry=0.6).hold("long", wait=5):
            await asyncio.sleep(1.5)  # longer than the expiry: the heartbeat extends it
            with debug_redis.client() as client:
                assert client.exists("tailfloor:lock:long")
            async with SharedSummaryLock(other, expiry=0.6).hold("long", wait=0.3) as c:
                assert c is True  # still taken
        with debug_redis.client() as client:
            assert not client.exists("tailfloor:lock:long")  # released at the end
    finally:
        await holder.close()
        await other.close()


async def test_a_fingerprint_from_the_store_never_replaces_one_recorded_here(
        debug_redis: RedisServer) -> None:
    client = SharedClient(parse_store_url(debug_redis.url), timeout=GENEROUS)
    try:
        elsewhere = Fingerprints()
        elsewhere.record("moved", "P_OLD")
        elsewhere.record("other", "P_OLD")
        await facts(client, elsewhere).push()
        here = Fingerprints()
        here.record("moved", "P_NEW")
        assert await facts(client, here).pull_print("P_OLD") is True  # "other" is new
        assert here.get("moved") == "P_NEW" and here.get("other") == "P_OLD"
    finally:
        await client.close()


async def test_a_starting_replica_learns_the_newest_sessions_first(
        debug_redis: RedisServer) -> None:
    client = SharedClient(parse_store_url(debug_redis.url), timeout=GENEROUS)
    try:
        with debug_redis.client() as sync:
            sync.delete("tailfloor:known")
            sync.zadd("tailfloor:known", {f"s{n}": 1_000_000 + n for n in range(12_000)})
        known = Known()
        shared = SharedFacts(client, windows=LearnedWindows(),
                             stream_options=StreamOptionsMemory(), prints=Fingerprints(),
                             compactions=known)
        await shared.sync()
        assert "s11999" in known.sessions and "s0" not in known.sessions
        assert known.sessions[-1] == "s11999"  # newest last: the most recently used
    finally:
        await client.close()


async def test_windows_ratios_and_refusals_learned_on_one_replica_reach_another(
        debug_redis: RedisServer) -> None:
    client = SharedClient(parse_store_url(debug_redis.url), timeout=GENEROUS)
    try:
        with debug_redis.client() as sync:
            sync.delete("tailfloor:windows", "tailfloor:ratios", "tailfloor:refusals")
        windows, ratios, refusals = LearnedWindows(), TokenRatios(), StreamOptionsMemory()
        assert windows.learn("http://up", "m1", 8192)
        assert ratios.learn("http://up", "m1", 1370, 1000) == 1.37
        refusals.refused("http://old-up")
        here = SharedFacts(client, windows=windows, ratios=ratios, stream_options=refusals,
                           prints=Fingerprints(), compactions=Known())
        assert here.pending()
        await here.push()
        assert not here.pending()
        there_windows, there_ratios, there_refusals = (LearnedWindows(), TokenRatios(),
                                                       StreamOptionsMemory())
        there = SharedFacts(client, windows=there_windows, ratios=there_ratios,
                            stream_options=there_refusals, prints=Fingerprints(),
                            compactions=Known())
        await there.sync()
        assert there_windows.window("http://up", "m1") == 8192
        assert there_ratios.ratio("http://up", "m1") == 1.37
        assert not there_refusals.accepted("http://old-up")
        assert there_refusals.accepted("http://up")
        assert not there.pending()  # what was read is not pushed back
    finally:
        await client.close()
