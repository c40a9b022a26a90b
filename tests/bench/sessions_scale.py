"""Session scale: many concurrent agent sessions streaming through one tailfloor.

A sessions directory of Pi JSONL transcripts (``tracked`` sessions in all, folders of 100):
``active`` of them are compacted conversations that agents are still having, the rest are
plain sessions that are only tracked. Each active session sends what Pi sends after a
compaction (its system prompt, the summary, the few raw messages it kept and the new
question), so tailfloor has to identify it (by content: no session header) and restore the
raw messages before the summary's anchor from the transcript; every answer's ``x-tailfloor``
says whether it did. After each answer the agent writes the turn to its transcript (the
reply and its next question) and asks again, so transcripts grow while the load runs.

The same load runs first straight to the upstream (the baseline for the added time to first
chunk), then through tailfloor, whose CPU (utime + stime of its process), RSS and first-chunk
times are reported.
"""

from __future__ import annotations

import asyncio
import random
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.transcripts.catalog import Catalog
from proxy.wire.summary import agent_summary
from tests.bench.bench_transcripts import session_text
from tests.bench.loadgen import measure_stream, percentile
from tests.bench.procs import CpuMeter, rss_mb
from tests.floor.conversation import text
from tests.floor.synthetic import Transcript, put, request_for, system

MODEL = "gpt-5-mini"  # the built-in policy knows it: o200k_base counts, a 400k window
KEPT = 4  # raw messages Pi kept after its compaction (the floor's N is 30)
TURNS_BEFORE = 30  # user turns before the compaction (~70 messages to restore from)
RESTORED = "floor; restored="


@dataclass
class Session:
    """One active agent session: its transcript on disk and the request it sends next."""

    transcript: Transcript
    path: Path
    body: dict[str, Any]
    rng: random.Random
    turn: int = 0
    written: int = 0  # transcript objects already on disk
    compactions: int = 0  # since the run began
    since_compaction: int = 0  # turns

    def write_new(self) -> None:
        objs = self.transcript.objs[self.written:]
        with self.path.open("ab") as out:
            out.write(b"".join(orjson.dumps(o) + b"\n" for o in objs))
        self.written = len(self.transcript.objs)

    def next_turn(self, write: bool) -> None:
        """The answer arrived: Pi records it and the user's next question, then asks."""
        self.turn += 1
        self.since_compaction += 1
        reply = f"answer {self.turn} of {self.transcript.session_id}: " + text(self.rng, 40)
        question = f"follow-up {self.turn}: " + text(self.rng, 20)
        self.transcript.assistant(reply)
        self.transcript.user(question)
        self.body["messages"] += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": [{"type": "text", "text": question}]}]
        if write:
            self.write_new()

    def next_turn_compacted(self, write: bool) -> None:
        """The answer arrived and filled Pi's context: Pi records it, compacts (a compaction
        entry that keeps the last ``KEPT`` messages), and its next request is the summary,
        those messages and the user's next question. An agent that never compacts sends
        ever longer requests, which no real one does: a load of those grows for as long as
        it runs."""
        self.turn += 1
        self.compactions += 1
        t = self.transcript
        reply = f"answer {self.turn} of {t.session_id}: " + text(self.rng, 40)
        t.assistant(reply)
        self.body["messages"].append({"role": "assistant", "content": reply})
        summary = f"## Goal\nsession {t.session_id}, compaction {self.compactions}: " + \
            text(self.rng, 200)
        ids = t.message_ids()
        t.compaction(summary, ids[max(0, len(ids) - KEPT)])
        question = f"the question after compaction {self.compactions}: " + text(self.rng, 20)
        t.user(question)
        messages = self.body["messages"]
        self.body["messages"] = [
            messages[0], {"role": "user", "content": [{"type": "text",
                                                       "text": agent_summary(summary)}]},
            *messages[-KEPT:], {"role": "user", "content": [{"type": "text", "text": question}]}]
        self.since_compaction = 0
        if write:
            self.write_new()


def _session_id(i: int) -> str:
    # The first four digits differ between sessions (40503 is odd: a bijection mod 2**16):
    # the synthetic transcripts derive tool-call and entry ids from them.
    return f"{i * 40503 % 65536:04x}{i % 65536:04x}-5e55-7000-8000-{0xac71fe000000 + i:012x}"


