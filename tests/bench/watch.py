"""A watcher in its own process: ``/healthz`` asked every few milliseconds on a new
connection (as a kubelet's probe does) and a process's resident memory read from /proc, so
neither waits on the load the benchmark itself generates.

    with Watch(pid, admin_port) as watch: ...   # then watch.result: probes and samples
"""

from __future__ import annotations

import multiprocessing
import socket
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tests.bench.procs import children_map

__all__ = ["Watch", "child_memory_mb", "memory_mb", "percentiles"]

PROBE_TIMEOUT = 10.0


def memory_mb(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` (the kernel's high-water mark of RSS) of ``pid``, in MB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) / 1024
    return out


def child_memory_mb(pid: int) -> float:
    """``VmRSS`` of ``pid``'s children together, in MB (the health process)."""
    total = 0.0
    for child in children_map().get(pid, ()):
        try:
            total += memory_mb(child)["VmRSS"]
        except (OSError, KeyError):
            continue  # ended while we looked
    return total


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``values`` (milliseconds), and how many there were."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 1)
    return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 1),
            "count": len(ordered)}


def _probe(port: int) -> float:
    """Milliseconds until ``/healthz`` answered 200 (``PROBE_TIMEOUT`` when it did not)."""
    began = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            answer = b""
            while piece := sock.recv(4096):
                answer += piece
        if not answer.startswith(b"HTTP/1.1 200"):
            return PROBE_TIMEOUT * 1000
    except OSError:
        return PROBE_TIMEOUT * 1000
    return (time.perf_counter() - began) * 1000


def _watch(pid: int, ports: tuple[int, int | None, int | None], every: float,
           orders: Connection) -> None:
    port, health, other = ports
    probes: list[tuple[float, float]] = []  # (monotonic start, ms)
    others: list[float] = []
    healths: list[float] = []
    samples: list[tuple[float, float]] = []  # (monotonic, VmRSS MB)
    orders.send("watching")
    while not orders.poll(0):
        began = time.monotonic()
        probes.append((began, _probe(port)))
        if health is not None:
            healths.append(_probe(health))
        if other is not None:
            others.append(_probe(other))
        try:
            samples.append((time.monotonic(), memory_mb(pid)["VmRSS"]))
        except (OSError, KeyError):
            break  # the process is gone
        time.sleep(max(0.0, every - (time.monotonic() - began)))
    orders.send({"probes": probes, "others": others, "healths": healths,
                 "samples": samples})


class Watch:
    """Probes ``/healthz`` on ``port`` every ``every`` seconds and samples ``pid``'s RSS
    after each probe, from a process of its own, until the block ends. ``health``: the
    health process's port, probed the same way right after; ``other``: a server probed the
    same way after that (an idle one: what the machine itself adds)."""

    def __init__(self, pid: int, port: int, every: float = 0.015, other: int | None = None,
                 health: int | None = None) -> None:
        self.pid, self.port, self.every, self.other = pid, port, every, other
        self.health = health
        self.result: dict[str, Any] = {}
        self.began = 0.0

    def __enter__(self) -> Watch:
        context = multiprocessing.get_context("spawn")
        self._orders, theirs = context.Pipe()
        self._process = context.Process(target=_watch, daemon=True,
                                        args=(self.pid, (self.port, self.health, self.other),
                                              self.every, theirs))
        self._process.start()
        self._orders.recv()  # the process's imports done: the watch starts now
        self.began = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self._orders.send("stop")
        self.result = self._orders.recv()
        self._process.join(10)

    def healthz(self) -> dict[str, float]:
        return percentiles([ms for _, ms in self.result["probes"]])

    def other_healthz(self) -> dict[str, float]:
        return percentiles(self.result["others"])

    def health_process_healthz(self) -> dict[str, float]:
        """The same probe of the health process (``--health-listen``), right after."""
        return percentiles(self.result["healths"])

    def slow(self, bound_ms: float) -> list[tuple[float, float]]:
        """The probes slower than ``bound_ms``: (monotonic start, ms)."""
        return [(at, ms) for at, ms in self.result["probes"] if ms > bound_ms]

    def peak_sample(self) -> tuple[float, float]:
        """The sampled RSS at its highest: (monotonic, MB)."""
        return max(self.result["samples"], key=lambda s: s[1], default=(0.0, 0.0))
