"""Benchmark: the floor's added cost per request, warm caches.

A 500-message (~100k-token) Pi conversation in a real JSONL transcript, compacted, among
10,000 other tracked sessions (in memory, indexed like real ones). Measures, wall and CPU:

- identification alone (request signals + catalog lookup + lineage rules);
- pass-through when the floor already holds (the request keeps 470 raw messages, N = 30);
- a restoring rewrite (N = 500: 30 messages put back before the anchor, budget checked,
  body serialised);
- the same rewrite in shadow mode (computed, original bytes sent).

Targets (issue 4): rewrite p50 <= 5 ms, p99 <= 25 ms; identification p99 <= 0.5 ms.

Usage: python tests/bench/bench_floor.py [--runs 300]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson

from proxy.identity.identify import identify
from proxy.identity.lineage import find_session
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.jsonl import JsonlTranscript
from proxy.transcripts.records import SessionInfo
from tests.floor.bench_parts import percentiles, timed
from tests.floor.conversation import text
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import (
    Holder,
    Transcript,
    chat,
    conversation,
    put,
    request_for,
    rules,
)

TARGET = "01a22b00-0000-7000-8000-00000000beef"


def big_transcript(directory: Path) -> Transcript:
    import random

    rng = random.Random(3)
    t = Transcript(TARGET)
    for i in range(188):
        t.user(f"turn {i}: " + text(rng, 230))
        if i % 3 == 0:
            _entry, ids = t.tool_calls(["bash"])
            t.tool_result(ids[0], text(rng, 230))
        t.assistant(text(rng, 230))
    ids = t.message_ids()
    t.compaction("## Goal\n" + text(rng, 300), ids[-470])
    t.user("the question after the compaction")
    header = {"type": "session", "version": 3, "id": TARGET,
              "timestamp": "2026-11-30T02:00:00.000Z", "cwd": "/work"}
    path = directory / f"2026-11-30T02-00-00-000Z_{TARGET}.jsonl"
    path.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in [header, *t.objs]))
    return t


def build(directory: Path, others: int) -> tuple[Catalog, Transcript]:
    catalog = Catalog(tail_limit=1000)
    for i in range(others):
        t = Transcript(f"{i:08x}-other")
        conversation(t, 4, text=f"other {i}")
        put(catalog, t, group=f"dir-{i}", relink=False)
    target = big_transcript(directory)
    store = JsonlTranscript.open(directory / f"2026-11-30T02-00-00-000Z_{TARGET}.jsonl",
                                 lambda *a: None)
    info = SessionInfo(session_id=TARGET, source="pi", era="pi", location="bench",
                       agent_id="pi", group=str(directory))
    catalog.put(info, store, store.read_window(None))
    catalog.relink()
    return catalog, target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        catalog, _target = build(Path(tmp), args.sessions)
        body: dict[str, Any] = request_for(catalog, TARGET)
        c = chat(body)
        tokens = TokenCounter()
        tokens.encodings.get("o200k_base")
        counted = tokens.request(body, "o200k_base")
        print(f"conversation: {len(body['messages'])} request messages, "
              f"{counted.messages} tokens; {len(catalog)} tracked sessions")
        spec = {"window": 400_000, "encoding": "o200k_base"}
        own = identify(None, {}, body).raw_after_summary
        holds = FloorHarness(Holder(rules(n=30, **spec)), tokens, catalog)
        # N just above what the request keeps: 30 messages to put back.
        restore = FloorHarness(Holder(rules(n=own + 30, **spec)), tokens, catalog)
        shadow = FloorHarness(Holder(rules(n=own + 30, mode="shadow", **spec)), tokens,
                               catalog)
        decision = restore.decide(c, {})
        assert decision.kind == "floor", decision.verdict
        print(f"rewrite: {decision.verdict}, +{decision.added_tokens} tokens, "
              f"body {len(c.raw)} -> {len(decision.body)} bytes")
        assert holds.decide(c, {}).verdict == "none; reason=floor_holds"

        def identification() -> None:
            signals = identify(None, {}, body)
            found = find_session(signals, body, catalog, prints=restore.prints, print_="fp")
            assert found.session_id == TARGET

        # The catalog has not seen this compaction yet (it lags the agent by a few ms):
        # the anchor is searched by content instead.
        lagging = {**body, "messages": list(body["messages"])}
        lagging["messages"][1] = {"role": "user", "content": [{"type": "text", "text": (
            "The conversation history before this point was compacted into the following "
            "summary:\n\n<summary>\na newer summary\n</summary>")}]}
        lag = chat(lagging)
        assert restore.decide(lag, {}).kind == "floor"

        # Before any compaction (no summary: earlier texts are looked up too), and with the
        # transcript one turn behind (the newest user text is in no transcript yet).
        plain = {**body, "messages": [body["messages"][0], *body["messages"][2:]]}
        ahead = {**plain, "messages": [*plain["messages"], {
            "role": "user", "content": [{"type": "text", "text": "a turn not written yet"}]}]}

        def identified(request: dict[str, Any]) -> Callable[[], None]:
            def run() -> None:
                signals = identify(None, {}, request)
                found = find_session(signals, request, catalog, prints=restore.prints,
                                     print_="fp")
                assert found.session_id == TARGET, found
            return run

        for label, fn in (
                ("identification alone", identification),
                ("identification, no summary", identified(plain)),
                ("identification, lagging turn", identified(ahead)),
                ("pass-through (floor holds)", lambda: holds.rewrite(c, {})),
                ("rewrite (restore 30 of 500)", lambda: restore.rewrite(c, {})),
                ("shadow (computed, not sent)", lambda: shadow.rewrite(c, {})),
                ("rewrite, anchor by content", lambda: restore.rewrite(lag, {}))):
            for _ in range(20):
                fn()  # warm the caches
            print(f"{label:30s}", percentiles(timed(fn, args.runs)))


if __name__ == "__main__":
    main()
