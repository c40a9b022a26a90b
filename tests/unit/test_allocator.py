"""The C library's free pages go back to the system: proxy/server/allocator.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from proxy.server import allocator
from proxy.server.allocator import trim_after_work
from tests.unit.served_with import served_with_a_marked_task

# In a process of its own, so its resident memory is this heap's alone: 200 blocks of
# 256 KiB, each written (resident), from the heap (under the 1 MiB threshold the server
# sets); all freed but the last, which keeps the heap's top in use, so glibc's free cannot
# shrink the heap from its end and the 50 MB freed in its middle stay resident.
_FRAGMENTED_HEAP = textwrap.dedent("""
    import ctypes, json
    from proxy.server.allocator import give_back_large_blocks, return_free_pages

    def anon_kb():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    give_back_large_blocks()
    start = anon_kb()
    blocks = [libc.malloc(256 * 1024) for _ in range(200)]
    for block in blocks:
        ctypes.memset(block, 1, 256 * 1024)
    written = anon_kb()
    for block in blocks[:-1]:
        libc.free(block)
    freed = anon_kb()
    gave = return_free_pages()
    trimmed = anon_kb()
    print(json.dumps({"start": start, "written": written, "freed": freed,
                      "trimmed": trimmed, "gave": gave}))
""")


def test_pages_freed_inside_the_heap_go_back_only_when_trimmed() -> None:
    done = subprocess.run([sys.executable, "-c", _FRAGMENTED_HEAP], capture_output=True,
                          text=True, timeout=60, check=True)
    kb = json.loads(done.stdout)
    held = kb["written"] - kb["start"]
    assert held > 45_000, kb  # the 50 MB were resident
    # freeing alone leaves them resident: what a long-running process's RSS shows
    assert kb["freed"] - kb["start"] > 0.8 * held, kb
    assert kb["gave"] is True
    # the trim gives all but the last block back
    assert kb["trimmed"] - kb["start"] < 0.1 * held, kb


def test_a_trim_follows_a_minute_of_work_and_never_an_idle_one() -> None:
    # looks a minute apart: idle minutes that add up past half a second, a busy one, idle
    # again, a busy one
    cpu_seconds = [0.0, 0.3, 0.6, 0.9, 1.5, 1.6, 1.7, 2.0, 5.0]
    looks: list[float] = []
    trimmed_at: list[float] = []
    on_loop_thread: list[bool] = []
    done = asyncio.Event()

    def cpu() -> float:
        value = cpu_seconds[min(len(looks), len(cpu_seconds) - 1)]
        looks.append(value)
        if len(looks) >= len(cpu_seconds):
            done.set()
        return value

    def trim() -> bool:
        trimmed_at.append(looks[-1])
        on_loop_thread.append(threading.current_thread() is threading.main_thread())
        return True

    async def run() -> None:
        task = asyncio.create_task(trim_after_work(every=0.001, trim=trim, cpu=cpu))
        await asyncio.wait_for(done.wait(), 5)
        await asyncio.sleep(0.05)  # the last look's trim runs in a thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    # half a CPU second within one minute asks for a trim; idle minutes never do, however
    # many
    assert trimmed_at == [1.5, 5.0]
    assert on_loop_thread == [False, False]  # the heaps' walk is off the event loop


def test_the_server_runs_the_trim_while_it_serves_and_ends_it_at_sigterm(
        tmp_path: Path) -> None:
    first, out, status, err = served_with_a_marked_task(
        "trim_after_work", 'print("trim started", flush=True)', tmp_path)
    assert (first, out, status) == ("trim started", "stopped", 0), err


def test_where_the_c_library_cannot_trim_the_task_ends_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert allocator._c_function("no_such_function_in_any_libc") is None
    monkeypatch.setattr(allocator, "_malloc_trim", lambda: None)
    # returns, where a library with the call would loop until cancelled
    asyncio.run(asyncio.wait_for(trim_after_work(every=0.001), 5))
