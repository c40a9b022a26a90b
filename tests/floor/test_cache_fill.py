"""How full the caches kept between requests are, on /metrics (tailfloor_cache_held and
tailfloor_cache_bound), in a real process before and after a restore."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.floor.restore import is_counted
from proxy.transcripts.cache_bounds import cache_bounds
from tests.fake_behaviour import AgentBehaviour
from tests.fake_upstream import FakeUpstream
from tests.floor.test_floor_e2e import post, setup
from tests.inprocess import InProcessProxy

CACHES = ("rendered_bytes", "rendered", "rendered_decoded_bytes", "served_sessions",
          "served_entries", "token_counts", "inspector_bytes")
# not 3 MiB: the renderings get 60% of CACHE_BYTES, which is that, and the test below
# tells the bounds apart by their figures
INSPECTOR_BUDGET = 3 * 1024 * 1024 + 4096
CACHE_BYTES = 5 * 1024 * 1024


def test_the_caches_fill_with_a_restore_and_stay_within_their_bounds(
        fake: FakeUpstream, tmp_path: Path) -> None:
    fake.reset()
    fake.behaviour = AgentBehaviour()
    sessions, rules, body = setup(tmp_path, "enforce")
    proxy = InProcessProxy(fake, "--sessions", str(sessions), "--rules", str(rules),
                           "--inspect-memory-bytes", str(INSPECTOR_BUDGET),
                           "--session-cache-bytes", str(CACHE_BYTES))
    try:
        def held(cache: str) -> float:
            return proxy.sample("tailfloor_cache_held", cache=cache)

        before = {cache: held(cache) for cache in CACHES}
        # nothing served yet: the first scan packs every window and renders nothing
        assert before == dict.fromkeys(CACHES, 0.0)
        _answer, verdict = post(proxy, body)
        assert verdict.startswith("floor; restored=")
        sent = orjson.loads(fake.chat_requests()[-1].body)["messages"]
        restored = sum(1 for m in sent if is_counted(m)) - sum(
            1 for m in body["messages"] if is_counted(m))
        assert restored > 0
        after = {cache: held(cache) for cache in CACHES}
        assert after["served_sessions"] == 1  # the one session the request was matched to
        assert after["served_entries"] >= restored
        assert after["rendered"] >= restored  # each message put back was rendered once
        assert after["rendered_bytes"] > 0
        assert after["token_counts"] >= len(body["messages"])
        assert after["inspector_bytes"] > 0
        # each bound is the share of the flags' figures it names (the token counts: two
        # generations of half)
        shares = cache_bounds(CACHE_BYTES)
        want = {"rendered_bytes": shares.rendered_bytes, "rendered": shares.rendered_entries,
                "rendered_decoded_bytes": shares.decoded_bytes,
                "served_sessions": shares.served_sessions,
                "served_entries": shares.served_entries,
                "token_counts": 2 * (shares.token_counts // 2),
                "inspector_bytes": INSPECTOR_BUDGET}
        bounds = {cache: proxy.sample("tailfloor_cache_bound", cache=cache) for cache in CACHES}
        assert bounds == want
        # distinct figures: a bound exported under another cache's name shows
        assert len(set(bounds.values())) == len(CACHES)
        for cache in CACHES:
            # held decoded: only the renderings of a long tail (none here)
            least = 0 if cache == "rendered_decoded_bytes" else 1
            assert least <= after[cache] <= bounds[cache]
    finally:
        proxy.stop()
