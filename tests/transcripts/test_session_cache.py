"""--session-cache-bytes: how much of many agents' sessions stays ready between their
requests. Counted by what the transcripts are asked to read again, not by the caches' sizes."""

from __future__ import annotations

import pytest

from proxy.settings import SettingsError
from proxy.transcripts.cache_bounds import DEFAULT_CACHE_BYTES, cache_bounds
from proxy.transcripts.catalog import Catalog
from tests.transcripts.test_rendered_tail import CountingStore, _put
from tests.transcripts.test_views import conversation
from tests.unit.test_settings import parse

AGENTS = 300
TAIL = 30


def _reread_on_the_second_round(cache_bytes: int) -> tuple[int, int]:
    """Entries read for every agent's tail once, and read again on a second round."""
    catalog = Catalog(cache_bytes=cache_bytes)
    stores = {f"agent{i}": CountingStore(conversation(TAIL)) for i in range(AGENTS)}
    for sid, store in stores.items():
        _put(catalog, store, sid)
    for sid in stores:
        assert len(catalog.tail(sid, TAIL)) == TAIL
    first = sum(store.loaded for store in stores.values())
    for sid in stores:
        assert len(catalog.tail(sid, TAIL)) == TAIL
    return first, sum(store.loaded for store in stores.values()) - first


def test_a_cache_large_enough_for_every_agent_at_work_reads_nothing_again() -> None:
    first, again = _reread_on_the_second_round(64 * 1024 * 1024)
    assert first == AGENTS * TAIL and again == 0


def test_a_cache_too_small_for_the_agents_at_work_reads_their_messages_again() -> None:
    first, again = _reread_on_the_second_round(1024 * 1024)
    assert first == AGENTS * TAIL
    assert again > AGENTS * TAIL // 2  # least recently used first: a rotation misses


def test_the_bounds_grow_with_the_memory_and_stay_within_it() -> None:
    small, default, large = (cache_bounds(m) for m in (
        8 * 1024 * 1024, DEFAULT_CACHE_BYTES, 256 * 1024 * 1024))
    for lower, higher in ((small, default), (default, large)):
        assert lower.rendered_bytes < higher.rendered_bytes
        assert lower.served_entries < higher.served_entries
        assert lower.served_sessions < higher.served_sessions
        assert lower.token_counts <= higher.token_counts
    assert default.token_counts == 65_536 < large.token_counts  # as before, unless raised
    # At the default, what one agent's sessions need: some MiB of renderings (counted in the
    # memory they hold), tens of thousands of entries (tests/bench/session_memory.py: ~300
    # bytes an unpacked entry).
    assert 12 * 1024 * 1024 <= default.rendered_bytes <= 20 * 1024 * 1024
    assert 30_000 <= default.served_entries <= 50_000
    for bounds, memory in ((small, 8), (default, 28), (large, 256)):
        assert bounds.rendered_bytes + 300 * bounds.served_entries <= memory * 1024 * 1024


def test_the_setting_comes_from_the_flag_or_the_environment_and_must_be_positive() -> None:
    assert parse([]).session_cache_bytes == DEFAULT_CACHE_BYTES
    assert parse([], {"TAILFLOOR_SESSION_CACHE_BYTES": "201326592"}).session_cache_bytes \
        == 201326592
    assert parse(["--session-cache-bytes", "1048576"]).session_cache_bytes == 1048576
    for bad in ("0", "-5", "9" * 320):
        with pytest.raises(SettingsError, match="session-cache-bytes"):
            parse([], {"TAILFLOOR_SESSION_CACHE_BYTES": bad})
