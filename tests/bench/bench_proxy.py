"""Benchmark: what tailfloor adds on the way to the upstream, next to baselines run alongside.

Starts the scripted fake upstream, tailfloor and the baselines (direct to the upstream;
nginx ``proxy_pass`` with buffering off when nginx is installed; LiteLLM's proxy with
``--with-litellm``, installed on demand in its own venv) and measures, for each path:

- non-streaming latency p50/p99 at concurrency 1 and 32, and the part added over direct;
- throughput at concurrency 64;
- streaming: added time to first chunk, added delay per chunk (the upstream stamps each
  event with the time it wrote it), events received, events merged into one read;
- tailfloor's RSS when idle and after the load.

Usage: python tests/bench/bench_proxy.py [--quick] [--with-litellm] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.loadgen import (
    API_KEY,
    BODY,
    StreamResult,
    measure_latency,
    measure_stream,
    measure_throughput,
    percentile,
)
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tailfloor-bench"


def wait_http(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers, which is all we wait for
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (robust to other load on the machine)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Services:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], name: str, env: dict[str, str] | None = None,
              ) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_nginx(services: Services, upstream_port: int) -> int | None:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                      else None)
    if nginx is None:
        print("nginx not installed: skipping that baseline (apt-get install nginx)")
        return None
    port = free_port()
    work = services.work / "nginx"
    work.mkdir()
    conf = work / "nginx.conf"
    temp = {name: work / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    conf.write_text(f"""
