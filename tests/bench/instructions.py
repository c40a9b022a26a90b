"""Instructions per request: what each proxy executes in user space, counted by valgrind.

CPU time on a shared 2-core VM moves by 2x between runs of the same build; an instruction
count moves by well under 1%. So this is the figure to compare builds and changes by (the
kernel's share, the socket calls that dominate nginx's CPU time, is not in it: see
``bench_proxy.py`` for CPU time from the OS's accounting). Each proxy runs under
``valgrind --tool=cachegrind`` in front of the fake upstream, twice per request kind: after
the same warm-up, once with ``--requests`` fewer requests than the other; the difference of
the two totals, per request, leaves start-up and shutdown out.

Request kinds, one connection, back to back, non-streaming:
- ``small``: the benchmark's two-message request (``loadgen.BODY``);
- ``agent``: an agent-sized request (``loadgen.AGENT_BODY``: 40 KB system prompt, 12 tools).

``--stream`` adds a column per stream event: ``STREAMS`` streams one after the other, of
``FEW_EVENTS`` events in one run and ``MANY_EVENTS`` in the other (the upstream writes one
event every ``EVENT_GAP`` seconds, so each arrives alone), and the difference per event: what
relaying one event costs, the request part left out. The client asked for the usage, so the
scanner runs as it does for most agents (no event changed).

``--otlp`` adds ``tailfloor-otlp``: tailfloor exporting traces and metrics over OTLP/HTTP
(every request sampled) to a receiver in this process (tests/otlp_receiver.py, kept-alive
HTTP/1.1 as a collector answers), printed beside plain tailfloor with what it adds.

``--threads`` counts with callgrind (``--separate-threads=yes``, slower) instead, and splits
each figure into the main thread (the event loop) and the others (the export's telemetry,
poster and watchdog threads, and those any run has).

Needs valgrind (``apt-get install valgrind``); nginx is measured when installed.

Usage: python tests/bench/instructions.py [--requests 200] [--targets tailfloor,nginx,...]
       [--otlp] [--stream] [--threads]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import peers
from tests.bench.bench_proxy import script_stream_replies
from tests.bench.loadgen import AGENT_BODY, BODY, measure_latency, measure_stream
from tests.conftest import free_port
from tests.otlp_receiver import OtlpReceiver

TARGETS = ("tailfloor", "nginx", "uvloop-raw", "aiohttp-own-client")
KINDS = {"small": BODY, "agent": AGENT_BODY}
WARM = 50
STREAMS, FEW_EVENTS, MANY_EVENTS, EVENT_GAP = 8, 20, 220, 0.004


def command(target: str, port: int, upstream: int, work: Path) -> tuple[list[str], str]:
    """The target's command line and a URL that answers once it is ready."""
    url = f"http://127.0.0.1:{upstream}"
    if target in ("tailfloor", "tailfloor-otlp"):
        admin = free_port()
        return ([sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
                 "--admin-listen", f"127.0.0.1:{admin}", "--upstream", url],
                f"http://127.0.0.1:{admin}/readyz")
    if target == "nginx":
        nginx = peers.nginx_binary()
        assert nginx is not None
        where = work / f"nginx-{port}"
        where.mkdir()
        conf = peers.nginx_conf(where, upstream, port)
        # One process: the worker's instructions are the master's (none are lost to a fork).
        return ([nginx, "-c", str(conf), "-e", str(where / "error.log"), "-g",
                 "master_process off;"], f"http://127.0.0.1:{port}/v1/models")
    return ([sys.executable, "tests/bench/floors.py", target, str(port), url],
            f"http://127.0.0.1:{port}/v1/models")