def active_session(root: Path, i: int, turns_before: int = TURNS_BEFORE) -> Session:
    rng = random.Random(1000 + i)
    sid = _session_id(i)
    cwd = f"/home/user/active{i}"
    t = Transcript(sid)
    for turn in range(turns_before):
        t.user(f"session {i} turn {turn}: " + text(rng, 60))
        if turn % 3 == 0:
            _entry, ids = t.tool_calls(["bash"])
            t.tool_result(ids[0], text(rng, 120))
        t.assistant(text(rng, 60))
    ids = t.message_ids()
    t.compaction(f"## Goal\nsession {i}: " + text(rng, 200), ids[-KEPT])
    t.user(f"session {i}: the question after the compaction, " + text(rng, 20))
    folder = root / f"--home-user-active{i // 100}--"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"2026-11-30T02-00-00-000Z_{sid}.jsonl"
    header = {"type": "session", "version": 3, "id": sid,
              "timestamp": "2026-11-30T02:00:00.000Z", "cwd": cwd}
    path.write_bytes(orjson.dumps(header) + b"\n")
    catalog = Catalog(tail_limit=1000)
    put(catalog, t, group=cwd)
    body = request_for(catalog, sid, sys=system(cwd=cwd))
    body["model"] = MODEL
    session = Session(t, path, body, rng)
    session.write_new()
    return session


def generate(root: Path, active: int, tracked: int) -> list[Session]:
    """``active`` sessions an agent is in (and one more to warm up with), among ``tracked``
    sessions in all."""
    sessions = [active_session(root, i) for i in range(active + 1)]
    rng = random.Random(7)
    for n in range(tracked - active - 1):
        folder = root / f"--home-user-project{n // 100}--"
        folder.mkdir(parents=True, exist_ok=True)
        sid, body = session_text(n, 2500, rng)
        (folder / f"2026-11-30T01-00-00-000Z_{sid}.jsonl").write_text(body)
    return sessions


def tracked_sessions(admin_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("tailfloor_sessions{"))


def identification_waits(admin_port: int) -> dict[str, dict[str, float]]:
    """Requests that waited for the watcher (a transcript behind the request), by outcome:
    how many, and their seconds in all."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    out: dict[str, dict[str, float]] = {}
    for line in lines:
        for part in ("count", "sum"):
            prefix = f"tailfloor_identification_wait_seconds_{part}{{"
            if line.startswith(prefix):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                out.setdefault(outcome, {})[part] = float(line.rsplit(" ", 1)[1])
    return out


def cache_fill(admin: int) -> dict[str, list[float]]:
    """Each cache's [held, bound], as the process exports them (tailfloor_cache_held)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    fill: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("tailfloor_cache_held", "tailfloor_cache_bound"):
            at = 0 if family.name.endswith("held") else 1
            for sample in family.samples:
                fill.setdefault(sample.labels["cache"], [0.0, 0.0])[at] = sample.value
    return fill


def wait_tracked(admin_port: int, expected: int, seconds: float = 180) -> float:
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if tracked_sessions(admin_port) >= expected:
            return time.monotonic() - began
        time.sleep(0.25)
    raise RuntimeError(f"tailfloor tracks {tracked_sessions(admin_port):.0f} of {expected} "
                       f"sessions after {seconds:.0f} s")


