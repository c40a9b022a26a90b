"""Counting a body past the start it shares with a body seen lately gives what counting it
whole gives, whatever the two bodies are: commas, the first ``\\u`` escape, bytes outside
ASCII. The oracle is the body counted whole with bytes' own methods; the bodies kept stay
within their bounds."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import cast

import orjson
import pytest

from proxy.server.body_cost import MAX_VALUES, body_cost
from proxy.server.body_prefixes import BLOCK, KEY, MIN_BYTES, Counted, RecentBodies, counted
from proxy.server.held_bodies import BodyBudget
from proxy.server.offload import WorkerPool
from proxy.server.parsing import parse
from proxy.server.state import ProxyState
from tests.bench.loadgen import AGENT_BODY


def _check(found: Counted | int, raw: bytes) -> None:
    assert isinstance(found, Counted)
    assert found.total == raw.count(b",")
    assert found.escape == raw.find(b"\\u")
    assert found.ascii == raw.isascii()
    # The marks are the commas before each block's start: a later body relies on them.
    assert found.commas == tuple(raw.count(b",", 0, i * BLOCK)
                                 for i in range(len(raw) // BLOCK + 1))


def _turns(n: int) -> bytes:
    messages = [{"role": "system", "content": "rules, in order: " + "be careful, " * 4000}]
    messages += [{"role": "user", "content": f"turn {i}, words, more words"}
                 for i in range(n)]
    return orjson.dumps({"model": "m", "messages": messages})


def _at(raw: bytes, where: int, insert: bytes) -> bytes:
    return raw[:where] + insert + raw[where:]


CASES = {
    "a growing conversation": [_turns(1), _turns(2), _turns(5), _turns(5)],
    "a shorter body after a longer": [_turns(9), _turns(1)],
    "the same start, another middle": [AGENT_BODY, AGENT_BODY.replace(b"area 200", b"a,r,e,a")],
    "an escape across the last shared byte": [
        _at(AGENT_BODY, 3 * BLOCK - 1, b"\\u00e9"), _at(AGENT_BODY, 3 * BLOCK - 1, b"\\u00e9x")],
    "a backslash as the last shared byte, an escape only in the earlier body": [
        _at(AGENT_BODY, 3 * BLOCK - 1, b"\\u00e9"), _at(AGENT_BODY, 3 * BLOCK - 1, b"\\n00e9")],
    "an escape only in the earlier body's unshared part": [
        _at(AGENT_BODY, 9 * BLOCK + 7, b"\\u2603"), AGENT_BODY],
    "an escape only in the later body's new part": [AGENT_BODY, AGENT_BODY + b"\\u2603"],
    "text outside ASCII in the shared start": [
        _at(AGENT_BODY, 2 * BLOCK + 5, "\u00e9".encode()),
        _at(AGENT_BODY, 2 * BLOCK + 5, "\u00e9".encode()) + b"tail"],
    "text outside ASCII in the last shared block": [
        _at(AGENT_BODY, 2 * BLOCK + 5, "\u00e9".encode()),
        _at(AGENT_BODY, 2 * BLOCK + 5, "\u00e9".encode())[:3 * BLOCK + 10] + b"," * BLOCK],
    "a byte outside ASCII as the first unshared byte": [
        AGENT_BODY, _at(AGENT_BODY, 5 * BLOCK, b"\xe9")],
    "text outside ASCII only past the shared start": [
        AGENT_BODY, _at(AGENT_BODY, 10 * BLOCK + 3, "\U0001f600".encode())],
    "text outside ASCII in the last partial block": [
        AGENT_BODY, AGENT_BODY[:-2] + "\u00e9\"}".encode()],
    "a body that ends on a block's end": [AGENT_BODY[:8 * BLOCK], AGENT_BODY[:8 * BLOCK]],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_body_counted_past_a_shared_start_counts_as_counted_whole(case: str) -> None:
    recent = RecentBodies()
    for raw in CASES[case]:
        assert len(raw) >= MIN_BYTES
        _check(recent.counted(raw), raw)
    # Each body of the case was kept in its turn: the last one is there to be drawn on.
    assert recent.held == len(CASES[case][-1])


def test_random_bodies_with_shared_starts_count_as_counted_whole() -> None:
    rng = random.Random(28)
    alphabet = b'ab ,,\\u"{}[]0' + "\u00e9".encode()
    base = bytes(rng.choice(alphabet) for _ in range(9 * BLOCK))
    recent = RecentBodies()
    for _ in range(60):
        raw = bytearray(base[:rng.randrange(MIN_BYTES, len(base))])
        for _ in range(rng.randrange(3)):
            where = rng.randrange(len(raw))
            raw[where:where + rng.randrange(1, 8)] = bytes(
                rng.choice(alphabet) for _ in range(rng.randrange(8)))
        raw += bytes(rng.choice(alphabet) for _ in range(rng.randrange(2 * BLOCK)))
        _check(recent.counted(bytes(raw)), bytes(raw))


def test_a_known_body_of_another_start_is_never_drawn_on() -> None:
    first = counted(AGENT_BODY)
    assert isinstance(first, Counted)
    other = b"[" + b",".join([b"[]"] * 20_000) + b"]"
    _check(counted(other, first), other)


def test_too_many_commas_stop_the_count_before_wide_text_is_looked_for() -> None:
    many = b"[" + b",".join([b"0"] * (MAX_VALUES + 1)) + b"]"
    recent = RecentBodies()
    assert recent.counted(many, MAX_VALUES - 1) == MAX_VALUES
    assert recent.held == 0  # not kept: it will not be parsed
    assert not body_cost(many, dialect=False, recent=recent).parsable


def test_the_estimate_with_recent_bodies_is_the_estimate_without() -> None:
    recent = RecentBodies()
    for raw in [AGENT_BODY, AGENT_BODY, *CASES["a growing conversation"],
                *CASES["an escape only in the later body's new part"]]:
        for dialect in (False, True):
            assert body_cost(raw, dialect=dialect, recent=recent) == body_cost(
                raw, dialect=dialect)


def test_the_bodies_kept_stay_within_their_bounds() -> None:
    recent = RecentBodies(max_entries=3, max_bytes=5 * MIN_BYTES, max_kept=2 * MIN_BYTES)
    for i in range(20):
        raw = bytes([65 + i]) * KEY + b"x" * (MIN_BYTES + i * 100)
        recent.counted(raw)
        assert len(recent.kept()) <= 3
        assert recent.held <= 5 * MIN_BYTES
    assert recent.held == sum(len(raw) for raw in recent.kept())
    # A body over the bound of one is counted, not kept.
    big = b"y" * (2 * MIN_BYTES + 1)
    _check(recent.counted(big), big)
    assert all(raw is not big for raw in recent.kept())
    assert RecentBodies().max_kept <= 1024 * 1024  # the 8 MB bodies of a hostile load
    # Small bodies are counted whole and not kept either.
    small = b"z" * (MIN_BYTES - 1)
    _check(recent.counted(small), small)
    assert all(raw is not small for raw in recent.kept())


async def test_parsing_draws_on_and_keeps_the_proxys_recent_bodies() -> None:
    recent = RecentBodies()
    state = cast(ProxyState, SimpleNamespace(
        bodies=BodyBudget(64 * 1024 * 1024), parsing=asyncio.Semaphore(1),
        offload=WorkerPool(1), recent_bodies=recent))
    grown = AGENT_BODY[:-2] + b',{"role":"user","content":"next turn, more words"}]}'
    for raw in (AGENT_BODY, grown):
        hold = state.bodies.hold()
        chat = await parse(state, raw, hold, None, None)
        assert chat.inspected
        assert hold.amount == body_cost(raw, dialect=False).memory
        hold.release()
    assert recent.kept() == [grown]  # the same first KB: the latest in its place


def test_one_credential_s_bodies_are_never_counted_from_another_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting past a shared start is faster: were bodies shared across credentials, that
    difference would tell one tenant whether another sent a body that begins as its own."""
    import proxy.server.body_prefixes as prefixes
    given: list[Counted | None] = []
    real = prefixes.counted

    def spy(raw: bytes, known: Counted | None = None, max_commas: int | None = None
            ) -> Counted | int:
        given.append(known)
        return real(raw, known, max_commas)

    monkeypatch.setattr(prefixes, "counted", spy)
    recent = RecentBodies()
    first, later = _turns(3), _turns(4)
    recent.counted(first, owner="authorization\x00Bearer tenant-a")
    recent.counted(later, owner="authorization\x00Bearer tenant-b")
    assert given[-1] is None  # another credential: counted whole
    recent.counted(later, owner="authorization\x00Bearer tenant-a")
    assert given[-1] is not None and given[-1].raw == first  # its own: past the shared start
    assert len(recent.kept()) == 2
