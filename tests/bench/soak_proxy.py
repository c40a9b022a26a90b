"""Soak: mixed load and faults against tailfloor for a while, then check it is as it was.

Each round: 32-connection bursts, complete streams, clients leaving mid-stream, invalid
JSON; and faults: upstreams that break mid-stream, answer slowly or send a 2 MB error, slow
readers, a transcript that grows, is rotated (renamed to ``.reset.``) and truncated and
written again in place, and a rules file edited. For ``--seconds``; prints RSS after each
round and at the end the RSS slope (MB/min, least squares), open file descriptors, requests
in flight and error lines. Fails (exit 1) if RSS grew by more than ``--rss-growth-mb``,
requests are still in flight, any error was logged, or tailfloor does not exit cleanly on
SIGTERM. Loopback only.

Usage: python tests/bench/soak_proxy.py [--seconds 60]   (the issue notes use 600)
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_proxy import rss_mb, wait_http
from tests.bench.loadgen import BODY, measure_throughput
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
STREAM = orjson.dumps({"model": "m", "stream": True,
                       "messages": [{"role": "user", "content": "stream"}]})
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\nContent-Length: %d\r\n\r\n"


async def one_stream(port: int, leave_early: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD % len(STREAM) + STREAM)
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        more = await reader.read(65536)
        if not more or leave_early:
            break
        data += more
    if not leave_early and b"[DONE]" not in data:
        raise AssertionError(f"incomplete stream: {data[-200:]!r}")
    writer.close()


def script(upstream_port: int, replies: list[dict[str, object]]) -> None:
    urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{upstream_port}/_control/script", data=orjson.dumps(replies)),
        timeout=5).read()


async def tolerant_stream(port: int, slow_reader: bool = False) -> None:
    """A stream whose answer may be cut or late (a fault was scripted): only read it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD % len(STREAM) + STREAM)
    try:
        for _ in range(200):
            more = await asyncio.wait_for(reader.read(1024 if slow_reader else 65536), 10)
            if not more or more.endswith(b"0\r\n\r\n"):
                break
            if slow_reader:
                await asyncio.sleep(0.01)
    except TimeoutError:
        pass
    writer.close()


def churn(sessions: Path, rules: Path, round_no: int) -> None:
    """The transcript and rules faults of one round."""
    live = sessions / "--soak--" / "2026-12-01T00-00-00-000Z_soak.jsonl"
    live.parent.mkdir(exist_ok=True)
    header = {"type": "session", "version": 3, "id": f"soak-{round_no // 3}",
              "timestamp": "2026-12-01T00:00:00.000Z", "cwd": "/soak"}
    if not live.exists():
        live.write_bytes(orjson.dumps(header) + b"\n")
    with live.open("ab") as f:
        for i in range(20):
            f.write(orjson.dumps({"type": "message", "id": f"m{round_no}-{i}", "parentId": None,
                                  "timestamp": "2026-12-01T00:00:00.000Z",
                                  "message": {"role": "user", "content": "soak " * 20}})
                    + b"\n")
    if round_no % 3 == 2:  # rotate it
        live.rename(live.with_name(live.name + f".reset.{round_no}"))
    if round_no % 4 == 3:  # truncate another one and write it again, in place
        other = sessions / "--soak--" / "rewritten.jsonl"
        with other.open("a+b") as f:
            f.truncate(0)
            f.write(orjson.dumps({**header, "id": f"re-{round_no}"}) + b"\n")
    (rules / "soak.toml").write_text(f"[defaults]\nmin_tail_messages = {8 + round_no % 5}\n")


async def soak(port: int, upstream_port: int, seconds: float, *, pid: int, sessions: Path,
               rules: Path) -> list[tuple[float, float]]:
    samples = []
    started = time.monotonic()
    deadline = started + seconds
    round_no = 0
    while time.monotonic() < deadline:
        await measure_throughput(port, BODY, 32, 3)
        await asyncio.gather(*(one_stream(port, leave_early=i % 2 == 1) for i in range(40)))
        await measure_throughput(port, b"{not json", 8, 0.5)
        script(upstream_port, [{"close_after_chunks": 1, "pieces": 5}] * 4
               + [{"delay_before_headers": 0.5}] * 4
               + [{"status": 500, "raw_body": "x" * (2 * 1024 * 1024)}] * 2
               + [{"text": "y" * 100_000, "pieces": 100}] * 4)
        await asyncio.gather(*(tolerant_stream(port, slow_reader=i >= 10) for i in range(14)))
        churn(sessions, rules, round_no)
        round_no += 1
        samples.append((time.monotonic() - started, rss_mb(pid)))
        print(f"rss {samples[-1][1]:.1f} MB", flush=True)
    return samples


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    n = len(samples)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / n
    mean_r = sum(r for _, r in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    cov = sum((t - mean_t) * (r - mean_r) for t, r in samples)
    return 60 * cov / var if var else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rss-growth-mb", type=float, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tailfloor-soak-"))
    upstream_port, port = free_port(), free_port()
    fake = subprocess.Popen([sys.executable, "tests/fake_upstream.py", "--port",
                             str(upstream_port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    log = work / "tailfloor.log"
    (work / "sessions").mkdir()
    (work / "rules").mkdir()
    with log.open("wb") as out:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
             "--admin-listen", "127.0.0.1:0", "--rules", str(work / "rules"),
             "--upstream", f"http://127.0.0.1:{upstream_port}", "--sessions",
             str(work / "sessions")], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    problems = []
    try:
        wait_http(f"http://127.0.0.1:{upstream_port}/v1/models", 15)
        wait_http(f"http://127.0.0.1:{port}/readyz", 30)
        samples = asyncio.run(soak(port, upstream_port, args.seconds, pid=proxy.pid,
                                   sessions=work / "sessions", rules=work / "rules"))
        first, last = samples[0][1], samples[-1][1]
        if last - first > args.rss_growth_mb:
            problems.append(f"RSS grew from {first:.1f} to {last:.1f} MB")
        time.sleep(1)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        in_flight = next((line.split()[1] for line in metrics.splitlines()
                          if line.startswith("tailfloor_in_flight_requests ")), "?")
        fds = len(list(Path(f"/proc/{proxy.pid}/fd").iterdir()))
        print(f"rounds {len(samples)}; RSS {first:.1f} -> {last:.1f} MB, slope "
              f"{slope_mb_per_min(samples):.3f} MB/min; open fds {fds}; in flight "
              f"{in_flight}", flush=True)
        if in_flight != "0.0":
            problems.append("requests still in flight after the load")
    finally:
        proxy.terminate()
        code = proxy.wait(40)
        fake.terminate()
    if code != 0:
        problems.append(f"tailfloor exited {code} on SIGTERM")
    lines = log.read_text().splitlines()
    errors = [line for line in lines if " ERROR " in line]
    print(f"log: {len(lines)} lines, {len(errors)} at ERROR, "
          f"{sum(' WARNING ' in line for line in lines)} at WARNING", flush=True)
    if errors:
        problems.append(f"{len(errors)} error lines, first: {errors[0]}")
    print("\n".join(problems) if problems else "soak ok", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
