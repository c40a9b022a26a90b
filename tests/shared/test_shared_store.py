"""Two real ``tailfloor serve`` processes sharing a real Redis (``--store``): one summary per
session across them, learned facts passed on, and Redis killed mid-run.

The oracle is the fake upstream's record of what it received (which requests were summarizer
calls, what each request carried) and each process's own metrics.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.fake_behaviour import AgentBehaviour, total_chars
from tests.fake_upstream import FakeUpstream
from tests.floor.synthetic import system
from tests.floor.test_floor_tenants import VICTIM, hello, rules_dir, send, victim_session
from tests.inprocess import InProcessProxy
from tests.recovery.conversation import AUTH, carries_summary, history, kinds
from tests.recovery.conversation import rules_dir as recovery_rules
from tests.shared.redis_server import RedisServer

MAX_CHARS = 9000
SYNC = 1.0  # the facts round: what one replica learned reaches the other within it


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture()
def store(redis_server: RedisServer) -> RedisServer:
    with redis_server.client() as client:
        client.flushdb()
    return redis_server


# The store's round-trip bound at its highest: a loaded test machine can take longer than the
# default 250 ms, and a replica then rightly goes on alone, which these tests do not test.
GENEROUS = {"TAILFLOOR_STORE_TIMEOUT_MS": "1000"}


def pair(fake: FakeUpstream, tmp_path: Path, url: str, *extra: str,
         env: dict[str, str] | None = None) -> list[ProxyProcess]:
    rules = recovery_rules(tmp_path)
    return [InProcessProxy(fake, "--rules", str(rules), "--state", str(tmp_path / name),
                         "--store", url, *extra, env={**GENEROUS, **(env or {})})
            for name in ("a", "b")]


def post(proxy: ProxyProcess, body: dict[str, Any], headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": AUTH, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, orjson.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read()), dict(exc.headers)


def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "fake-model", "messages": messages, "max_completion_tokens": 256}


def stored_bytes(client: Any, key: bytes) -> bytes:
    """Every byte a key holds, read by its type (DUMP may compress)."""
    kind = client.type(key)
    if kind == b"hash":
        return b"".join(k + v for k, v in client.hgetall(key).items())
    if kind == b"zset":
        return b"".join(client.zrange(key, 0, -1))
    if kind == b"string":
        return bytes(client.get(key) or b"")
    return b""


def summaries(fake: FakeUpstream) -> int:
    return kinds(fake).count("summary")


@pytest.mark.parametrize("named", [True, False], ids=["tracked-session", "auto-session"])
def test_a_summary_made_on_one_replica_is_reused_on_the_other(
        clean_fake: FakeUpstream, tmp_path: Path, store: RedisServer, named: bool) -> None:
    """A session named by header that both replicas track in a shared transcript volume,
    and an identity-less one (its ``auto:`` key)."""
    extra: tuple[str, ...] = ()
    headers: dict[str, str] = {}
    if named:
        victim = victim_session(tmp_path / "sessions")
        messages = victim["messages"]
        headers = {"x-tailfloor-session": VICTIM}
        extra = ("--sessions", str(tmp_path / "sessions"))
    else:
        messages = [*history("s", 8, 700), {"role": "user", "content": "what now?"}]
    clean_fake.behaviour = AgentBehaviour(max_chars=total_chars(messages) - 500)
    a, b = pair(clean_fake, tmp_path, store.url, *extra)
    try:
        status, answer, head = post(a, chat(messages), headers)
        assert status == 200 and head["x-tailfloor"] == "compacted:overflow", head
        assert kinds(clean_fake) == ["chat", "summary", "chat"]
        # At once: the other replica asks the store for the window it has not learned.
        clean_fake.received.clear()
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "and then?"}]
        status, _answer, head = post(b, chat(messages), headers)
        assert status == 200 and head["x-tailfloor"] == "reused", head
        assert kinds(clean_fake) == ["chat"]  # no summarizer call, no overflow first
        assert carries_summary(clean_fake.chat_requests()[0].body)
        assert b.sample("tailfloor_compactions_total", trigger="reused") == 1
        assert b.sample("tailfloor_store_errors_total", store="redis", kind="failed") == 0
        with store.client() as client:
            stored = [key for key in client.scan_iter("tailfloor:c:*")]
        # the session, then a keyed hash of the credential (never the credential)
        prefix = f"tailfloor:c:{VICTIM}~".encode() if named else b"tailfloor:c:auto:"
        assert [k.startswith(prefix) for k in stored] == [True], stored
    finally:
        for proxy in (a, b):
            proxy.stop()


def test_one_summary_when_both_replicas_overflow_at_once(
        clean_fake: FakeUpstream, tmp_path: Path, store: RedisServer) -> None:
    # The summarizer is slow, so both replicas are inside their compaction at the same time.
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS, summary_delay=1.5)
    # A loaded test machine can take longer than the default 0.25 s for a round trip; a
    # replica would then rightly go on alone and make a second summary (1 s, the most
    # allowed, is plenty).
    a, b = pair(clean_fake, tmp_path, store.url, env={"TAILFLOOR_STORE_TIMEOUT_MS": "1000"})
    try:
        messages = [*history("c", 8, 700), {"role": "user", "content": "both at once?"}]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda p: post(p, chat(messages),
                                                   {"x-tailfloor-session": "raced"}), (a, b)))
        verdicts = sorted(head["x-tailfloor"] for _s, _a, head in results)
        assert [s for s, _a, _h in results] == [200, 200], results
        assert summaries(clean_fake) == 1, kinds(clean_fake)
        assert verdicts == ["compacted:overflow", "reused:overflow"], verdicts
        sent = [r for r in clean_fake.chat_requests() if carries_summary(r.body)]
        assert len(sent) == 2 and sent[0].body == sent[1].body  # the same summary, same bytes
    finally:
        for proxy in (a, b):
            proxy.stop()


def test_a_carry_on_one_replica_from_a_fingerprint_recorded_on_the_other(
        clean_fake: FakeUpstream, tmp_path: Path, store: RedisServer) -> None:
    root = tmp_path / "sessions"
    victim = victim_session(root)
    rules = rules_dir(tmp_path)
    a, b = (InProcessProxy(clean_fake, "--sessions", str(root), "--rules", str(rules),
                         "--store", store.url, env=GENEROUS) for _ in range(2))
    alone = InProcessProxy(clean_fake, "--sessions", str(root), "--rules", str(rules))
    try:
        send(a, victim)  # Pi's request of its old session: A records its fingerprint
        _raw, verdict = send(alone, hello(system()))
        assert verdict.startswith("none"), verdict  # a replica that shares nothing cannot
        _raw, verdict = send(b, hello(system()))  # Pi's new session, on the other replica
        assert verdict.startswith("carry; carried="), verdict
        texts = [str(m.get("content"))
                 for m in orjson.loads(clean_fake.chat_requests()[-1].body)["messages"]]
        assert any("reply 01a2 turn 39" in t for t in texts)  # the victim's newest reply
    finally:
        for proxy in (a, b, alone):
            proxy.stop()


def test_redis_killed_mid_run_costs_no_request(
        clean_fake: FakeUpstream, tmp_path: Path) -> None:
    server = RedisServer()
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    a, b = pair(clean_fake, tmp_path, server.url)
    try:
        messages = [*history("k", 8, 700), {"role": "user", "content": "before the kill"}]
        assert post(a, chat(messages), {"x-tailfloor-session": "k"})[0] == 200
        server.kill()
        started = time.monotonic()
        statuses = []
        for n in range(6):
            fresh = [*history(f"k{n}", 8, 700), {"role": "user", "content": f"after {n}"}]
            for proxy in (a, b):
                status, _answer, head = post(proxy, chat(fresh), {"x-tailfloor-session": f"k{n}"})
                statuses.append((status, head.get("x-tailfloor")))
        assert all(s == 200 for s, _v in statuses), statuses
        assert all(v == "compacted:overflow" for _s, v in statuses), statuses
        assert time.monotonic() - started < 30
        for proxy in (a, b):
            assert proxy.sample("tailfloor_store_errors_total", store="redis", kind="failed") >= 1
            with urllib.request.urlopen(proxy.url + "/readyz", timeout=5) as ready:
                assert ready.status == 200
        # The local store stood in: the session's next turn on the same replica reuses.
        clean_fake.received.clear()
        status, _answer, head = post(a, chat([*history("k0", 8, 700),
                                              {"role": "user", "content": "after 0"},
                                              {"role": "assistant", "content": "ok"},
                                              {"role": "user", "content": "again"}]),
                                     {"x-tailfloor-session": "k0"})
        assert status == 200 and head["x-tailfloor"] == "reused", head
        errors = [line for proxy in (a, b) for line in proxy.logs().splitlines()
                  if "shared store" in line and "failed" in line]
        assert len(errors) == 2, errors  # once per replica and episode, not per request
    finally:
        for proxy in (a, b):
            proxy.stop()
        server.stop()


def test_the_next_turn_on_the_other_replica_at_once_makes_no_second_summary(
        clean_fake: FakeUpstream, tmp_path: Path, store: RedisServer) -> None:
    """A tool loop sends its next request right after the answer: the other replica has not
    heard of the session yet, but asks the store before it summarizes anything."""
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    a, b = pair(clean_fake, tmp_path, store.url)
    try:
        messages = [*history("t", 8, 700), {"role": "user", "content": "run the tool"}]
        status, answer, head = post(a, chat(messages))
        assert status == 200 and head["x-tailfloor"] == "compacted:overflow", head
        clean_fake.received.clear()
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "next"}]
        status, _answer, head = post(b, chat(messages))
        assert status == 200 and head["x-tailfloor"] in ("reused", "reused:overflow"), head
        assert summaries(clean_fake) == 0, kinds(clean_fake)
        assert carries_summary(clean_fake.chat_requests()[-1].body)
    finally:
        for proxy in (a, b):
            proxy.stop()


def test_a_claimed_session_id_does_not_name_the_store_key(
        clean_fake: FakeUpstream, tmp_path: Path, store: RedisServer) -> None:
    """Two roots (two tenants): a client claiming a tracked session's id gets nothing of it,
    and its compaction goes under its own derived key, not into the victim's slots."""
    victim_session(tmp_path / "alice")
    (tmp_path / "bob").mkdir()
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    proxy = InProcessProxy(clean_fake, "--rules", str(recovery_rules(tmp_path)),
                         "--state", str(tmp_path / "state"), "--store", store.url,
                         "--sessions", str(tmp_path / "alice"), "--sessions",
                         str(tmp_path / "bob"), env=GENEROUS)
    try:
        messages = [*history("m", 8, 700), {"role": "user", "content": "mine now"}]
        status, _answer, head = post(proxy, chat(messages), {"x-tailfloor-session": VICTIM})
        assert status == 200 and head["x-tailfloor"] == "compacted:overflow", head
        with store.client() as client:
            stored = list(client.scan_iter("tailfloor:c:*"))
        assert [k.startswith(b"tailfloor:c:auto:") for k in stored] == [True], stored
    finally:
        proxy.stop()


