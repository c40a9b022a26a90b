"""Peak memory: what a tailfloor process holds with its sessions tracked and large requests
in flight, the figures the chart's memory request and limit are set from.

    python -m tests.bench.memory_peak [--dirs 100] [--per-dir 100] [--bodies 8] [--body-mb 7.5]

Writes ``dirs`` x ``per_dir`` Pi sessions (as ``cold_start`` does), starts ``python -m proxy
serve`` on them in front of the fake upstream, waits until ready, then sends ``bodies`` chat
requests of ``body-mb`` MB each at once (together just under what ``--max-buffered-bytes``
was when this was written: 64 MiB of bytes; the budget now also counts the parsed forms, 48
MiB by default, so some of them wait for room or get 503 ``busy``), which the fake upstream
holds for two seconds before it answers, twice. Reports RSS once ready, the peak (the
kernel's high-water mark, ``VmHWM``) and RSS after the requests. The baseline, in the same
run: the same process and load over an empty root. The inspector is on as by default (its
own budget, 32 MiB, is part of the peak once it keeps the requests).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.bench.cold_start import fake_upstream, generate, serving, sessions_parser
from tests.bench.procs import rss_mb

HOLD_MS = 2000


def high_water_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def body(index: int, megabytes: float) -> bytes:
    """A chat request of about ``megabytes`` MB: an agent's history of long turns."""
    turn = (f"The build failed in step {index}; the log says the linker could not find the "
            "symbol, so the next try rebuilds the cache first. ") * 40
    count = max(1, int(megabytes * 1e6 / (len(turn) + 40)))
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(count):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
    messages.append({"role": "user", "content": f"What next? ({index})"})
    return json.dumps({"model": "fake-model", "stream": False, "messages": messages}).encode()


async def wait_ready(admin: int, give_up: float = 300.0) -> float:
    began = time.monotonic()
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - began < give_up:
            try:
                async with http.get(f"http://127.0.0.1:{admin}/readyz") as response:
                    if response.status == 200:
                        return time.monotonic() - began
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("tailfloor never became ready")


async def load(port: int, bodies: list[bytes]) -> list[int]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions?fake_delay_ms={HOLD_MS}"
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async def one(data: bytes) -> int:
            async with http.post(url, data=data,
                                 headers={"Content-Type": "application/json"}) as response:
                await response.read()
                return response.status
        return list(await asyncio.gather(*(one(b) for b in bodies)))


def run_one(root: Path, upstream: int, bodies: list[bytes]) -> dict[str, Any]:
    with serving(root, upstream) as (proc, port, admin):
        ready_s = asyncio.run(wait_ready(admin))
        out: dict[str, Any] = {"ready_s": round(ready_s, 2),
                               "rss_ready_mb": round(rss_mb(proc.pid), 1),
                               "peak_ready_mb": round(high_water_mb(proc.pid), 1)}
        statuses = []
        for _ in range(2):
            statuses += asyncio.run(load(port, bodies))
        out["statuses"] = {str(code): statuses.count(code) for code in sorted(set(statuses))}
        out["peak_mb"] = round(high_water_mb(proc.pid), 1)
        out["rss_after_mb"] = round(rss_mb(proc.pid), 1)
        return out


def main() -> None:
    parser = sessions_parser(__doc__ or "")
    parser.add_argument("--bodies", type=int, default=8)
    parser.add_argument("--body-mb", type=float, default=7.5)
    args = parser.parse_args()
    with fake_upstream("tailfloor-memory-") as (work, upstream_port):
        empty, full = work / "empty", work / "full"
        empty.mkdir()
        size = generate(full, args.dirs, args.per_dir)
        bodies = [body(i, args.body_mb) for i in range(args.bodies)]
        result = {"sessions": args.dirs * args.per_dir, "transcript_bytes": size,
                  "bodies": len(bodies), "body_bytes": sum(map(len, bodies)),
                  "baseline_empty_root": run_one(empty, upstream_port, bodies),
                  "with_sessions": run_one(full, upstream_port, bodies)}
        print(json.dumps(result, indent=2))

if __name__ == "__main__":
    main()
