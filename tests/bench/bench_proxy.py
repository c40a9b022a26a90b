"""Benchmark: what tailfloor adds on the way to the upstream, next to peers run alongside.

Starts the scripted fake upstream, tailfloor and the baselines (direct to the upstream;
nginx ``proxy_pass`` with buffering off when nginx is installed; with flags, LiteLLM's proxy,
Headroom's proxy and Portkey's gateway, each installed on demand in its own venv or prefix
under the benchmark cache, see tests/bench/peers.py) and measures, for each path:

- non-streaming latency p50/p99 at concurrency 1 and 32, and the part added over direct;
- throughput at concurrency 64;
- each proxy's own CPU per non-streaming request (a fixed number back to back) and per stream
  event (streams of >= 200 events, so the request's own cost does not pass for the events'),
  from the OS's accounting of its processes (utime + stime; nginx's master and worker, a
  peer's whole process tree); the direct column shows the upstream's own, for scale;
- streaming: added time to first chunk, added delay per chunk (the upstream stamps each
  event with the time it wrote it), events received, events merged into one read;
- RSS of each proxy when idle and after the load;
- with ``--sessions-scale N``: N concurrent agent sessions streaming through one tailfloor
  that follows 10,000 transcripts, each request identified and restored, transcripts growing
  (tests/bench/sessions_scale.py): tailfloor's CPU, p99 added time to first chunk, RSS.

Then the ratios the targets are set in (tailfloor against nginx and LiteLLM in the same run).
The measuring part runs in a network namespace with only loopback up (peers are installed
before it): Portkey's gateway listens on every interface.

Usage: python tests/bench/bench_proxy.py [--quick] [--with-litellm] [--with-headroom]
           [--with-portkey] [--with-floors] [--sessions-scale [N]] [--no-netns]
           [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import floors, peers, sessions_scale
from tests.bench.loadgen import (
    API_KEY,
    BODY,
    ROUTES,
    STREAM_BODY,
    StreamResult,
    measure_latency,
    measure_stream,
    measure_throughput,
    percentile,
)
from tests.bench.peers import ROOT, Services, SetupError, Target, wait_http
from tests.bench.procs import CpuMeter, cpu_seconds, rss_mb, tree_rss_mb
from tests.conftest import free_port

__all__ = ["cpu_seconds", "main", "rss_mb", "wait_http"]

# How slow a target may be (c1 p50) and still get the full CPU sample; slower ones get the
# small one so a run stays minutes long (the count used is reported).
SLOW_MS = 5.0


@dataclass(frozen=True)
class Sizes:
    rounds: int
    per_round: int
    round_seconds: float
    c32_requests: int
    c32_seconds: float
    c64_seconds: float
    cpu_requests: int
    cpu_requests_slow: int
    latency_streams: int
    cpu_streams: int
    cpu_stream_events: int
    cpu_stream_concurrency: int
    scale_turns: int


FULL = Sizes(rounds=6, per_round=200, round_seconds=4.0, c32_requests=4000, c32_seconds=10.0,
             c64_seconds=8.0, cpu_requests=2000, cpu_requests_slow=300, latency_streams=40,
             cpu_streams=24, cpu_stream_events=250, cpu_stream_concurrency=4, scale_turns=6)
QUICK = Sizes(rounds=2, per_round=100, round_seconds=2.0, c32_requests=1000, c32_seconds=4.0,
              c64_seconds=3.0, cpu_requests=500, cpu_requests_slow=100, latency_streams=10,
              cpu_streams=8, cpu_stream_events=200, cpu_stream_concurrency=4, scale_turns=3)


def script_stream_replies(upstream_port: int, count: int, events: int, gap: float) -> None:
    """The next ``count`` chat answers: streams of ``events`` time-stamped events."""
    reply = {"text": "__TS__" * events, "pieces": events, "stamp": True,
             "delay_between_chunks": gap}
    request = urllib.request.Request(
        f"http://127.0.0.1:{upstream_port}/_control/script?replace=1",
        data=json.dumps([reply] * count).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5):
        pass


def probe(target: Target, stream: bool) -> str | None:
    """One request through ``target``: None when it answers as the upstream did, else why."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    for line in target.headers.decode().split("\r\n"):
        if line:
            name, _, value = line.partition(":")
            headers[name.strip()] = value.strip()
    request = urllib.request.Request(f"http://127.0.0.1:{target.port}/v1/chat/completions",
                                     data=STREAM_BODY if stream else BODY, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            text = resp.read().decode(errors="replace")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    if stream:
        return None if "data: [DONE]" in text and "__TS__" not in text else text[:300]
    return None if "Hello from the fake upstream" in text else text[:300]


def summarise_stream(results: list[StreamResult]) -> dict[str, float]:
    firsts = sorted(r.first_chunk for r in results)
    per_chunk = [d for r in results for d in r.chunk_delays]
    return {
        "ttfc_p50_ms": percentile(firsts, 50) * 1e3,
        "ttfc_p99_ms": percentile(firsts, 99) * 1e3,
        "chunk_delay_mean_us": statistics.fmean(per_chunk) * 1e6 if per_chunk else math.nan,
        "chunk_delay_p50_us": percentile(sorted(per_chunk), 50) * 1e6,
        "events": sum(r.events for r in results),
        "merged_reads": sum(r.merged_reads for r in results),
    }


async def cpu_per_request(target: Target, count: int) -> dict[str, float]:
    meter = CpuMeter(target.pid)
    meter.start()
    done = await measure_latency(target.port, BODY, 1, count, headers=target.headers)
    cpu = meter.stop()
    return {"cpu_us_per_request": cpu / len(done) * 1e6, "cpu_requests": len(done),
            "cpu_us_per_request_ticks": meter.ticks_seconds / len(done) * 1e6}


async def cpu_per_event(target: Target, upstream_port: int, sizes: Sizes,
                        per_request_us: float) -> dict[str, float]:
    """Long streams, a few at a time: the proxy's CPU over them divided by the events."""
    script_stream_replies(upstream_port, sizes.cpu_streams, sizes.cpu_stream_events, 0.001)
    meter = CpuMeter(target.pid)
    results: list[StreamResult] = []
    meter.start()
    for start in range(0, sizes.cpu_streams, sizes.cpu_stream_concurrency):
        batch = range(start, min(start + sizes.cpu_stream_concurrency, sizes.cpu_streams))
        results += await asyncio.gather(*(measure_stream(target.port, headers=target.headers)
                                          for _ in batch))
    cpu = meter.stop()
    events = sum(r.events for r in results)
    if not events:
        return {"cpu_us_per_event": math.nan, "cpu_stream_events": 0}
    # The same figure less what the streams' requests cost as requests (an upper bound on
    # the request part: a non-streaming request also carries its whole answer).
    net = cpu - len(results) * per_request_us / 1e6
    return {"cpu_us_per_event": cpu / events * 1e6, "cpu_us_per_event_net": net / events * 1e6,
            "cpu_us_per_event_ticks": meter.ticks_seconds / events * 1e6,
            "cpu_stream_events": events, "cpu_streams": len(results)}


def probe_route(target: Target, path: bytes, body: bytes) -> str | None:
    """One request of a dialect through ``target``: None when it is answered 200."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{target.port}{path.decode()}", data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}",
                 "x-api-key": API_KEY, "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return None if resp.status == 200 else f"status {resp.status}"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


ROUTE_TARGETS = ("direct", "tailfloor", "nginx")


async def route_costs(targets: list[Target], sizes: Sizes) -> dict[str, dict[str, float]]:
    """c1 p50 and own CPU per request on each of the three model routes (what translating a
    Responses or Anthropic request costs next to a chat one) and for an agent-sized chat
    request (nginx and direct for scale)."""
    out: dict[str, dict[str, float]] = {}
    for route, (path, body) in ROUTES.items():
        for t in targets:
            if t.name not in ROUTE_TARGETS:
                continue
            why = probe_route(t, path, body)
            if why is not None:
                raise SetupError(f"{t.name} does not answer {path.decode()}: {why}")
            await measure_latency(t.port, body, 1, 100, path=path)  # warm
            meter = CpuMeter(t.pid)
            meter.start()
            lat = sorted(await measure_latency(t.port, body, 1, sizes.cpu_requests, path=path))
            cpu = meter.stop()
            out.setdefault(t.name, {}).update({
                f"{route}_c1_p50_ms": percentile(lat, 50) * 1e3,
                f"{route}_cpu_us": cpu / len(lat) * 1e6})
    return out


async def run(sizes: Sizes, targets: list[Target], upstream_port: int,
              ) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {t.name: {"note": t.note} for t in targets}
    # Interleave the targets so machine noise hits each one alike.
    c1: dict[str, list[float]] = {t.name: [] for t in targets}
    for _ in range(sizes.rounds):
        for t in targets:
            c1[t.name] += await measure_latency(t.port, BODY, 1, sizes.per_round, headers=t.headers,
                                                seconds=sizes.round_seconds)
    for t in targets:
        lat = sorted(c1[t.name])
        c32 = sorted(await measure_latency(t.port, BODY, 32, sizes.c32_requests, headers=t.headers,
                                           seconds=sizes.c32_seconds))
        out[t.name].update({
            "c1_p50_ms": percentile(lat, 50) * 1e3, "c1_p99_ms": percentile(lat, 99) * 1e3,
            "c32_p50_ms": percentile(c32, 50) * 1e3, "c32_p99_ms": percentile(c32, 99) * 1e3,
        })
    for t in targets:
        count = (sizes.cpu_requests if out[t.name]["c1_p50_ms"] < SLOW_MS
                 else sizes.cpu_requests_slow)
        out[t.name].update(await cpu_per_request(t, count))
    for t in targets:
        rps, dropped = await measure_throughput(t.port, BODY, 64, sizes.c64_seconds, t.headers)
        out[t.name].update({"rps_c64": rps, "dropped_connections_c64": dropped})
    for t in targets:
        if not t.streams:
            continue
        script_stream_replies(upstream_port, sizes.latency_streams, events=20, gap=0.005)
        results = [await measure_stream(t.port, headers=t.headers)
                   for _ in range(sizes.latency_streams)]
        out[t.name].update(summarise_stream(results))
    for t in targets:
        if t.streams:
            out[t.name].update(await cpu_per_event(t, upstream_port, sizes,
                                                   out[t.name]["cpu_us_per_request"]))
    for name, costs in (await route_costs(targets, sizes)).items():
        out[name].update(costs)
    for t in targets:
        out[t.name]["rss_after_mb"] = tree_rss_mb(t.pid)
    return out


def start_tailfloor(services: Services, upstream_port: int, name: str = "tailfloor",
                    extra: list[str] | None = None) -> tuple[Target, int]:
    port, admin = free_port(), free_port()
    proc = services.start(
        [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
         "--admin-listen", f"127.0.0.1:{admin}", "--upstream",
         f"http://127.0.0.1:{upstream_port}", *(extra or [])], name)
    wait_http(f"http://127.0.0.1:{admin}/readyz", 120, proc)
    return Target(name, port, proc.pid), admin


def start_floor(services: Services, kind: str, upstream_port: int) -> Target:
    """One of the bare relays of tests/bench/floors.py."""
    port = free_port()
    proc = services.start([sys.executable, "tests/bench/floors.py", kind, str(port),
                           f"http://127.0.0.1:{upstream_port}"], kind)
    wait_http(f"http://127.0.0.1:{port}/v1/models", 30, proc)
    return Target(kind, port, proc.pid, note="a bare relay (tests/bench/floors.py)")


async def session_scale(args: argparse.Namespace, services: Services, upstream_port: int,
                        sizes: Sizes) -> dict[str, Any]:
    root = services.work / "sessions"
    began = time.perf_counter()
    generated = sessions_scale.generate(root, args.sessions_scale, args.tracked_sessions)
    generated_s = time.perf_counter() - began
    target, admin = start_tailfloor(services, upstream_port, "tailfloor-sessions",
                                    ["--sessions", str(root)])
    tracked_after = sessions_scale.wait_tracked(admin, args.tracked_sessions)
    idle_rss = rss_mb(target.pid)
    result = await sessions_scale.measure(
        upstream_port=upstream_port, tailfloor_port=target.port, tailfloor_pid=target.pid,
        generated=generated, turns=sizes.scale_turns, events=args.scale_events,
        gap=args.scale_gap, think=args.scale_think)
    result["identification_waits"] = sessions_scale.identification_waits(admin)
    result["cache_fill"] = sessions_scale.cache_fill(admin)
    result.update({"tracked_sessions": sessions_scale.tracked_sessions(admin),
                   "generate_s": generated_s, "tracked_after_s": tracked_after,
                   "rss_idle_mb": idle_rss})
    return result


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    sizes = QUICK if args.quick else FULL
    work = Path(tempfile.mkdtemp(prefix="tailfloor-bench-"))
    services = Services(work)
    results: dict[str, Any] = {}
    try:
        upstream_port = free_port()
        upstream = services.start([sys.executable, "tests/fake_upstream.py", "--port",
                                   str(upstream_port)], "upstream")
        wait_http(f"http://127.0.0.1:{upstream_port}/v1/models", 15, upstream)
        targets = [Target("direct", upstream_port, upstream.pid,
                          note="CPU: the fake upstream's own")]
        if not args.skip_compare:
            tailfloor, _admin = start_tailfloor(services, upstream_port)
            targets.append(tailfloor)
            nginx = peers.start_nginx(services, upstream_port)
            if nginx is not None:
                targets.append(nginx)
            if args.with_litellm:
                targets.append(peers.start_litellm(services, upstream_port, API_KEY))
            if args.with_headroom:
                targets.append(peers.start_headroom(services, upstream_port))
            if args.with_portkey:
                targets.append(peers.start_portkey(services, upstream_port))
            if args.with_floors:
                targets += [start_floor(services, kind, upstream_port) for kind in floors.KINDS]
            time.sleep(0.5)
            idle = {t.name: tree_rss_mb(t.pid) for t in targets}
            for t in targets:
                why = probe(t, stream=False)
                if why is not None:
                    raise SetupError(f"{t.name} does not pass a plain request through: {why}")
                if t.streams and (why := probe(t, stream=True)) is not None:
                    t.streams = False
                    t.note = f"streaming probe failed: {why[:120]}"
            results = asyncio.run(run(sizes, targets, upstream_port))
            for name, value in idle.items():
                results[name]["rss_idle_mb"] = value
        if args.sessions_scale:
            results["sessions_scale"] = asyncio.run(
                session_scale(args, services, upstream_port, sizes))
    finally:
        services.stop()
        print(f"(logs in {work})")
    return results


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def added(results: dict[str, dict[str, Any]], name: str, key: str) -> float:
    value = results[name].get(key, math.nan)
    base = results["direct"].get(key, math.nan)
    return float(value) - float(base)


def report(results: dict[str, Any]) -> None:
    names = [n for n in results if n != "sessions_scale"]
    if names:
        report_compare({n: results[n] for n in names})
    if "sessions_scale" in results:
        report_sessions(results["sessions_scale"])


def report_compare(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    proxies = [n for n in names if n != "direct"]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, key: str, of_added: bool = False, digits: int = 2) -> None:
        cells = []
        for n in names:
            if of_added:
                cells.append("-" if n == "direct" else fmt(added(results, n, key), digits))
            else:
                cells.append(fmt(results[n].get(key), digits))
        rows.append((label, cells))

    row("c1 p50 / ms", "c1_p50_ms", digits=3)
    row("c1 p99 / ms", "c1_p99_ms", digits=3)
    row("added c1 p50 / ms", "c1_p50_ms", True, 3)
    row("added c1 p99 / ms", "c1_p99_ms", True, 3)
    row("c32 p50 / ms", "c32_p50_ms")
    row("added c32 p50 / ms", "c32_p50_ms", True)
    row("requests/s at c64", "rps_c64", digits=0)
    row("dropped conns at c64", "dropped_connections_c64")
    row("CPU us / request", "cpu_us_per_request", digits=0)
    row("  utime+stime (10 ms ticks)", "cpu_us_per_request_ticks", digits=0)
    row("  (requests counted)", "cpu_requests")
    row("stream TTFC p50 / ms", "ttfc_p50_ms", digits=3)
    row("added TTFC p50 / ms", "ttfc_p50_ms", True, 3)
    row("added TTFC p99 / ms", "ttfc_p99_ms", True, 3)
    row("per-chunk delay p50 / us", "chunk_delay_p50_us", digits=0)
    row("added per-chunk p50 / us", "chunk_delay_p50_us", True, 0)
    row("added per-chunk mean / us", "chunk_delay_mean_us", True, 0)
    row("events (latency streams)", "events")
    row("merged reads", "merged_reads")
    row("CPU us / stream event", "cpu_us_per_event", digits=1)
    row("  less request part", "cpu_us_per_event_net", digits=1)
    row("  utime+stime (10 ms ticks)", "cpu_us_per_event_ticks", digits=1)
    row("  (events counted)", "cpu_stream_events")
    for route in ROUTES:
        row(f"{route} c1 p50 / ms", f"{route}_c1_p50_ms", digits=3)
        row(f"{route} CPU us / req", f"{route}_cpu_us", digits=0)
    row("RSS idle / MB", "rss_idle_mb", digits=1)
    row("RSS after load / MB", "rss_after_mb", digits=1)
    width = max(12, *(len(n) + 2 for n in names))
    print(f"\n{'':<27}" + "".join(f"{n:>{width}}" for n in names))
    for label, cells in rows:
        print(f"{label:<27}" + "".join(f"{c:>{width}}" for c in cells))
    print("\nCPU: each proxy's processes (nginx: master + worker; a peer: its process tree) "
          "by the kernel's accounting, the scheduler's ns sum per thread, with utime + stime "
          "below it; direct: the fake upstream's own, for scale.")
    for n in proxies:
        if results[n].get("note"):
            print(f"  {n}: {results[n]['note']}")
    report_targets(results)
    print("\n" + markdown(results))


def ratio(a: Any, b: Any) -> float:
    try:
        return float(a) / float(b)
    except (TypeError, ZeroDivisionError):
        return math.nan


def report_targets(results: dict[str, dict[str, Any]]) -> None:
    if "tailfloor" not in results:
        return
    tf = results["tailfloor"]
    ng = results.get("nginx", {})
    ll = results.get("litellm", {})
    checks: list[tuple[str, float, str, bool | None]] = []

    def check(label: str, value: float, target: str, ok: bool) -> None:
        checks.append((label, value, target, None if math.isnan(value) else ok))

    v = ratio(tf.get("cpu_us_per_request"), ng.get("cpu_us_per_request"))
    check("CPU/request vs nginx", v, "<= 2.5x", v <= 2.5)
    v = ratio(tf.get("cpu_us_per_event"), ng.get("cpu_us_per_event"))
    check("CPU/event vs nginx", v, "<= 1.5x", v <= 1.5)
    v = added(results, "tailfloor", "c1_p50_ms")
    check("added p50 at c1 (ms)", v, "<= 0.3", v <= 0.3)
    v = added(results, "tailfloor", "c32_p50_ms")
    check("added p50 at c32 (ms)", v, "<= 2", v <= 2)
    v = ratio(tf.get("rps_c64"), ng.get("rps_c64"))
    check("rps at c64 vs nginx", v, ">= 0.6x", v >= 0.6)
    v = ratio(tf.get("rps_c64"), ll.get("rps_c64"))
    check("rps at c64 vs LiteLLM", v, ">= 100x", v >= 100)
    v = added(results, "tailfloor", "ttfc_p50_ms")
    check("added TTFC p50 (ms)", v, "<= 0.3", v <= 0.3)
    # The median: a few events held up by the machine's other load move a mean by more
    # than the whole difference between two proxies.
    v = (added(results, "tailfloor", "chunk_delay_p50_us")
         - added(results, "nginx", "chunk_delay_p50_us")) if ng else math.nan
    check("added per-chunk p50 vs nginx (us)", v, "<= +20", v <= 20)
    v = float(tf.get("merged_reads", math.nan))
    check("merged events", v, "0", v == 0)
    print("\ntargets (issue 16), tailfloor in this run:")
    for label, value, target, ok in checks:
        mark = "n/a" if ok is None else ("met" if ok else "MISSED")
        print(f"  {label:<32}{fmt(value):>10}   target {target:<9} {mark}")


def markdown(results: dict[str, dict[str, Any]]) -> str:
    """The README's table: the issue's rows, one column per target of this run."""
    names = list(results)
    labels = {"direct": "direct", "tailfloor": "tailfloor", "nginx": "nginx",
              "litellm": "LiteLLM", "headroom": "Headroom", "portkey": "Portkey"}

    def cells(make: Any) -> str:
        return " | ".join(make(n) for n in names)

    def add(key: str, digits: int = 2) -> Any:
        return lambda n: "-" if n == "direct" or key not in results[n] else fmt(
            added(results, n, key), digits)

    def val(key: str, digits: int = 0) -> Any:
        return lambda n: fmt(results[n].get(key), digits)

    lines = ["| | " + " | ".join(labels.get(n, n) for n in names) + " |",
             "|---" * (len(names) + 1) + "|"]
    rows = [
        ("added p50 / p99 at concurrency 1 (ms)",
         lambda n: "-" if n == "direct" else
         f"{fmt(added(results, n, 'c1_p50_ms'))} / {fmt(added(results, n, 'c1_p99_ms'))}"),
        ("added p50 at concurrency 32 (ms)", add("c32_p50_ms", 1)),
        ("requests/s at concurrency 64", val("rps_c64")),
        ("CPU per request (us)", val("cpu_us_per_request")),
        ("CPU per stream event (us)", val("cpu_us_per_event", 1)),
        ("streaming added time to first chunk p50 (ms)", add("ttfc_p50_ms")),
        ("streaming added delay per chunk p50 / mean (us)",
         lambda n: "-" if n == "direct" or "chunk_delay_p50_us" not in results[n] else
         f"{fmt(added(results, n, 'chunk_delay_p50_us'), 0)} / "
         f"{fmt(added(results, n, 'chunk_delay_mean_us'), 0)}"),
        ("merged events", val("merged_reads")),
        ("RSS idle / after load (MB)",
         lambda n: f"{fmt(results[n].get('rss_idle_mb'), 0)} / "
                   f"{fmt(results[n].get('rss_after_mb'), 0)}"),
    ]
    for label, make in rows:
        lines.append(f"| {label} | {cells(make)} |")
    return "\n".join(lines)


def report_sessions(s: dict[str, Any]) -> None:
    tf, direct = s["tailfloor"], s["direct"]
    print(f"\nsession scale: {s['active_sessions']} concurrent agent sessions, "
          f"{s['turns_per_session']} turns each, {s['events_per_answer']} events an answer, "
          f"{s['tracked_sessions']:.0f} sessions tracked (transcripts generated in "
          f"{s['generate_s']:.1f} s, all tracked {s['tracked_after_s']:.1f} s after ready)")
    print(f"  answers restored by the floor: {s['restored_answers']} of {tf['requests']} "
          f"(x-tailfloor: {tf['verdicts']}); errors {tf['errors']} (direct {direct['errors']})")
    print(f"  tailfloor CPU: {s['cpu_seconds']:.2f} s over {tf['seconds']:.1f} s "
          f"({s['cpu_share_of_one_core']:.0%} of one core), "
          f"{s['cpu_ms_per_request']:.2f} ms per request incl. its "
          f"{s['events_per_answer']} events (the event loop's thread "
          f"{s.get('loop_cpu_ms_per_request', float('nan')):.2f} ms of it)")
    print(f"  time to first chunk p50 / p99: direct {direct['ttfc_p50_ms']:.2f} / "
          f"{direct['ttfc_p99_ms']:.2f} ms, tailfloor {tf['ttfc_p50_ms']:.2f} / "
          f"{tf['ttfc_p99_ms']:.2f} ms; added p50 {s['added_ttfc_p50_ms']:.2f} ms, "
          f"added p99 {s['added_ttfc_p99_ms']:.2f} ms")
    print(f"  tailfloor RSS: {s['rss_idle_mb']:.0f} MB with the sessions tracked, "
          f"{s['rss_warm_mb']:.0f} MB after one restored request, "
          f"{s['rss_peak_mb']:.0f} MB peak under the load, {s['rss_after_mb']:.0f} MB after")
    waits = s.get("identification_waits", {})
    print("  requests that waited for the transcript watcher: " + (", ".join(
        f"{outcome} {w.get('count', 0):.0f} ({w.get('sum', 0) * 1e3:.0f} ms in all)"
        for outcome, w in sorted(waits.items())) or "none"))
    print("  kept between requests at the end, held / bound (tailfloor_cache_held): " + ", ".join(
        f"{name} {_cache_figure(name, held)} / {_cache_figure(name, bound)}"
        for name, (held, bound) in sorted(s.get("cache_fill", {}).items())))
    print(f"  e.g. x-tailfloor: {tf['example_verdict']}")


def _cache_figure(name: str, value: float) -> str:
    return f"{value / 1e6:.1f} MB" if name.endswith("_bytes") else f"{value:,.0f}"


def install_peers(args: argparse.Namespace) -> None:
    """Everything the flags ask for, before the run (the namespace has no registry)."""
    if args.with_litellm:
        peers.ensure_litellm()
    if args.with_headroom:
        peers.ensure_headroom()
    if args.with_portkey:
        peers.ensure_portkey()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--with-litellm", action="store_true", help="add LiteLLM's proxy")
    parser.add_argument("--with-headroom", action="store_true",
                        help=f"add Headroom's proxy ({peers.HEADROOM_VERSION}, ~870 MB)")
    parser.add_argument("--with-portkey", action="store_true",
                        help=f"add Portkey's gateway ({peers.PORTKEY_VERSION}; non-streaming)")
    parser.add_argument("--with-floors", action="store_true",
                        help="add four bare relays (tests/bench/floors.py): what aiohttp, "
                             "aiohttp's client and a bare uvloop protocol cost alone")
    parser.add_argument("--sessions-scale", type=int, nargs="?", const=200, default=0,
                        metavar="N", help="also run N concurrent restored sessions (200)")
    parser.add_argument("--tracked-sessions", type=int, default=10_000,
                        help="sessions in the session-scale run's directory (10,000)")
    parser.add_argument("--scale-events", type=int, default=40,
                        help="events per answer in the session-scale run")
    parser.add_argument("--scale-gap", type=float, default=0.025,
                        help="seconds between an answer's events (a model's pace)")
    parser.add_argument("--scale-think", type=float, default=0.5,
                        help="seconds an agent spends between an answer and its next request")
    parser.add_argument("--skip-compare", action="store_true",
                        help="only the session-scale run")
    parser.add_argument("--no-netns", action="store_true",
                        help="measure in this network namespace (refused with --with-portkey)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    try:
        inside = os.environ.get(peers.NETNS_MARK) == "1"
        if not inside and not args.no_netns:
            install_peers(args)
            return peers.run_in_netns([sys.executable, str(Path(__file__).resolve()),
                                       *sys.argv[1:]])
        if inside:
            if not peers.loopback_only():
                raise SetupError("the network namespace has more than loopback")
            print("measuring in a network namespace with only loopback up")
        elif args.with_portkey:
            raise SetupError("--with-portkey needs the network namespace (its gateway listens "
                             "on every interface): drop --no-netns")
        results = measure_all(args)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print("\n" + json.dumps(results))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
