"""The first scan's JSONL reads spread over worker processes (``scan_worker``), handed back
in the order of the paths. I/O: starts processes, reads their pipes (in the reader thread).

Each worker gets every ``workers``-th block of ``BLOCK`` paths and answers block after
block; the blocks are taken back in order, so the tracker puts sessions in the catalog in
the order it always did while the workers read ahead. A worker that cannot start, dies or
answers garbage is stopped and reported; its blocks (``None`` for each path) are read by
the caller itself, so a scan never loses a file to a worker.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Generator, Sequence
from pathlib import Path

from proxy.transcripts.scan_worker import Read, read_frame, write_frame

__all__ = ["BLOCK", "MAX_WORKERS", "POOL_FROM", "WORKER", "reads", "usable_cpus", "workers_for"]

BLOCK = 64  # paths per answer: a few hundred KB at most
POOL_FROM = 2000  # JSONL files; fewer are read before workers would have started (~0.1 s)
MAX_WORKERS = 4
_PIPE_BYTES = 1 << 20  # room for a worker to read ahead while the tracker works
_PACKAGE_HOME = str(Path(__file__).resolve().parents[2])  # the directory holding proxy/
WORKER = ("-m", "proxy.transcripts.scan_worker")  # after the interpreter's path

ErrorSink = Callable[[str, str, str], None]


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> float:
    """The CPUs this process may use: its affinity, capped by a cgroup CPU quota (a
    container's limit: a pod with 500m gets no worker that would only compete with it)."""
    try:
        cpus: float = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    for quota_file, period_file in (("cpu.max", None),  # v2: "<quota|max> <period>"
                                    ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            quota, *rest = (cgroup / quota_file).read_text().split()
            period = (cgroup / period_file).read_text() if period_file else rest[0]
            if quota not in ("max", "-1"):
                return min(cpus, int(quota) / int(period))
        except (OSError, ValueError, IndexError):
            continue
    return cpus


def workers_for(files: int, setting: str, cpus: float) -> int:
    """Worker processes for a scan of ``files`` JSONL files: ``setting`` is a number or
    ``auto`` (one a usable CPU, up to ``MAX_WORKERS``, when there are two CPUs or more and
    enough files to be worth the start)."""
    if setting != "auto":
        return min(int(setting), MAX_WORKERS) if files else 0
    if files < POOL_FROM or cpus < 2:
        return 0
    return min(int(cpus), MAX_WORKERS)


def reads(paths: Sequence[str], setting: str, job: tuple[int | None, int, int],
          on_error: ErrorSink) -> Generator[Read | None, None, None]:
    """One item per path, in order: what a worker read, or None (read it yourself).
    ``setting``: ``--scan-workers``; ``job``: ``scan_worker.read_one``'s startup messages,
    whole-file bound and tail limit."""
    blocks = [list(paths[i:i + BLOCK]) for i in range(0, len(paths), BLOCK)]
    count = min(workers_for(len(paths), setting, usable_cpus()), len(blocks))
    procs = [_start(on_error) for _ in range(count)]
    try:
        for i, proc in enumerate(procs):
            if proc is not None and not _send(proc, job, blocks[i::count]):
                on_error("scan_worker", "scan", "a scan worker refused its paths")
                _stop(proc)
                procs[i] = None
        for b, block in enumerate(blocks):
            proc = procs[b % count] if count else None
            answer = _answer(proc, len(block)) if proc is not None else None
            if proc is not None and answer is None:
                on_error("scan_worker", "scan", f"a scan worker stopped answering "
                         f"(exit {proc.poll()}); this process reads its files")
                _stop(proc)
                procs[b % count] = None
            yield from answer if answer is not None else [None] * len(block)
    finally:
        for proc in procs:
            if proc is not None:
                _stop(proc)


def _start(on_error: ErrorSink) -> subprocess.Popen[bytes] | None:
    home = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (_PACKAGE_HOME, home)))}
    try:
        proc = subprocess.Popen(  # this interpreter, this package's module
            [sys.executable or "python3", *WORKER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, close_fds=True)
    except OSError as exc:
        on_error("scan_worker", "scan", f"no scan worker: {exc.strerror or exc}")
        return None
    assert proc.stdout is not None
    with contextlib.suppress(OSError, AttributeError):  # Linux only; a default pipe works
        import fcntl
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    return proc


def _send(proc: subprocess.Popen[bytes], job: tuple[int | None, int, int],
          blocks: list[list[str]]) -> bool:
    assert proc.stdin is not None
    try:
        write_frame(proc.stdin, (*job, len(blocks)))
        for block in blocks:
            write_frame(proc.stdin, block)
        proc.stdin.close()
    except OSError:
        return False
    return True


def _answer(proc: subprocess.Popen[bytes], expected: int) -> list[Read] | None:
    """The worker's next block, or None when it ended or sent something else."""
    assert proc.stdout is not None
    try:
        answer = read_frame(proc.stdout)
    except Exception:  # a cut stream, or a frame that does not unpickle
        return None
    if not isinstance(answer, list) or len(answer) != expected:
        return None
    return answer


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends a worker, done or not: its pipes closed first (one still writing gets a broken
    pipe and ends), then a short wait (one that sent its last block is exiting)."""
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    try:
        proc.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