worker_processes 1; daemon off; pid {work}/nginx.pid; error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {temp['body']}; proxy_temp_path {temp['proxy']};
  fastcgi_temp_path {temp['fastcgi']}; uwsgi_temp_path {temp['uwsgi']};
  scgi_temp_path {temp['scgi']};
  upstream fake {{ server 127.0.0.1:{upstream_port}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://fake; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_request_buffering off;
    }}
  }}
}}
""")
    services.start([nginx, "-c", str(conf), "-e", str(work / "error.log")], "nginx")
    wait_http(f"http://127.0.0.1:{port}/v1/models", 15)
    return port


def start_litellm(services: Services, upstream_port: int) -> int:
    venv = CACHE / "litellm-venv"
    if not (venv / "bin" / "litellm").exists():
        print("installing LiteLLM into", venv, "(a few minutes, once)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
                       check=True)
    port = free_port()
    config = services.work / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: fake-model\n    litellm_params:\n"
        "      model: openai/fake-model\n"
        f"      api_base: http://127.0.0.1:{upstream_port}/v1\n      api_key: dummy\n")
    services.start([str(venv / "bin" / "litellm"), "--config", str(config), "--host",
                    "127.0.0.1", "--port", str(port)], "litellm",
                   env={"LITELLM_MASTER_KEY": API_KEY,
                        "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", 180)
    return port


def script_stream_replies(upstream_port: int, count: int, events: int, gap: float) -> None:
    reply = {"text": "__TS__" * events, "pieces": events, "stamp": True,
             "delay_between_chunks": gap}
    request = urllib.request.Request(
        f"http://127.0.0.1:{upstream_port}/_control/script",
        data=json.dumps([reply] * count).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5):
        pass


def summarise_stream(results: list[StreamResult]) -> dict[str, float]:
    firsts = sorted(r.first_chunk for r in results)
    per_chunk = [d for r in results for d in r.chunk_delays]
    return {
        "ttfc_p50_ms": percentile(firsts, 50) * 1e3,
        "ttfc_p99_ms": percentile(firsts, 99) * 1e3,
        "chunk_delay_mean_us": statistics.fmean(per_chunk) * 1e6,
        "chunk_delay_p50_us": percentile(sorted(per_chunk), 50) * 1e6,
        "events": sum(r.events for r in results),
        "merged_reads": sum(r.merged_reads for r in results),
    }


async def run(args: argparse.Namespace, targets: dict[str, int], upstream_port: int,
              tailfloor_pid: int) -> dict[str, dict[str, Any]]:
    rounds = 2 if args.quick else 6
    per_round = 100 if args.quick else 200
    c32_requests = 1000 if args.quick else 4000
    seconds = 3.0 if args.quick else 8.0
    out: dict[str, dict[str, Any]] = {name: {} for name in targets}
    # Interleave the targets so machine noise hits each one alike.
    c1: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(rounds):
        for name, port in targets.items():
            c1[name] += await measure_latency(port, BODY, concurrency=1, total=per_round)
    for name, port in targets.items():
        lat = sorted(c1[name])
        c32 = sorted(await measure_latency(port, BODY, concurrency=32, total=c32_requests))
        out[name].update({
            "c1_p50_ms": percentile(lat, 50) * 1e3, "c1_p99_ms": percentile(lat, 99) * 1e3,
            "c32_p50_ms": percentile(c32, 50) * 1e3, "c32_p99_ms": percentile(c32, 99) * 1e3,
        })
    before = cpu_seconds(tailfloor_pid)
    cpu_requests = 2000 if args.quick else 5000
    await measure_latency(targets["tailfloor"], BODY, concurrency=1, total=cpu_requests)
    out["tailfloor"]["cpu_us_per_request"] = (
        (cpu_seconds(tailfloor_pid) - before) / cpu_requests * 1e6)
    for name, port in targets.items():
        rps, dropped = await measure_throughput(port, BODY, 64, seconds)
        out[name].update({"rps_c64": rps, "dropped_connections_c64": dropped})
    streams = 10 if args.quick else 40
    for name, port in targets.items():
        script_stream_replies(upstream_port, streams, events=20, gap=0.005)
        before = cpu_seconds(tailfloor_pid)
        results = [await measure_stream(port) for _ in range(streams)]
        if name == "tailfloor":
            chunks = sum(r.events for r in results)
            out[name]["cpu_us_per_chunk"] = (cpu_seconds(tailfloor_pid) - before) / chunks * 1e6
        out[name].update(summarise_stream(results))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--with-litellm", action="store_true", help="add LiteLLM's proxy")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tailfloor-bench-"))
    services = Services(work)
    try:
        upstream_port = free_port()
        services.start([sys.executable, "tests/fake_upstream.py", "--port", str(upstream_port)],
                       "upstream")
        wait_http(f"http://127.0.0.1:{upstream_port}/v1/models", 15)
        tailfloor_port = free_port()
        tailfloor = services.start(
            [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{tailfloor_port}",
             "--admin-listen", "127.0.0.1:0", "--upstream", f"http://127.0.0.1:{upstream_port}"],
            "tailfloor")
        wait_http(f"http://127.0.0.1:{tailfloor_port}/readyz", 30)
        time.sleep(0.5)
        idle_rss = rss_mb(tailfloor.pid)
        targets = {"direct": upstream_port, "tailfloor": tailfloor_port}
        nginx_port = start_nginx(services, upstream_port)
        if nginx_port is not None:
            targets["nginx"] = nginx_port
        if args.with_litellm:
            targets["litellm"] = start_litellm(services, upstream_port)
        results = asyncio.run(run(args, targets, upstream_port, tailfloor.pid))
        results["tailfloor"]["rss_idle_mb"] = idle_rss
        results["tailfloor"]["rss_after_mb"] = rss_mb(tailfloor.pid)
    finally:
        services.stop()
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def report(results: dict[str, dict[str, Any]]) -> None:
    direct = results["direct"]
    rows = [
        ("c1 p50 ms", "c1_p50_ms"), ("c1 p99 ms", "c1_p99_ms"),
        ("c32 p50 ms", "c32_p50_ms"), ("c32 p99 ms", "c32_p99_ms"),
        ("rps at c64", "rps_c64"), ("dropped conns at c64", "dropped_connections_c64"),
        ("stream TTFC p50 ms", "ttfc_p50_ms"),
        ("stream TTFC p99 ms", "ttfc_p99_ms"), ("per-chunk delay mean us", "chunk_delay_mean_us"),
        ("events received", "events"), ("merged reads", "merged_reads"),
    ]
    names = list(results)
    print(f"\n{'metric':<26}" + "".join(f"{n:>14}" for n in names))
    for label, key in rows:
        print(f"{label:<26}" + "".join(f"{results[n].get(key, float('nan')):>14.3f}"
                                       for n in names))
    print("\nadded over direct (the part each proxy costs):")
    for label, key in rows[:4] + rows[6:9]:
        print(f"{label:<26}" + "".join(
            f"{results[n].get(key, float('nan')) - direct.get(key, float('nan')):>14.3f}"
            for n in names))
    tailfloor = results["tailfloor"]
    print(f"\ntailfloor RSS: idle {tailfloor['rss_idle_mb']:.1f} MB, "
          f"after load {tailfloor['rss_after_mb']:.1f} MB; CPU "
          f"{tailfloor['cpu_us_per_request']:.0f} us per request, "
          f"{tailfloor['cpu_us_per_chunk']:.0f} us per stream event (whole process)")
    print("\n" + json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