def script_replies(upstream_port: int, count: int, events: int, gap: float,
                   timeout: float = 60, *, broken: float = 0.0) -> None:
    """``count`` streamed answers of ``events`` events; a share ``broken`` of them (every
    ``1 / broken``-th) cut off halfway by the upstream closing the connection."""
    reply = {"text": "__TS__" * events, "pieces": events, "stamp": True,
             "delay_between_chunks": gap}
    cut = {**reply, "close_after_chunks": max(1, events // 2)}
    every = round(1 / broken) if broken > 0 else 0
    replies = [cut if every and i % every == every - 1 else reply for i in range(count)]
    request = urllib.request.Request(
        f"http://127.0.0.1:{upstream_port}/_control/script?replace=1",
        data=orjson.dumps(replies), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout):
        pass


@dataclass
class PhaseResult:
    first_chunks: list[float] = field(default_factory=list)
    chunk_delays: list[float] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    events: int = 0
    requests: int = 0
    seconds: float = 0.0


async def phase(port: int, sessions: list[Session], turns: int, think: float, write: bool,
                ) -> PhaseResult:
    out = PhaseResult()

    async def agent(s: Session, delay: float) -> None:
        await asyncio.sleep(delay)
        for _ in range(turns):
            result = await measure_stream(port, orjson.dumps(s.body))
            out.requests += 1
            if result.status != 200 or not result.events:
                out.errors += 1
            else:
                out.first_chunks.append(result.first_chunk)
                out.chunk_delays.extend(result.chunk_delays)
                out.events += result.events
            verdict = result.headers.get("x-tailfloor", "(none)")
            key = RESTORED if verdict.startswith(RESTORED) else verdict
            out.verdicts[key] = out.verdicts.get(key, 0) + 1
            s.next_turn(write)
            await asyncio.sleep(think)

    began = time.perf_counter()
    # Agents start over the first second, as sessions of a team do, not in one instant.
    await asyncio.gather(*(agent(s, i / len(sessions)) for i, s in enumerate(sessions)))
    out.seconds = time.perf_counter() - began
    return out


def summary(result: PhaseResult) -> dict[str, Any]:
    firsts = sorted(result.first_chunks)
    delays = sorted(result.chunk_delays)
    return {
        "requests": result.requests, "errors": result.errors, "events": result.events,
        "seconds": result.seconds,
        "ttfc_p50_ms": percentile(firsts, 50) * 1e3, "ttfc_p99_ms": percentile(firsts, 99) * 1e3,
        "chunk_delay_p50_us": percentile(delays, 50) * 1e6,
        "chunk_delay_p99_us": percentile(delays, 99) * 1e6,
        "verdicts": dict(result.verdicts),
    }


async def measure(*, upstream_port: int, tailfloor_port: int, tailfloor_pid: int,
                  generated: list[Session], turns: int, events: int, gap: float, think: float,
                  ) -> dict[str, Any]:
    """Direct, then through tailfloor (already following the sessions' directory)."""
    # The last session warms tailfloor up (its tokenizer tables load on first use, ~0.3 s
    # and ~45 MB) and is not part of the load.
    *generated, warm = generated
    active = len(generated)
    script_replies(upstream_port, 1, events, 0.0)
    warm_up = await measure_stream(tailfloor_port, orjson.dumps(warm.body))
    if not warm_up.headers.get("x-tailfloor", "").startswith(RESTORED):
        raise RuntimeError(f"the warm-up request was not restored: {warm_up.headers}")
    rss_warm = rss_mb(tailfloor_pid)
    sessions = [session_copy(s) for s in generated]
    script_replies(upstream_port, active * turns + active, events, gap)
    direct = summary(await phase(upstream_port, sessions, turns, think, write=False))
    sessions = [session_copy(s) for s in generated]
    script_replies(upstream_port, active * turns + active, events, gap)
    rss_before = rss_mb(tailfloor_pid)
    peak = [rss_before]
    meter = CpuMeter(tailfloor_pid)

    async def sample_rss(stop: asyncio.Event) -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(tailfloor_pid))
            await asyncio.sleep(0.25)

    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(stop))
    meter.start()
    through = summary(await phase(tailfloor_port, sessions, turns, think, write=True))
    cpu = meter.stop()
    stop.set()
    await sampler
    restored = through["verdicts"].get(RESTORED, 0)
    through["example_verdict"] = warm_up.headers.get("x-tailfloor", "")
    return {
        "active_sessions": active, "turns_per_session": turns, "events_per_answer": events,
        "direct": direct, "tailfloor": through,
        "restored_answers": restored,
        "cpu_seconds": cpu, "cpu_share_of_one_core": cpu / through["seconds"],
        "cpu_ms_per_request": cpu / max(through["requests"], 1) * 1e3,
        # the event loop's thread alone (relaying, the request path); the rest is the worker
        # threads' floor work and the transcript reader
        "loop_cpu_ms_per_request": meter.main_thread_seconds / max(through["requests"], 1)
        * 1e3,
        "added_ttfc_p50_ms": through["ttfc_p50_ms"] - direct["ttfc_p50_ms"],
        "added_ttfc_p99_ms": through["ttfc_p99_ms"] - direct["ttfc_p99_ms"],
        "rss_warm_mb": rss_warm, "rss_before_mb": rss_before, "rss_peak_mb": peak[0],
        "rss_after_mb": rss_mb(tailfloor_pid),
    }


def session_copy(s: Session) -> Session:
    """A session as it is now, to be grown on its own (the transcript file is shared)."""
    objs = [dict(o) for o in s.transcript.objs]
    t = Transcript(s.transcript.session_id, objs, s.transcript.clock, s.transcript.calls)
    body = {**s.body, "messages": list(s.body["messages"])}
    return Session(t, s.path, body, random.Random(s.rng.random()), s.turn, len(objs))
