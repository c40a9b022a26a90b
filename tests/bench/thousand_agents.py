"""A thousand agents on one replica: many sessions tracked, a streamed request every few seconds.

    python -m tests.bench.thousand_agents [--tracked 50000] [--active 1000] [--interval 10]
                                          [--minutes 10] [--openclaw-share 0.2]

Writes ``tracked`` sessions into a temporary root: Pi JSONL files and OpenClaw SQLite
databases (``--per-db`` sessions each, the real schema copied from the test fixtures), with
sizes drawn from a log-normal around the fixtures' (median 16 KB, a long tail) and one file
in 2,500 over 5 MB. ``active`` of the Pi sessions are agents still at work: compacted
conversations whose requests tailfloor identifies by content and restores (the heaviest
request it serves; see sessions_scale.py). Each agent sends a streamed request (``events``
events) after a pause drawn from an exponential of mean ``interval`` seconds, then writes the
turn to its transcript, for ``minutes``.

The same arrival process runs first straight to the upstream (``--baseline-minutes``) for the
first-chunk times without tailfloor. Through tailfloor it reports the added time to first
chunk p50/p99, CPU as a share of one core, RSS sampled every 5 s and its least-squares slope
in MB per minute, and how the answers were decided (``x-tailfloor``). Targets (issue 28, 2):
added p99 <= 50 ms, <= 40% of one core, RSS flat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from tests.bench.bench_transcripts import session_text
from tests.bench.cold_start import fake_upstream, serving
from tests.bench.loadgen import measure_stream, percentile
from tests.bench.procs import CpuMeter, rss_mb
from tests.bench.sessions_scale import (
    RESTORED,
    TURNS_BEFORE,
    Session,
    active_session,
    cache_fill,
    script_replies,
    session_copy,
)
from tests.bench.soak_proxy import slope_mb_per_min

FIXTURE_DB = (Path(__file__).resolve().parents[1] / "fixtures" / "transcripts" / "captures"
              / "oc96-state" / "agents" / "main" / "agent" / "openclaw-agent.sqlite")
BIG = 5_500_000  # bytes of the files over 5 MB
_EMPTIED = ("transcript_events", "transcript_event_identities", "session_windows",
            "session_nodes", "transcript_rewrite_watermarks", "session_transcript_index_state",
            "session_transcript_active_events", "session_canonical_validation_pending",
            "session_participants")


def drawn_size(rng: random.Random, n: int) -> int:
    if n % 2500 == 1249:
        return BIG
    return int(min(4_000_000, max(2_000, rng.lognormvariate(9.68, 1.1))))  # e^9.68 ~ 16 KB


def _empty_db(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(f"file:{FIXTURE_DB}?mode=ro", uri=True)
    conn = sqlite3.connect(path, isolation_level=None)
    source.backup(conn)
    source.close()
    conn.create_function("octet_length", 1, lambda v: None if v is None else len(
        v.encode() if isinstance(v, str) else bytes(v)), deterministic=True)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN")
    for table in _EMPTIED:
        conn.execute(f"DELETE FROM {table}")
    return conn


def _window_row(conn: sqlite3.Connection) -> tuple[list[str], list[Any]]:
    """The columns of a real session_windows row from the fixture, to copy per session."""
    source = sqlite3.connect(f"file:{FIXTURE_DB}?mode=ro", uri=True)
    cur = source.execute("SELECT * FROM session_windows WHERE previous_session_id IS NULL "
                         "AND session_key = 'agent:main:main'")
    row = list(cur.fetchone())
    names = [d[0] for d in cur.description]
    source.close()
    return names, row


def write_openclaw(root: Path, agent: int, first: int, count: int, rng: random.Random) -> int:
    """``count`` OpenClaw sessions in one agent database; their event bytes in all."""
    conn = _empty_db(root / "agents" / f"agent{agent}" / "agent" / "openclaw-agent.sqlite")
    names, template = _window_row(conn)
    marks = ", ".join("?" for _ in names)
    total = 0
    for n in range(first, first + count):
        sid, text = session_text(n, drawn_size(rng, n), rng)
        lines = text.splitlines()
        header = orjson.loads(lines[0])
        header["version"] = 4
        lines[0] = orjson.dumps(header).decode()
        created = 1796000000000 + n * 1000
        row = dict(zip(names, template, strict=True))
        row.update(session_id=sid, session_key=f"agent:agent{agent}:s{n}",
                   created_at=created)
        conn.execute(f"INSERT INTO session_windows ({', '.join(names)}) VALUES ({marks})",
                     [row[k] for k in names])
        for seq, line in enumerate(lines):
            conn.execute("INSERT INTO transcript_events (session_id, seq, event_json, "
                         "created_at, event_utf8_bytes) VALUES (?, ?, ?, ?, ?)",
                         (sid, seq, line, created + seq, len(line.encode())))
            if seq:
                obj = orjson.loads(line)
                conn.execute("INSERT INTO transcript_event_identities (session_id, event_id, "
                             "seq, event_type, parent_id, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                             (sid, obj["id"], seq, obj["type"], obj.get("parentId"),
                              created + seq))
            total += len(line) + 1
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return total


def generate(root: Path, tracked: int, active: int, openclaw_share: float, per_db: int,
             *, turns_before: int = TURNS_BEFORE) -> tuple[list[Session], dict[str, int]]:
    """The sessions root; the active sessions (the last one to warm up with) and a census."""
    rng = random.Random(2028)
    pi_root, oc_root = root / "pi", root / "openclaw"
    sessions = [active_session(pi_root, i, turns_before) for i in range(active + 1)]
    oc_count = int(tracked * openclaw_share)
    pi_count = tracked - oc_count - len(sessions)
    pi_bytes = 0
    for n in range(pi_count):
        folder = pi_root / f"--home-user-project{n // 100}--"
        folder.mkdir(parents=True, exist_ok=True)
        sid, text = session_text(n, drawn_size(rng, n), rng)
        (folder / f"2026-11-01T00-00-00-000Z_{sid}.jsonl").write_text(text)
        pi_bytes += len(text)
    oc_bytes = 0
    for agent, first in enumerate(range(0, oc_count, per_db)):
        oc_bytes += write_openclaw(oc_root, agent, 10_000_000 + first,
                                   min(per_db, oc_count - first), rng)
    return sessions, {"pi_sessions": pi_count + len(sessions), "pi_bytes": pi_bytes,
                      "openclaw_sessions": oc_count, "openclaw_bytes": oc_bytes,
                      "over_5mb": sum(1 for n in range(tracked) if n % 2500 == 1249)}


def windows_p99(timeline: list[tuple[float, float, str]], width: float) -> list[float]:
    """The p99 first-chunk time (ms) of the requests started in each window of ``width`` s."""
    buckets: dict[int, list[float]] = {}
    for at, first, _verdict in timeline:
        buckets.setdefault(int(at // width), []).append(first)
    return [round(percentile(sorted(buckets[k]), 99) * 1e3, 1) for k in sorted(buckets)]


def after_burst(timeline: list[tuple[float, float, str]], skip: float
                ) -> dict[str, dict[str, float]]:
    """First-chunk time p50 / p99 / max (ms) of the requests started after ``skip`` s, in all
    and by verdict."""
    groups: dict[str, list[float]] = {}
    for at, first, verdict in timeline:
        if at >= skip:
            groups.setdefault("all", []).append(first)
            groups.setdefault(verdict, []).append(first)
    return {name: {"count": len(v), "p50": round(percentile(sorted(v), 50) * 1e3, 1),
                   "p99": round(percentile(sorted(v), 99) * 1e3, 1),
                   "max": round(max(v) * 1e3, 1)} for name, v in groups.items()}


async def load(port: int, sessions: list[Session], interval: float, seconds: float,
               write: bool, *, compact_every: int = 0) -> dict[str, Any]:
    """Every session asks after an exponential pause of mean ``interval`` until ``seconds``
    have passed; what each answer took and how it was decided. ``compact_every``: turns
    after which an agent compacts (0: never)."""
    firsts: list[float] = []
    timeline: list[tuple[float, float, str]] = []  # (seconds from the start, first chunk, verdict)
    failures: dict[str, int] = {}
    samples: list[str] = []
    busy: dict[int, int] = {}  # 10-s window -> requests passed through for want of time
    verdicts: dict[str, int] = {}
    errors = cut = 0
    ends = time.monotonic() + seconds

    async def agent(s: Session, rng: random.Random) -> None:
        nonlocal errors, cut
        await asyncio.sleep(rng.uniform(0, interval))
        while time.monotonic() < ends:
            at = time.monotonic() - began
            result = await measure_stream(port, orjson.dumps(s.body))
            if result.status != 200 or not result.events:
                errors += 1
                # What a request without events got: its status and the verdict or the
                # start of its body (a 503 of the body budget, an answer cut short...).
                why = f"{result.status} {result.headers.get('x-tailfloor', '')}".strip()
                failures[why] = failures.get(why, 0) + 1
                if len(samples) < 5:
                    samples.append(f"{why}: {result.text[:200]}")
            if result.error_events:  # a 200 whose stream ended with an error event
                cut += 1
            verdict = result.headers.get("x-tailfloor", "(none)")
            key = RESTORED if verdict.startswith(RESTORED) else verdict
            if result.status == 200 and result.events:
                firsts.append(result.first_chunk)
                timeline.append((at, result.first_chunk, key))
            if verdict == "none; reason=busy":  # when the floor's bound passed it through
                window = int(at // 10)
                busy[window] = busy.get(window, 0) + 1
            verdicts[key] = verdicts.get(key, 0) + 1
            if compact_every and s.since_compaction + 1 >= compact_every:
                s.next_turn_compacted(write)
            else:
                s.next_turn(write)
            # The last pause is cut at the end, so idle tails do not dilute the CPU share.
            await asyncio.sleep(min(rng.expovariate(1 / interval),
                                    max(0.0, ends - time.monotonic())))

    began = time.monotonic()
    await asyncio.gather(*(agent(s, random.Random(i)) for i, s in enumerate(sessions)))
    firsts.sort()
    return {"requests": len(firsts) + errors, "errors": errors, "cut_off": cut,
            "failures": failures,
            "failure_samples": samples,
            "seconds": round(time.monotonic() - began, 1),
            "ttfc_p50_ms": round(percentile(firsts, 50) * 1e3, 2),
            "ttfc_p99_ms": round(percentile(firsts, 99) * 1e3, 2), "verdicts": verdicts,
            # The first requests find nothing kept (the cold burst): the p99 of each window
            # of 10 s says whether the tail is the start or the whole run.
            "ttfc_p99_by_10s_ms": windows_p99(timeline, 10.0),
            # After the cold burst, by how each request was decided: whether what is slow
            # is the floor's work (restored) or what every request shares (floor holds).
            "after_30s_by_verdict_ms": after_burst(timeline, 30.0),
            "busy_by_10s": [busy.get(w, 0) for w in range(max(busy, default=-1) + 1)]}


async def through_tailfloor(port: int, admin: int, pid: int, sessions: list[Session], *,
                            interval: float, seconds: float, compact_every: int = 0
                            ) -> dict[str, Any]:
    samples: list[tuple[float, float]] = []
    caches: list[dict[str, list[float]]] = []
    began = time.monotonic()

    async def sample() -> None:
        while True:
            at = time.monotonic() - began
            samples.append((at, rss_mb(pid)))
            if at % 60 < 5:  # beside RSS by minute: whether a rise is a cache still filling
                try:
                    caches.append(await asyncio.to_thread(cache_fill, admin))
                except OSError as exc:  # a scrape that timed out: that minute has none
                    print(f"no cache figures at {at:.0f} s: {exc}", file=sys.stderr)
                    caches.append({})
            await asyncio.sleep(5)

    sampler = asyncio.create_task(sample())
    meter = CpuMeter(pid)
    meter.start()
    out = await load(port, sessions, interval, seconds, write=True,
                     compact_every=compact_every)
    cpu = meter.stop()
    sampler.cancel()
    samples.append((time.monotonic() - began, rss_mb(pid)))
    final = await asyncio.to_thread(cache_fill, admin)
    out.update(cpu_seconds=round(cpu, 2), cpu_share_of_one_core=round(cpu / out["seconds"], 3),
               cpu_ms_per_request=round(cpu / max(out["requests"], 1) * 1e3, 2),
               rss_start_mb=round(samples[0][1], 1), rss_end_mb=round(samples[-1][1], 1),
               rss_peak_mb=round(max(m for _, m in samples), 1),
               rss_slope_mb_per_min=round(slope_mb_per_min(samples), 3),
               # Caches fill to their bounds and the tokenizer loads in the first minutes:
               # the second half says whether it goes on growing.
               rss_slope_second_half_mb_per_min=round(slope_mb_per_min(
                   [s for s in samples if s[0] >= samples[-1][0] / 2]), 3),
               rss_by_minute_mb=[round(m, 1) for t, m in samples if t % 60 < 5],
               cache_bounds={name: bound for name, (_, bound) in final.items()},
               # None: a minute whose scrape failed
               cache_held_by_minute={name: [c[name][0] if name in c else None
                                            for c in caches] for name in final},
               cache_held_end={name: held for name, (held, _) in final.items()})
    return out


def wait_upstream(port: int, seconds: float = 60) -> None:
    """The fake upstream is a process of its own: it may still be starting."""
    ends = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                return
        except OSError:
            if time.monotonic() > ends:
                raise
            time.sleep(0.2)


def wait_ready(admin: int, seconds: float = 900) -> float:
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - began
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("tailfloor was not ready in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tracked", type=int, default=50_000)
    parser.add_argument("--active", type=int, default=1_000)
    parser.add_argument("--interval", type=float, default=10.0, help="mean seconds between asks")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--baseline-minutes", type=float, default=1.0)
    parser.add_argument("--openclaw-share", type=float, default=0.2)
    parser.add_argument("--per-db", type=int, default=1_000, help="sessions per OpenClaw db")
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--gap", type=float, default=0.025, help="seconds between events")
    parser.add_argument("--turns-before", type=int, default=TURNS_BEFORE,
                        help="user turns in each agent's transcript before its compaction; "
                        "from ~95 its window starts at the tail limit (200 raw messages), "
                        "so the run sees the steady state from its first minute")
    parser.add_argument("--compact-every", type=int, default=0,
                        help="turns after which an agent compacts again, as Pi does when its "
                        "context fills (0: never; its requests then grow by two messages a "
                        "turn for as long as the run lasts)")
    parser.add_argument("--broken-share", type=float, default=0.0,
                        help="the upstream cuts off halfway (closing the connection) every "
                        "round(1 / F)-th answer through tailfloor: a load of failures")
    args = parser.parse_args()
    rate = args.active / args.interval
    with fake_upstream("tailfloor-thousand-") as (work, upstream):
        began = time.monotonic()
        sessions, census = generate(work / "root", args.tracked, args.active,
                                    args.openclaw_share, args.per_db,
                                    turns_before=args.turns_before)
        print(f"wrote {args.tracked} sessions in {time.monotonic() - began:.0f} s: {census}",
              file=sys.stderr)
        *active, warm = sessions
        wait_upstream(upstream)
        script_replies(upstream, int(rate * args.baseline_minutes * 60 * 1.2) + len(active),
                       args.events, args.gap)
        direct = asyncio.run(load(upstream, [session_copy(s) for s in active], args.interval,
                                  args.baseline_minutes * 60, write=False,
                                  compact_every=args.compact_every))
        started = time.monotonic()
        with serving(work / "root" / "pi", upstream, "--sessions", str(work / "root" / "openclaw"),
                     "--tailfloor-header", "detailed") as (proc, port, admin):
            ready = wait_ready(admin)
            ready_from_start = time.monotonic() - started
            script_replies(upstream, 1, args.events, 0.0)
            warm_up = asyncio.run(measure_stream(port, orjson.dumps(warm.body)))
            script_replies(upstream, int(rate * args.minutes * 60 * 1.2) + len(active),
                           args.events, args.gap, broken=args.broken_share)
            through = asyncio.run(through_tailfloor(port, admin, proc.pid, active,
                                                    interval=args.interval,
                                                    seconds=args.minutes * 60,
                                                    compact_every=args.compact_every))
        result = {"census": census, "active": len(active), "interval_s": args.interval,
                  "compact_every": args.compact_every, "broken_share": args.broken_share,
                  "ready_s": round(ready_from_start, 1), "ready_wait_s": round(ready, 1),
                  "warm_up_verdict": warm_up.headers.get("x-tailfloor", ""),
                  "direct": direct, "tailfloor": through,
                  "added_ttfc_p50_ms": round(through["ttfc_p50_ms"] - direct["ttfc_p50_ms"], 2),
                  "added_ttfc_p99_ms": round(through["ttfc_p99_ms"] - direct["ttfc_p99_ms"], 2)}
        print(json.dumps(result, indent=2))
        print(f"\nadded time to first chunk p50 {result['added_ttfc_p50_ms']} ms, "
              f"p99 {result['added_ttfc_p99_ms']} ms (target <= 50); CPU "
              f"{through['cpu_share_of_one_core']:.0%} of one core (target <= 40%); RSS "
              f"{through['rss_start_mb']} -> {through['rss_end_mb']} MB, slope "
              f"{through['rss_slope_mb_per_min']} MB/min (second half "
              f"{through['rss_slope_second_half_mb_per_min']} MB/min)")
    print("RSS by minute (MB):", through["rss_by_minute_mb"])
    for name, held in through["cache_held_by_minute"].items():
        bound = through["cache_bounds"][name]
        print(f"  {name} by minute, % of its bound {bound:.0f}:",
              [round(100 * h / bound, 1) if bound and h is not None else None for h in held],
              f"at the end {100 * through['cache_held_end'][name] / max(bound, 1):.1f}")


if __name__ == "__main__":
    main()
