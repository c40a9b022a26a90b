"""The first scan's JSONL reads spread over worker processes (``scan_worker``), handed back
in the order of the paths. I/O: starts processes, reads their pipes (in the reader thread).

Each worker gets every ``workers``-th block of ``BLOCK`` paths and answers block after
block; the blocks are taken back in order, so the tracker puts sessions in the catalog in
the order it always did while the workers read ahead. A worker that cannot start, dies or
answers garbage is stopped and reported; its blocks (``None`` for each path) are read by
the caller itself, so a scan never loses a file to a worker.
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import tempfile
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import IO

from proxy.transcripts.cpus import usable_cpus
from proxy.transcripts.scan_worker import FRAME, MAX_FRAME, Read, write_frame

__all__ = ["BLOCK", "MAX_WORKERS", "PATIENCE", "POOL_FROM", "WORKER", "reads",
           "worker_environment", "workers_for"]

BLOCK = 64  # paths per answer: a few hundred KB at most
POOL_FROM = 2000  # JSONL files; fewer are read before workers would have started (~0.1 s)
MAX_WORKERS = 4
PATIENCE = 30.0  # seconds a worker may send nothing before it is taken for hung
_PIPE_BYTES = 1 << 20  # room for a worker to read ahead while the tracker works
# ``-P``: nothing from the working directory comes first on the worker's path (a file
# named like a module it imports, left where the server was started, would run in it).
WORKER = ("-P", "-m", "proxy.transcripts.scan_worker")

# What a worker's interpreter may need from the server's environment to start and to read
# file names as the server does; nothing else (the server's may hold keys and tokens).
_PASSED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH",
                     "SYSTEMROOT"})
_PASSED_PREFIXES = ("LC_", "PYTHON")

ErrorSink = Callable[[str, str, str], None]


def worker_environment(server: dict[str, str], path: Sequence[str]) -> dict[str, str]:
    """The environment a worker starts with: what it needs of ``server``'s, and ``path``."""
    env = {k: v for k, v in server.items()
           if k in _PASSED or k.startswith(_PASSED_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


def workers_for(files: int, setting: str, cpus: float) -> int:
    """Worker processes for a scan of ``files`` JSONL files: ``setting`` is a number or
    ``auto`` (one a usable CPU, up to ``MAX_WORKERS``, when there are two CPUs or more and
    enough files to be worth the start)."""
    if setting != "auto":
        return min(int(setting), MAX_WORKERS) if files else 0
    if files < POOL_FROM or cpus < 2:
        return 0
    return min(int(cpus), MAX_WORKERS)


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    errors: IO[bytes]  # its stderr, for the report when it fails


def reads(paths: Sequence[str], setting: str, job: tuple[int | None, int, int],
          on_error: ErrorSink) -> Generator[Read | None, None, None]:
    """One item per path, in order: what a worker read, or None (read it yourself).
    ``setting``: ``--scan-workers``; ``job``: ``scan_worker.read_one``'s startup messages,
    whole-file bound and tail limit."""
    blocks = [list(paths[i:i + BLOCK]) for i in range(0, len(paths), BLOCK)]
    count = min(workers_for(len(paths), setting, usable_cpus()), len(blocks))
    workers = [_start(job, blocks[i::count], on_error) for i in range(count)]
    try:
        for b, block in enumerate(blocks):
            worker = workers[b % count] if count else None
            answer = _answer(worker.proc, len(block)) if worker is not None else None
            if worker is not None and answer is None:
                on_error("scan_worker", "scan", f"a scan worker stopped answering "
                         f"({_ended(worker)}); this process reads its files")
                workers[b % count] = None
            yield from answer if answer is not None else [None] * len(block)
    finally:
        for worker in workers:
            if worker is not None:
                _ended(worker)


def _start(job: tuple[int | None, int, int], blocks: list[list[str]], on_error: ErrorSink
           ) -> _Worker | None:
    # The paths go in a file, not a pipe: writing them never waits on a worker that does
    # not read. The worker's path is this process's, so it imports what this one did.
    env = worker_environment(dict(os.environ), sys.path)
    errors = tempfile.TemporaryFile()  # noqa: SIM115 -- kept with the worker, closed by _ended
    try:
        with tempfile.TemporaryFile() as given:
            write_frame(given, (*job, len(blocks)))
            for block in blocks:
                write_frame(given, block)
            given.seek(0)
            proc = subprocess.Popen(  # this interpreter, this package's module
                [sys.executable or "python3", *WORKER], stdin=given, stdout=subprocess.PIPE,
                stderr=errors, env=env, close_fds=True, bufsize=0)
    except OSError as exc:
        errors.close()
        on_error("scan_worker", "scan", f"no scan worker: {exc.strerror or exc}")
        return None
    assert proc.stdout is not None
    try:  # Linux only; a default pipe works
        import fcntl
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (OSError, AttributeError, ImportError):
        pass
    return _Worker(proc, errors)


def _answer(proc: subprocess.Popen[bytes], expected: int) -> list[Read] | None:
    """The worker's next block, or None when it ended, hung or sent something else."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    head = _read_exactly(fd, FRAME.size)
    size = FRAME.unpack(head)[0] if head is not None else MAX_FRAME + 1
    data = _read_exactly(fd, size) if size <= MAX_FRAME else None
    try:
        answer = pickle.loads(data) if data is not None else None  # our child wrote it
    except Exception:  # a frame that does not unpickle
        return None
    if not isinstance(answer, list) or len(answer) != expected:
        return None
    return answer


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from the pipe; None at its end or after ``PATIENCE`` s of silence."""
    poller = select.poll()  # not select(): a server's descriptors pass 1024
    poller.register(fd, select.POLLIN)
    parts: list[bytes] = []
    left = size
    while left:
        if not poller.poll(PATIENCE * 1000):
            return None
        chunk = os.read(fd, min(left, _PIPE_BYTES))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _ended(worker: _Worker) -> str:
    """Ends a worker, done or not (its pipe closed first: one still writing gets a broken
    pipe; then a short wait, as one that sent its last block is exiting); how it ended."""
    proc = worker.proc
    if proc.stdout is not None:
        proc.stdout.close()
    try:
        proc.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    worker.errors.seek(0, os.SEEK_END)
    worker.errors.seek(max(0, worker.errors.tell() - 300))
    said = worker.errors.read().decode("utf-8", "replace").strip().splitlines()[-1:]
    worker.errors.close()
    return f"exit {proc.returncode}" + (f": {said[0][:200]}" if said else "")
