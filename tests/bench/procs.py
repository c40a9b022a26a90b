"""A process's own resource use, from the OS's accounting (/proc), for a process tree.

A proxy's CPU is read as utime + stime of every live process under its root (nginx's master
and workers, a peer's workers), plus cutime + cstime (what its children that already ended
and were reaped had used), so the figure holds whatever the load on the rest of the machine.
Those are in clock ticks (10 ms here): a cheap process's few ticks over a short load are too
coarse, so the same time is also read in nanoseconds from the scheduler's own sum for each
live thread (/proc/<pid>/task/<tid>/schedstat, the runtime utime + stime are scaled to);
it misses only threads that ended during the measurement.
"""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3 onwards)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()


def parse_cpu_ticks(fields: list[str]) -> int:
    """utime + stime + cutime + cstime (fields 14-17 of stat; here 11-14 after the name)."""
    return int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])


def children_map() -> dict[int, list[int]]:
    """Every live process's children, from the parent ids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            parent = int(_stat_fields(int(entry.name))[1])
        except (OSError, IndexError, ValueError):
            continue  # ended while we looked
        children.setdefault(parent, []).append(int(entry.name))
    return children


def tree(root: int) -> list[int]:
    """``root`` and every live descendant of it."""
    children = children_map()
    out: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time one process has used."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(root: int) -> float:
    """CPU used by ``root``'s whole tree: live processes plus their reaped children."""
    ticks = 0
    for pid in tree(root):
        try:
            ticks += parse_cpu_ticks(_stat_fields(pid))
        except (OSError, IndexError, ValueError):
            continue
    return ticks / CLOCK_TICKS


def tree_cpu_ns(root: int) -> int:
    """Nanoseconds on CPU of every live thread of ``root``'s tree (0 without schedstat)."""
    total = 0
    for pid in tree(root):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total


def thread_cpu_ns(pid: int, tid: int) -> int:
    """Nanoseconds on CPU of one thread (a process's main thread: ``tid`` = ``pid``)."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return 0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tree_rss_mb(root: int) -> float:
    """Resident memory of the whole tree (shared pages counted once per process)."""
    total = 0.0
    for pid in tree(root):
        try:
            total += rss_mb(pid)
        except OSError:
            continue
    return total


class CpuMeter:
    """CPU a process tree uses between ``start()`` and ``stop()``: ``stop()`` answers the
    precise figure (schedstat) where the kernel keeps it, else utime + stime; ``ticks_seconds``
    keeps the utime + stime one."""

    def __init__(self, root: int) -> None:
        self.root = root
        self._began = 0.0
        self._began_ns = 0
        self.ticks_seconds = 0.0
        self.precise_seconds = 0.0
        self._main_began_ns = 0
        self.main_thread_seconds = 0.0  # the root's main thread alone (an event loop's)

    def start(self) -> None:
        self._began_ns = tree_cpu_ns(self.root)
        self._main_began_ns = thread_cpu_ns(self.root, self.root)
        self._began = tree_cpu_seconds(self.root)

    def stop(self) -> float:
        self.ticks_seconds = tree_cpu_seconds(self.root) - self._began
        self.main_thread_seconds = (thread_cpu_ns(self.root, self.root)
                                    - self._main_began_ns) / 1e9
        self.precise_seconds = (tree_cpu_ns(self.root) - self._began_ns) / 1e9
        return self.precise_seconds if self.precise_seconds > 0 else self.ticks_seconds


def settle(root: int, quiet_ms: float = 5.0, window: float = 0.5, seconds: float = 30.0,
           ) -> float:
    """Wait until ``root``'s tree uses under ``quiet_ms`` of CPU in ``window`` seconds (work
    started by a first request, such as a tokenizer table loading in a thread, is done);
    answers the seconds waited."""
    import time

    began = time.monotonic()
    while time.monotonic() - began < seconds:
        before = tree_cpu_ns(root) or int(tree_cpu_seconds(root) * 1e9)
        time.sleep(window)
        after = tree_cpu_ns(root) or int(tree_cpu_seconds(root) * 1e9)
        if (after - before) / 1e6 < quiet_ms:
            break
    return time.monotonic() - began
