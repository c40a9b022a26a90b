"""Replays of real Pi and OpenClaw requests through the floor (N = 8 and N = 30).

Every recorded request made after a compaction (it carries the agent's summary) or after a
reset (its session has a predecessor or a reset entry, or it is the first request of a new
session) comes out holding the last N raw messages of the transcript, in order and without a
gap before its own; a request that already holds the floor comes out byte for byte.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.floor.fingerprints import Fingerprints
from proxy.floor.identify import identify
from proxy.floor.restore import is_counted, is_internal, wire_key
from proxy.tokens import TokenCounter
from proxy.wire.boundary import role_problems
from tests.floor.harness import FloorHarness
from tests.floor.replay import bodies, catalog_at, chat, expected_tail, sessions
from tests.floor.synthetic import Holder, rules
from tests.transcripts.capture_replay import RUNS

TOKENS = TokenCounter()


def contiguous(part: list[Any], whole: list[Any]) -> bool:
    keys = [wire_key(m) for m in part if not is_internal(m)]
    seen = [wire_key(m) for m in whole if not is_internal(m)]
    return any(seen[i:i + len(keys)] == keys for i in range(len(seen) - len(keys) + 1))


def replay(run: str, n: int) -> list[tuple[int, str, dict[str, Any], Any, Any]]:
    all_sessions = sessions(run)
    prints = Fingerprints()
    out = []
    for number, ts, body in bodies(run):
        catalog = catalog_at(all_sessions, ts)
        rewriter = FloorHarness(Holder(rules(n=n)), TOKENS, catalog, prints=prints)
        c = chat(body)
        out.append((number, run, body, rewriter.decide(c, {}), (catalog, c)))
    return out


CASES = [(run, n) for run in RUNS for n in (8, 30)]


@pytest.mark.parametrize(("run", "n"), CASES, ids=[f"{r}-N{n}" for r, n in CASES])
def test_replayed_requests_hold_the_floor(run: str, n: int) -> None:
    rewritten = 0
    for number, _run, body, decision, (catalog, c) in replay(run, n):
        where = f"{run} request {number}"
        signals = identify(None, {}, body)
        if decision.kind == "none":
            assert decision.body is c.raw, where
            assert decision.verdict != "none; reason=no_anchor", where
            if signals.summary_index is not None and decision.session_id:
                # After a compaction: untouched only when the floor holds or nothing is lost.
                available = sum(1 for m in expected_tail(catalog, decision.session_id, 10_000)
                                if is_counted(m))
                assert decision.verdict in ("none; reason=floor_holds",
                                            "none; reason=nothing_to_add"), where
                if decision.verdict.endswith("nothing_to_add"):
                    assert available <= signals.raw_after_summary + 1, where
            continue
        rewritten += 1
        sent = list(decision.messages or ())
        assert sent[0] == body["messages"][0], where
        assert role_problems(sent) == [], where
        first = signals.first_raw_index or 1
        own = body["messages"][first:]
        assert sent[-len(own):] == own, where
        if decision.kind == "floor":
            sid = decision.session_id
            want = expected_tail(catalog, sid, n + sum(1 for m in own if is_counted(m)))
            # The last N raw messages of the transcript, in order, with no gap.
            lastn = [m for m in want if is_counted(m)][-n:]
            assert contiguous(lastn, sent[first:]), where
            assert sum(1 for m in sent[first:] if is_counted(m)) >= min(
                n, sum(1 for m in expected_tail(catalog, sid, 10_000) if is_counted(m))), where
        else:
            record = catalog.get(decision.source_session)
            assert record is not None, where
            before = None
            if decision.source_session == decision.session_id:
                before = record.resets[-1].entry_id
            want = [m for m in expected_tail(catalog, record.session_id, n, before=before)
                    if is_counted(m)]
            carried = sent[first + 1:-len(own) - 1]
            assert contiguous(want[-len([m for m in carried if is_counted(m)]):], carried), where
            assert sum(1 for m in carried if is_counted(m)) >= min(n, len(want)), where
    if run not in ("oc735-00-precheck", "oc735-00b-compacts", "pi-00-smoke",
                   "pi-01-print-continue", "oc96-01-local"):
        assert rewritten > 0


def test_replay_covers_compactions_and_every_reset_kind() -> None:
    kinds = {}
    for run in ("oc735-01-gateway", "oc96-02-gateway", "pi-04-affinity-headers"):
        for number, _run, _body, decision, _ctx in replay(run, 8):
            kinds.setdefault((run, decision.kind), []).append(number)
    assert kinds[("oc735-01-gateway", "carry")][0] == 19  # first request after sessions.reset
    assert 22 in kinds[("oc96-02-gateway", "carry")]  # after sessions.reset (same id)
    assert 31 in kinds[("oc96-02-gateway", "carry")]  # after the idle rollover (new id)
    assert kinds[("pi-04-affinity-headers", "carry")] == [8]  # Pi new_session
    assert kinds[("pi-04-affinity-headers", "floor")] == [7]
