"""``tailfloor serve`` in a process of its own with one of ``proxy.server.run``'s tasks
swapped for a marked one: whether the server starts the task, and stops it at SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

_SCRIPT = """
import asyncio, gc, sys
from proxy.cli.main import main
from proxy.server import run

async def marked():
{on_start}
    try:
        await asyncio.Event().wait()
    finally:
        print("stopped", flush=True)

run.{task} = marked
sys.exit(main(sys.argv[1:]))
"""


def served_with_a_marked_task(task: str, on_start: str, sessions: Path
                              ) -> tuple[str, str, int, str]:
    """Serves with ``app.<task>`` swapped for a task that runs ``on_start`` (lines of Python
    that print one line), waits, and prints ``stopped`` when cancelled; reads that first
    line, then sends SIGTERM. The first line, the rest of the output, the exit status and
    what was written to stderr."""
    script = _SCRIPT.format(task=task, on_start=textwrap.indent(textwrap.dedent(on_start),
                                                                 "    "))
    served = subprocess.Popen(
        [sys.executable, "-c", script, "serve", "--listen", "127.0.0.1:0",
         "--admin-listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9",
         "--sessions", str(sessions)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # a server that never starts the task prints nothing: the timer ends the wait
    deadline = threading.Timer(30, served.kill)
    deadline.start()
    try:
        assert served.stdout is not None
        first = served.stdout.readline().strip()
        served.send_signal(signal.SIGTERM)
        out, err = served.communicate(timeout=30)
    finally:
        deadline.cancel()
        served.kill()
    return first, out.strip(), served.returncode, err
