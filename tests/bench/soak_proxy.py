"""Soak: mixed load against tailfloor for a while, then check it is as it was.

Rounds of 32-connection bursts, complete streams, clients leaving mid-stream and invalid
JSON, against the fake upstream, for ``--seconds``; prints RSS after each round and fails
(exit 1) if RSS grew by more than ``--rss-growth-mb``, requests are still in flight, any
error was logged, or tailfloor does not exit cleanly on SIGTERM. Loopback only.

Usage: python tests/bench/soak_proxy.py [--seconds 60]
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


async def soak(port: int, seconds: float, pid: int) -> list[float]:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await measure_throughput(port, BODY, 32, 3)
        await asyncio.gather(*(one_stream(port, leave_early=i % 2 == 1) for i in range(40)))
        await measure_throughput(port, b"{not json", 8, 0.5)
        samples.append(rss_mb(pid))
        print(f"rss {samples[-1]:.1f} MB", flush=True)
    return samples


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
    with log.open("wb") as out:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
             "--admin-listen", "127.0.0.1:0",
             "--upstream", f"http://127.0.0.1:{upstream_port}", "--sessions",
             str(work / "sessions")], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    problems = []
    try:
        wait_http(f"http://127.0.0.1:{upstream_port}/v1/models", 15)
        wait_http(f"http://127.0.0.1:{port}/readyz", 30)
        samples = asyncio.run(soak(port, args.seconds, proxy.pid))
        if samples[-1] - samples[0] > args.rss_growth_mb:
            problems.append(f"RSS grew from {samples[0]:.1f} to {samples[-1]:.1f} MB")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        if "tailfloor_in_flight_requests 0.0" not in metrics:
            problems.append("requests still in flight after the load")
    finally:
        proxy.terminate()
        code = proxy.wait(40)
        fake.terminate()
    if code != 0:
        problems.append(f"tailfloor exited {code} on SIGTERM")
    errors = [line for line in log.read_text().splitlines() if " ERROR " in line]
    if errors:
        problems.append(f"{len(errors)} error lines, first: {errors[0]}")
    print("\n".join(problems) if problems else "soak ok", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