def test_nothing_secret_is_stored(clean_fake: FakeUpstream, tmp_path: Path,
                                  store: RedisServer) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    a, b = pair(clean_fake, tmp_path, store.url)
    try:
        messages = [*history("x", 8, 700), {"role": "user", "content": "secret?"}]
        assert post(a, chat(messages), {"x-tailfloor-session": "x"})[0] == 200
        # What the replica shares reaches the store within a facts round: wait for it there.
        deadline = time.monotonic() + 10 * SYNC
        while True:
            with store.client() as client:
                keys = list(client.scan_iter())
                ttls = [client.ttl(key) for key in keys]
                values = b"".join(stored_bytes(client, key) for key in keys)
            if b"SUMMARY" in values.upper() or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert keys and all(t > 0 for t in ttls), list(zip(keys, ttls, strict=True))
        assert b"SUMMARY" in values.upper()  # the values were read, in the clear
        secret = AUTH.split()[1].encode()
        assert secret not in values and secret[:12] not in values and b"Bearer" not in values
    finally:
        for proxy in (a, b):
            proxy.stop()


@pytest.mark.parametrize("fault", ["paused", "full"])
def test_a_slow_or_full_redis_costs_no_request(clean_fake: FakeUpstream, tmp_path: Path,
                                               fault: str) -> None:
    server = RedisServer()
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    a, _b = proxies = pair(clean_fake, tmp_path, server.url)
    try:
        with server.client() as client:
            if fault == "full":
                client.config_set("maxmemory-policy", "noeviction")
                client.config_set("maxmemory", "1")  # every write is refused: OOM
            else:
                client.execute_command("CLIENT", "PAUSE", "4000", "ALL")
        started = time.monotonic()
        for n in range(3):
            fresh = [*history(f"{fault}{n}", 8, 700), {"role": "user", "content": f"go {n}"}]
            status, _answer, head = post(a, chat(fresh))
            assert status == 200 and head["x-tailfloor"] == "compacted:overflow", head
        # A paused store costs its timeout once, then the backoff skips it.
        assert time.monotonic() - started < 8
        assert a.sample("tailfloor_store_errors_total", store="redis", kind="failed") >= 1
        # What could not be shared was kept here: the next turn reuses it.
        clean_fake.received.clear()
        status, _answer, head = post(a, chat([
            *history(f"{fault}0", 8, 700), {"role": "user", "content": "go 0"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]))
        assert status == 200 and head["x-tailfloor"] == "reused", head
        assert kinds(clean_fake) == ["chat"]
    finally:
        for proxy in proxies:
            proxy.stop()
        server.stop()
