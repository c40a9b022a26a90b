"""Agent keys: an ``/agents/<id>/`` prefix whose ``[[agents]]`` entry names a ``key_file``
gives a session's messages only to requests that carry the key in ``x-tailfloor-agent-key``.

Without the key, or with a wrong one, the request reaches the upstream as the client sent it
(the oracle: the fake upstream's record of the body it received) and is counted as
``unauthenticated``; the key header never reaches the upstream and never a log line.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fake_upstream import FakeUpstream
from tests.floor.synthetic import Transcript, conversation, system
from tests.floor.test_floor_tenants import hello, rules_dir, send, victim_session, write_session
from tests.inprocess import InProcessProxy

KEY = "k-3f9a1c-alice-secret-canary"
HEADER = "x-tailfloor-agent-key"


class Keyed:
    def __init__(self, proxy: InProcessProxy, victim: dict[str, Any], key_file: Path) -> None:
        self.proxy, self.victim, self.key_file = proxy, victim, key_file


@pytest.fixture(scope="module")
def keyed(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    tmp = tmp_path_factory.mktemp("keyed")
    victim = victim_session(tmp / "alice")
    other = Transcript("01a22a66-0000-7000-8000-0000000000cc")
    conversation(other, 3, text="bob says")
    write_session(tmp / "bob", other)
    key_file = tmp / "alice.key"
    key_file.write_text(KEY + "\n")
    bound = rules_dir(tmp, f'\n[[agents]]\nid = "alice"\nroot = "{tmp / "alice"}"\n'
                           f'key_file = "{key_file}"\n'
                           f'\n[[agents]]\nid = "bob"\nroot = "{tmp / "bob"}"\n')
    proxy = InProcessProxy(fake, "--sessions", str(tmp / "alice"), "--sessions",
                           str(tmp / "bob"), "--rules", str(bound), "--access-log",
                           "--log-level", "DEBUG")
    yield Keyed(proxy, victim, key_file)
    proxy.stop()


def test_with_its_key_the_agent_gets_its_carry_and_the_key_stays_here(
        keyed: Keyed, clean_fake: FakeUpstream) -> None:
    send(keyed.proxy, keyed.victim, {HEADER: KEY}, prefix="/agents/alice")
    _raw, verdict = send(keyed.proxy, hello(system()), {HEADER: KEY}, prefix="/agents/alice")
    assert verdict.startswith("carry; carried="), verdict
    received = clean_fake.chat_requests()
    assert received and all(HEADER not in {k.lower() for k in r.headers} for r in received)
    texts = [str(m.get("content")) for m in orjson.loads(received[-1].body)["messages"]]
    assert any("reply 01a2 turn 39" in t for t in texts)
    assert KEY not in keyed.proxy.logs()


@pytest.mark.parametrize("presented", [None, "not-the-key", KEY + "x", ""])
def test_without_the_key_the_request_passes_untouched_and_is_counted(
        keyed: Keyed, clean_fake: FakeUpstream, presented: str | None) -> None:
    send(keyed.proxy, keyed.victim, {HEADER: KEY}, prefix="/agents/alice")
    before = keyed.proxy.sample("tailfloor_identification_total", method="unauthenticated")
    headers = {} if presented is None else {HEADER: presented}
    for body in (hello(system()), keyed.victim):
        raw, verdict = send(keyed.proxy, body, headers, prefix="/agents/alice")
        assert verdict.startswith("none; reason=unauthenticated"), verdict
        last = clean_fake.chat_requests()[-1]
        assert last.body == raw
        assert HEADER not in {k.lower() for k in last.headers}
    after = keyed.proxy.sample("tailfloor_identification_total", method="unauthenticated")
    assert after == before + 2
    assert KEY not in keyed.proxy.logs()


@pytest.mark.parametrize("prefix", ["", "/agents/bob", "/agents/mallory"])
def test_no_other_prefix_reaches_a_keyed_agent_s_sessions(
        keyed: Keyed, clean_fake: FakeUpstream, prefix: str) -> None:
    send(keyed.proxy, keyed.victim, {HEADER: KEY}, prefix="/agents/alice")
    for body in (hello(system()), keyed.victim):
        raw, verdict = send(keyed.proxy, body, {HEADER: KEY}, prefix=prefix)
        assert not verdict.startswith(("carry", "floor")), (prefix, verdict)
        assert clean_fake.chat_requests()[-1].body == raw


def test_a_changed_key_file_is_read_again(keyed: Keyed, clean_fake: FakeUpstream) -> None:
    new = KEY + "-rotated"
    keyed.key_file.write_text(new)
    try:
        deadline = time.monotonic() + 15
        verdict = ""
        while time.monotonic() < deadline:
            _raw, verdict = send(keyed.proxy, keyed.victim, {HEADER: new}, prefix="/agents/alice")
            if not verdict.startswith("none; reason=unauthenticated"):
                break
            time.sleep(0.2)
        assert not verdict.startswith("none; reason=unauthenticated"), verdict
        _raw, old = send(keyed.proxy, keyed.victim, {HEADER: KEY}, prefix="/agents/alice")
        assert old.startswith("none; reason=unauthenticated"), old
    finally:
        keyed.key_file.write_text(KEY + "\n")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            _raw, verdict = send(keyed.proxy, keyed.victim, {HEADER: KEY}, prefix="/agents/alice")
            if not verdict.startswith("none; reason=unauthenticated"):
                break
            time.sleep(0.2)


def test_the_default_header_names_no_identity_reason(
        fake: FakeUpstream, clean_fake: FakeUpstream, tmp_path: Path) -> None:
    """Without ``--tailfloor-header detailed`` a pass-through says ``none`` and no reason
    that tells a client whether its text matched a session (a membership oracle)."""
    victim = victim_session(tmp_path / "sessions")
    proxy = InProcessProxy(fake, "--sessions", str(tmp_path / "sessions"), "--rules",
                           str(rules_dir(tmp_path)), "--tailfloor-header", "on")
    try:
        _raw, own = send(proxy, victim)
        mallory = hello({"role": "system", "content": "You are Mallory's assistant."})
        _raw, miss = send(proxy, mallory, {"x-tailfloor-session": "no-such-session"})
        assert own.split(";")[0] == "none" and miss.split(";")[0] == "none"
        for word in ("floor_holds", "untrusted", "ambiguous", "segment_mismatch", "unproven",
                     "unidentified", "reason="):
            assert word not in own and word not in miss, (own, miss)
        assert own == miss
    finally:
        proxy.stop()
    off = InProcessProxy(fake, "--sessions", str(tmp_path / "sessions"), "--rules",
                         str(rules_dir(tmp_path)), "--tailfloor-header", "off")
    try:
        raw = orjson.dumps({**victim, "stream": False})
        request = urllib.request.Request(off.url + "/v1/chat/completions", data=raw,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            assert response.headers.get("x-tailfloor") is None
    finally:
        off.stop()
