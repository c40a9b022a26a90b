"""Driving the real Pi agent in RPC mode (``pi --mode rpc``): one long-running process, as a
user's Pi runs, writing its transcript while it sends its requests.

Commands are JSON lines on stdin (``{"type": "prompt", "message": ...}``, ``new_session``,
``compact``); events come back as JSON lines on stdout (``agent_end`` ends a prompt,
``compaction_start``/``compaction_end`` bracket a compaction, ``response`` answers a command).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from typing import Any

from tests.agents.pi_agent import PiAgent


class PiRpc:
    def __init__(self, agent: PiAgent) -> None:
        self.agent = agent
        self.events: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        env = {**os.environ, "PI_CODING_AGENT_DIR": str(agent.agent_dir), "PI_OFFLINE": "1"}
        self._proc = subprocess.Popen(
            [*agent.pi.command(), *agent.args, "--mode", "rpc", "--session-dir",
             str(agent.sessions)],
            cwd=agent.work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        self._ids = 0
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = {"type": "_raw", "line": line.decode("utf-8", "replace")}
            self.events.append(event)
            self._queue.put(event)
        self._queue.put({"type": "_eof"})

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line.decode("utf-8", "replace"))

    def send(self, command: dict[str, Any]) -> str:
        self._ids += 1
        assert self._proc.stdin is not None
        ident = f"t{self._ids}"
        self._proc.stdin.write((json.dumps({**command, "id": ident}) + "\n").encode())
        self._proc.stdin.flush()
        return ident

    def wait(self, kind: str, timeout: float = 60, ident: str | None = None
             ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if event.get("type") == "_eof":
                raise RuntimeError("pi exited: " + "".join(self._stderr)[-2000:])
            if event.get("type") == kind and (ident is None or event.get("id") == ident):
                return event
        raise TimeoutError(f"no {kind} event from pi within {timeout:.0f} s")

    def prompt(self, message: str) -> bool:
        """One user turn, to its end; whether Pi compacted during it or right after it (Pi
        1.x also compacts inside a tool loop, between a tool result and the next call)."""
        seen = len(self.events)
        self.send({"type": "prompt", "message": message})
        self.wait("agent_end")
        # Pi checks its threshold after the turn and compacts before taking the next one.
        time.sleep(0.3)
        kinds = [e.get("type") for e in self.events[seen:]]
        starts = kinds.count("compaction_start")
        if starts > kinds.count("compaction_end"):
            self.wait("compaction_end")
        return starts > 0

    def new_session(self) -> None:
        # The answer to this command, not a late one to an earlier prompt.
        self.wait("response", ident=self.send({"type": "new_session"}))

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
