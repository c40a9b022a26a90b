"""A real redis-server on a free loopback port, without persistence, for the shared-store
tests (Debian's ``redis-server``, installed by .ci/test)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.conftest import free_port, stop_process


class RedisServer:
    def __init__(self, *extra: str, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (bash .ci/test installs it)")
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = Path(tempfile.mkdtemp(prefix="tailfloor-redis-"))
        self._log = (self._dir / "redis.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self._dir), "--protected-mode", "yes",
             *extra],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited: "
                                   + (self._dir / "redis.log").read_text(errors="replace"))
            if self.answers():
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
