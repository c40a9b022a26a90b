"""Nothing a client says about identity puts another session's messages into its request.

Through a real ``tailfloor serve``: a victim's Pi session is tracked and its own request has
been seen (so its fingerprint is recorded); then requests that only *claim* an identity, or
that share a system prompt across tenants, must reach the upstream byte for byte. The oracle
is the fake upstream's record of what it received, compared with what the client sent.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from tests.conftest import ProxyProcess
from tests.fake_upstream import FakeUpstream
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import (
    PI_TOOLS,
    Holder,
    Transcript,
    chat,
    conversation,
    put,
    request_for,
    rules,
    system,
)
from tests.inprocess import InProcessProxy

VICTIM = "01a22a55-0000-7000-8000-0000000000aa"
RULES = """[defaults]
min_tail_messages = 30

[[models]]
pattern = "fake*"
context_window = 200000
encoding = "estimate"
margin = 0.0
"""


def write_session(root: Path, t: Transcript, stamp: str = "2026-11-30T02-00-00-000Z") -> None:
    folder = root / "--home-a-project--"
    folder.mkdir(parents=True, exist_ok=True)
    header = {"type": "session", "version": 3, "id": t.session_id,
              "timestamp": "2026-11-30T02:00:00.000Z", "cwd": "/home/a/project"}
    lines = [orjson.dumps(o) for o in [header, *t.objs]]
    (folder / f"{stamp}_{t.session_id}.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def victim_session(root: Path) -> dict[str, Any]:
    """A 40-turn Pi session on disk; returns the request Pi itself would send next."""
    t = Transcript(VICTIM)
    conversation(t, 40)
    write_session(root, t)
    catalog = Catalog()
    put(catalog, t)
    return request_for(catalog, VICTIM)


def send(proxy: ProxyProcess, body: dict[str, Any], headers: dict[str, str] | None = None,
         prefix: str = "") -> tuple[bytes, str]:
    raw = orjson.dumps({**body, "stream": False})
    request = urllib.request.Request(proxy.url + prefix + "/v1/chat/completions", data=raw,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
        return raw, response.headers["x-tailfloor"]


def hello(sys: dict[str, Any]) -> dict[str, Any]:
    return {"model": "fake-model", "tools": PI_TOOLS,
            "messages": [sys, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}


def rules_dir(tmp: Path, extra: str = "") -> Path:
    folder = tmp / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "floor.toml").write_text(RULES + extra)
    return folder


@pytest.fixture(scope="module")
def one_root(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[ProxyProcess, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("one-root")
    body = victim_session(tmp / "sessions")
    process = InProcessProxy(fake, "--sessions", str(tmp / "sessions"),
                           "--rules", str(rules_dir(tmp)))
    yield process, body
    process.stop()


def test_the_victim_itself_is_identified(one_root: tuple[ProxyProcess, dict[str, Any]],
                                         clean_fake: FakeUpstream) -> None:
    proxy, body = one_root
    _raw, verdict = send(proxy, body)
    assert verdict.startswith("none; reason=floor_holds")


@pytest.mark.parametrize("claim", [
    {"x-tailfloor-session": "01a22a55-0000-7000-8000-00000000ffff"},
    {"session_id": "01a22a55-0000-7000-8000-00000000fff1"},
    {"x-session-affinity": "01a22a55-0000-7000-8000-00000000fff2:3"},
    {"prompt_cache_key": "01a22a55-0000-7000-8000-00000000fff3"},
])
@pytest.mark.parametrize("prefix", ["", "/agents/mallory"])
def test_a_claimed_new_id_with_another_prompt_gets_nothing(
        one_root: tuple[ProxyProcess, dict[str, Any]], clean_fake: FakeUpstream,
        claim: dict[str, str], prefix: str) -> None:
    proxy, victim = one_root
    send(proxy, victim)  # the victim's own request: its fingerprint is recorded
    body = hello({"role": "system", "content": "You are Mallory's helpful assistant."})
    headers = {k: v for k, v in claim.items() if k != "prompt_cache_key"}
    if "prompt_cache_key" in claim:
        body["prompt_cache_key"] = claim["prompt_cache_key"]
    raw, verdict = send(proxy, body, headers, prefix)
    assert verdict.startswith("none"), verdict
    assert clean_fake.chat_requests()[-1].body == raw


def test_the_sidecar_carry_into_pi_s_next_session_still_works(
        one_root: tuple[ProxyProcess, dict[str, Any]], clean_fake: FakeUpstream) -> None:
    proxy, victim = one_root
    send(proxy, victim)
    _raw, verdict = send(proxy, hello(system()))
    assert verdict.startswith("carry; carried="), verdict
    sent = orjson.loads(clean_fake.chat_requests()[-1].body)
    texts = [str(m.get("content")) for m in sent["messages"]]
    assert any("reply 01a2 turn 39" in t for t in texts)  # the victim's newest reply


@pytest.fixture(scope="module")
def two_roots(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[ProxyProcess, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("two-roots")
    body = victim_session(tmp / "alice")
    other = Transcript("01a22a66-0000-7000-8000-0000000000bb")
    conversation(other, 3, text="bob says")
    write_session(tmp / "bob", other)
    bound = rules_dir(tmp, f'\n[[agents]]\nid = "alice"\nroot = "{tmp / "alice"}"\n'
                           f'\n[[agents]]\nid = "bob"\nroot = "{tmp / "bob"}"\n')
    process = InProcessProxy(fake, "--sessions", str(tmp / "alice"), "--sessions",
                           str(tmp / "bob"), "--rules", str(bound))
    yield process, body
    process.stop()


def test_no_identity_and_two_roots_is_untrusted(
        two_roots: tuple[ProxyProcess, dict[str, Any]], clean_fake: FakeUpstream) -> None:
    proxy, victim = two_roots
    send(proxy, victim)
    before = proxy.sample("tailfloor_identification_total", method="untrusted")
    for prefix in ("", "/agents/mallory", "/agents/bob"):
        raw, verdict = send(proxy, hello(system()), prefix=prefix)
        assert verdict.startswith("none"), (prefix, verdict)
        assert clean_fake.chat_requests()[-1].body == raw
    assert proxy.sample("tailfloor_identification_total", method="untrusted") >= before + 2


def test_an_agent_prefix_bound_to_the_root_may_carry(
        two_roots: tuple[ProxyProcess, dict[str, Any]], clean_fake: FakeUpstream) -> None:
    proxy, victim = two_roots
    send(proxy, victim, prefix="/agents/alice")
    _raw, verdict = send(proxy, hello(system()), prefix="/agents/alice")
    assert verdict.startswith("carry; carried="), verdict


def test_a_claimed_known_id_plants_no_fingerprint(
        two_roots: tuple[ProxyProcess, dict[str, Any]], clean_fake: FakeUpstream) -> None:
    proxy, victim = two_roots
    send(proxy, victim, prefix="/agents/alice")
    mallory = hello({"role": "system", "content": "You are Mallory's helpful assistant."})
    send(proxy, mallory, {"x-tailfloor-session": VICTIM}, prefix="/agents/alice")
    raw, verdict = send(proxy, mallory, prefix="/agents/alice")
    assert verdict.startswith("none"), verdict
    assert clean_fake.chat_requests()[-1].body == raw


# ---------------------------------------------------------------- in-process, exact cases
def test_a_named_session_with_an_empty_segment_and_its_own_prompt_gets_nothing() -> None:
    """The attack of issue 27: a client with its own system prompt names a real session (one
    root, so the tenant is certain) that has just been reset: nothing of it is carried."""
    catalog = reset_session()
    rewriter = FloorHarness(Holder(rules(n=8)), TokenCounter(), catalog, single_tenant=True)
    rewriter.decide(chat(before_reset(catalog)), {})
    for claim in ({"x-tailfloor-session": VICTIM}, {}):
        mallory = hello({"role": "system", "content": "You are Mallory's helpful assistant."})
        decision = rewriter.decide(chat(mallory), claim)
        assert decision.kind == "none" and not decision.added, decision.verdict


def before_reset(catalog: Catalog) -> dict[str, object]:
    """The last request the session's agent sent before the reset."""
    record = catalog.full(VICTIM)
    assert record is not None and record.resets
    closed = [m for r in catalog.tail(VICTIM, 200, before=record.resets[-1].entry_id)
              for m in r.messages]
    return {**request_for(catalog, VICTIM), "messages": [system(), *closed]}


def reset_session() -> Catalog:
    t = Transcript(VICTIM)
    conversation(t, 12)
    t.reset()
    catalog = Catalog()
    put(catalog, t)
    return catalog


@pytest.mark.parametrize("single_tenant,expected", [(False, "untrusted"), (True, "carry")])
def test_a_named_session_with_an_empty_segment_carries_only_in_a_certain_tenant(
        single_tenant: bool, expected: str) -> None:
    catalog = reset_session()
    rewriter = FloorHarness(Holder(rules(n=8)), TokenCounter(), catalog,
                             single_tenant=single_tenant)
    # The session's own request before its reset (its prompt recorded), then the claim.
    rewriter.decide(chat(before_reset(catalog)), {})
    decision = rewriter.decide(chat(hello(system())), {"x-tailfloor-session": VICTIM})
    if expected == "carry":
        assert decision.kind == "carry" and decision.added_raw >= 8
    else:
        assert decision.kind == "none" and decision.method == "untrusted"
