"""The proxy's side of the health process (``--health-listen``): the listening socket it binds,
the answers its event loop gives to the health process's questions, and the process it
starts, and starts again if it ever dies. proxy/health/responder.py is the process itself.

Event-driven both ways: the loop is woken only by a question (one a probe, at most one
outstanding), never by a timer of its own, so an idle proxy stays asleep."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from proxy.health.verdict import STARTING, readiness_byte

__all__ = ["HealthProcess"]

log = logging.getLogger("tailfloor")

RESTART_AFTER = 5.0  # seconds between starts of a health process that keeps dying
# -I -S: nothing from the environment or site-packages is imported; the package's own
# directory is put on the path by hand (after the standard library's, so nothing there is
# shadowed), so only the responder and what it imports load.
_BOOT = ("import sys; sys.path.append(sys.argv[1]); "
         "from proxy.health.responder import main; main(sys.argv[2:])")


class HealthProcess:
    """Owns the listening socket for as long as the proxy runs (so a restarted health process
    takes the same port, connections waiting in its backlog meanwhile), the read end of the
    questions' pipe, and the write end of the answers' pipe, whose end tells the health
    process to exit."""

    def __init__(self, listener: socket.socket, stale_after: float) -> None:
        self.listener = listener
        self.stale_after = stale_after
        self.readiness: Callable[[], int] = lambda: STARTING
        self._process: subprocess.Popen[bytes] | None = None
        self._asks = self._answers = -1
        self._started_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._restart: asyncio.TimerHandle | None = None

    @classmethod
    def bind(cls, host: str, port: int, stale_after: float) -> HealthProcess:
        """Bind now (an ``OSError`` names a taken port before anything else starts)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return cls(socket.create_server((host, port), family=family, backlog=128), stale_after)

    @property
    def address(self) -> str:
        host, port = self.listener.getsockname()[:2]
        return f"{host}:{port}"

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the health process and answer its questions on ``loop`` (``OSError`` when
        it cannot be started)."""
        self._loop = loop
        self._restart = None
        asks, their_asks = os.pipe()
        try:
            their_answers, answers = os.pipe()
        except OSError:
            os.close(asks)
            os.close(their_asks)
            raise
        root = str(Path(__file__).resolve().parents[2])
        theirs = (self.listener.fileno(), their_asks, their_answers)
        try:
            # A session of its own: a signal to the proxy's process group (a terminal's
            # Ctrl-C, a service manager's stop) is the proxy's to handle; the health process
            # ends when the proxy's end of the pipe does.
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BOOT, root, *map(str, theirs),
                 repr(self.stale_after)],
                pass_fds=theirs, stdin=subprocess.DEVNULL, start_new_session=True)
        except Exception:
            os.close(asks)
            os.close(answers)
            self._process = None
            raise
        finally:
            os.close(their_asks)
            os.close(their_answers)
        self._started_at = time.monotonic()
        os.set_blocking(asks, False)
        os.set_blocking(answers, False)
        self._asks, self._answers = asks, answers
        loop.add_reader(asks, self._on_question)

    def _on_question(self) -> None:
        try:
            questions = os.read(self._asks, 64)
        except BlockingIOError:
            return
        except OSError:
            questions = b""
        if not questions:
            self._gone()
            return
        # Guards against a bug in a readiness check, which must not stop the answers.
        try:
            answer = readiness_byte(self.readiness())
        except Exception:
            log.exception("computing readiness for the health process failed")
            answer = readiness_byte(STARTING)
        with contextlib.suppress(OSError):  # full or broken: the health process is gone
            os.write(self._answers, answer)

    def _gone(self) -> None:
        """The health process closed its end: it died. Start another, at most every
        ``RESTART_AFTER`` seconds."""
        self._release_pipes()
        assert self._loop is not None
        delay = max(0.0, RESTART_AFTER - (time.monotonic() - self._started_at))
        self._restart = self._loop.call_later(delay, self._start_again)

    def _start_again(self) -> None:
        process = self._process
        if process is not None:
            if process.poll() is None:
                process.kill()  # closed its pipe yet lives: not ours to keep
                process.wait()
            log.error("the health process (--health-listen %s) ended (status %s); starting "
                      "it again", self.address, process.returncode)
        assert self._loop is not None
        try:
            self.start(self._loop)
        except Exception as exc:  # whatever it is, the probes' port must not stay dead
            log.error("cannot start the health process (%s); trying again in %.0f s", exc,
                      RESTART_AFTER)
            self._started_at = time.monotonic()
            self._restart = self._loop.call_later(RESTART_AFTER, self._start_again)

    def _release_pipes(self) -> None:
        if self._asks >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._asks)
            os.close(self._asks)
        if self._answers >= 0:
            os.close(self._answers)
        self._asks = self._answers = -1

    def close(self) -> None:
        """End the answers' pipe (the health process exits) and wait for it for up to a
        second, off the event loop: call it from a worker thread after ``detach``."""
        if self._answers >= 0:
            os.close(self._answers)
            self._answers = -1
        if self._process is not None:
            try:
                self._process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._asks >= 0:
            os.close(self._asks)
            self._asks = -1
        self.listener.close()

    def detach(self) -> None:
        """Stop answering on the loop (before ``close``, on the loop's thread)."""
        if self._restart is not None:
            self._restart.cancel()
        if self._asks >= 0 and self._loop is not None:
            self._loop.remove_reader(self._asks)
