"""How many CPUs this process may use (I/O: reads /proc and /sys/fs/cgroup).

Its affinity, capped by the tightest CPU quota of its cgroup and the cgroups above it: a
container's limit (a pod with 500m), a systemd unit's ``CPUQuota=``, a quota set on a
parent slice. cgroup v2 (``cpu.max``: ``<quota|max> <period>``) and v1
(``cpu.cfs_quota_us``, -1 for none, and ``cpu.cfs_period_us``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["quota", "usable_cpus"]


def usable_cpus(cgroups: Path = Path("/sys/fs/cgroup"),
                membership: Path = Path("/proc/self/cgroup")) -> float:
    cpus: float
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    limit = quota(cgroups, membership)
    return min(cpus, limit) if limit is not None else cpus


def quota(cgroups: Path, membership: Path) -> float | None:
    """The tightest CPU quota over this process's cgroups and their ancestors, in CPUs."""
    found: list[float] = []
    for place in _places(cgroups, membership):
        for quota_file, period_file in (("cpu.max", None),
                                        ("cpu.cfs_quota_us", "cpu.cfs_period_us")):
            try:
                amount, *rest = (place / quota_file).read_text().split()
                period = int((place / period_file).read_text() if period_file else rest[0])
                if amount not in ("max", "-1") and period > 0:
                    found.append(int(amount) / period)
            except (OSError, ValueError, IndexError):
                continue
    return min(found) if found else None


def _places(cgroups: Path, membership: Path) -> list[Path]:
    """The cgroup directories to read: the mount's top (a container's own cgroup when its
    namespace is private), and the process's cgroup with every ancestor below the mount."""
    places = [cgroups, cgroups / "cpu", cgroups / "cpu,cpuacct"]
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return places
    for line in lines:
        _id, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers not in ("", "cpu", "cpu,cpuacct", "cpuacct,cpu"):
            continue
        bases = [cgroups] if controllers == "" else [cgroups / "cpu", cgroups / "cpu,cpuacct"]
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        for base in bases:
            places += [base.joinpath(*parts[:n]) for n in range(1, len(parts) + 1)]
    return places
