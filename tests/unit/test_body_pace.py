"""A forwarded body's time is what its client takes, not what its consumer takes; the drain
never trips on a body timer that already fired; a gzip body of many members is refused
before its members cost time quadratic in a read's size; the kept bodies are keyed by a
hash of the credential, never by the credential itself."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from typing import cast

import pytest
from multidict import CIMultiDict

from proxy.errors import BodyTimeout, InvalidBody
from proxy.recovery.credential import CredentialScopes
from proxy.server.body import MAX_MEMBERS, Decoder
from proxy.server.draining import BodyReads
from proxy.server.passthrough import BodyPace, limited


async def _at_once(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        await asyncio.sleep(0)  # a read from the socket: every piece already there
        yield piece


async def test_the_consumer_s_time_is_not_the_client_s() -> None:
    """The upstream takes longer between two pieces than the whole allowance; the client
    had sent everything at once: no timeout."""
    pace = BodyPace(grace=0.1, rate=1_000_000)
    got = []
    async for piece in limited(_at_once([b"a" * 10] * 4), 1000, pace, BodyReads()):
        got.append(piece)
        await asyncio.sleep(0.15)  # a slow upstream write
    assert got == [b"a" * 10] * 4


async def test_a_client_that_stops_is_still_cut_off() -> None:
    async def stalls() -> AsyncIterator[bytes]:
        yield b"{"
        await asyncio.sleep(30)
        yield b"}"

    pace = BodyPace(grace=0.1, rate=1_000_000)
    with pytest.raises(BodyTimeout):
        async for _ in limited(stalls(), 1000, pace, BodyReads()):
            pass


class _Fired:
    """A timer whose callback ran while its task has not resumed yet: asyncio refuses to
    reschedule it (RuntimeError: Cannot change state of expiring Timeout)."""

    def expired(self) -> bool:
        return True

    def when(self) -> float:
        return 1.0

    def reschedule(self, when: float | None) -> None:
        raise RuntimeError("Cannot change state of expiring Timeout")


async def test_the_drain_passes_over_a_timer_that_fired() -> None:
    reads = BodyReads()
    fired = cast(asyncio.Timeout, _Fired())
    with reads.reading(fired):
        reads.drain(10.0)  # raised before: the drain (and the shutdown) stopped there
    assert reads.draining


def test_a_gzip_body_of_many_members_is_refused() -> None:
    member = gzip.compress(b"")
    decoder = Decoder("gzip", 1 << 20)
    assert list(decoder.feed(member * MAX_MEMBERS)) == []  # a few members: fine
    with pytest.raises(InvalidBody):
        list(Decoder("gzip", 1 << 20).feed(member * (MAX_MEMBERS + 1)))
    several = Decoder("gzip", 1 << 20)
    assert b"".join(several.feed(gzip.compress(b"ab") + gzip.compress(b"cd"))) == b"abcd"


def test_kept_bodies_are_keyed_by_a_hash_of_the_credential() -> None:
    scopes = CredentialScopes((b"a process's key",))
    token = "sk-secret-token-value-1234567890"
    first = scopes.first(CIMultiDict({"Authorization": f"Bearer {token}"}))
    other = scopes.first(CIMultiDict({"Authorization": "Bearer sk-other"}))
    none = scopes.first(CIMultiDict())
    assert token not in first and "secret" not in first
    assert first and other and first != other and none == ""