def counted(target: str, body: bytes, requests: int, upstream: int, work: Path, *,
            env: dict[str, str], threads: bool = False, events: int = 0) -> tuple[int, int]:
    """Instructions of one run (start-up, the warm-up, ``requests`` requests, shutdown): of
    the main thread and of the others (0 unless ``threads``: all in the first).
    ``events``: the requests are ``STREAMS`` streams of that many events instead."""
    port = free_port()
    argv, ready = command(target, port, upstream, work)
    out = work / f"grind-{target}-{port}.out"
    tool = ["--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}"] \
        if threads else ["--tool=cachegrind", "--cache-sim=no",
                         f"--cachegrind-out-file={out}"]
    proc = subprocess.Popen(
        ["valgrind", *tool, *argv], cwd=peers.ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0", **env})
    try:
        peers.wait_http(ready, 300, proc)
        asyncio.run(measure_latency(port, body, 1, WARM + requests) if not events
                    else _streams(port, upstream, events))
    finally:
        proc.send_signal(signal.SIGINT if target != "nginx" else signal.SIGQUIT)
        proc.wait(300)
    if not threads:
        return summary(out), 0
    # callgrind writes one file per thread, <out>-01 the main thread's.
    found = {path.name.rsplit("-", 1)[1]: summary(path)
             for path in work.glob(f"{out.name}-*")}
    main = found.pop("01")
    return main, sum(found.values())


def summary(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no valgrind summary in {path.name}")


async def _streams(port: int, upstream: int, events: int) -> None:
    await measure_latency(port, BODY, 1, WARM)
    script_stream_replies(upstream, STREAMS, events, EVENT_GAP)
    for _ in range(STREAMS):
        result = await measure_stream(port)
        if result.events < events:
            raise RuntimeError(f"a stream relayed {result.events} of {events} events")


def per_request(target: str, body: bytes, requests: int, upstream: int, work: Path, *,
                env: dict[str, str], threads: bool = False) -> tuple[float, float]:
    """Instructions per request: of the main thread, and of the others."""
    fewer = counted(target, body, 0, upstream, work, env=env, threads=threads)
    more = counted(target, body, requests, upstream, work, env=env, threads=threads)
    return (more[0] - fewer[0]) / requests, (more[1] - fewer[1]) / requests


def per_event(target: str, upstream: int, work: Path, *, env: dict[str, str]) -> float:
    fewer = sum(counted(target, BODY, 0, upstream, work, env=env, events=FEW_EVENTS))
    more = sum(counted(target, BODY, 0, upstream, work, env=env, events=MANY_EVENTS))
    return (more - fewer) / (STREAMS * (MANY_EVENTS - FEW_EVENTS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--otlp", action="store_true",
                        help="also tailfloor exporting OTLP to a receiver in this process")
    parser.add_argument("--stream", action="store_true",
                        help="also instructions per stream event")
    parser.add_argument("--threads", action="store_true",
                        help="callgrind: the main thread and the others apart")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)")
        return 2
    targets = [t for t in args.targets.split(",") if t]
    receiver = None
    if args.otlp:
        receiver = OtlpReceiver(keep_alive=True)
        targets.append("tailfloor-otlp")
    # Only the sampler's default (every request) and the endpoint: no other OTEL_* setting.
    envs = {t: {} if t != "tailfloor-otlp" or receiver is None
            else {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url} for t in targets}
    if "nginx" in targets and peers.nginx_binary() is None:
        print("nginx not installed: that row is left out")
        targets.remove("nginx")
    work = Path(tempfile.mkdtemp(prefix="tailfloor-instructions-"))
    services = peers.Services(work)
    upstream = free_port()
    try:
        fake = services.start([sys.executable, "tests/fake_upstream.py", "--port",
                               str(upstream)], "upstream")
        peers.wait_http(f"http://127.0.0.1:{upstream}/v1/models", 15, fake)
        split = {t: {kind: per_request(t, body, args.requests, upstream, work, env=envs[t],
                                       threads=args.threads)
                     for kind, body in KINDS.items()} for t in targets}
        rows = {t: {kind: sum(parts) for kind, parts in row.items()}
                for t, row in split.items()}
        if args.stream:
            for t in targets:
                rows[t]["event"] = per_event(t, upstream, work, env=envs[t])
    finally:
        services.stop()
        if receiver is not None:
            receiver.stop()
    base = rows.get("nginx")
    kinds = [*KINDS, *(["event"] if args.stream else [])]
    print(f"\ninstructions per request (user space, {args.requests} requests after "
          f"{WARM} to warm up)" + (f"; per stream event ({STREAMS} streams of "
                                   f"{MANY_EVENTS} less {FEW_EVENTS} events)"
                                   if args.stream else ""))
    print(f"{'target':<22}" + "".join(f"{kind:>16}" for kind in kinds)
          + ("".join(f"{'x nginx ' + kind:>18}" for kind in kinds) if base else ""))
    for target, row in rows.items():
        line = f"{target:<22}" + "".join(f"{row[kind]:>16,.0f}" for kind in kinds)
        if base:
            line += "".join(f"{row[kind] / base[kind]:>18.1f}" for kind in kinds)
        print(line)
    if args.threads:
        print("\nof which (main thread / the others; callgrind)")
        for target, row in split.items():
            print(f"{target:<22}" + "".join(f"{f'{main:,.0f} / {rest:,.0f}':>26}"
                                            for main, rest in row.values()))
    plain, exporting = rows.get("tailfloor"), rows.get("tailfloor-otlp")
    if plain and exporting:
        print("OTLP export adds " + ", ".join(
            f"{exporting[kind] / plain[kind] - 1:+.1%} ({kind})" for kind in KINDS))
    if receiver is not None:
        print(f"the receiver took {len(receiver.spans())} spans in {receiver.posts} posts")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
