"""tailfloor built in-process: ``build_app`` on an event loop of its own in a thread, its
upstream reached through the transport seam (``Upstream``'s opener) over the fake upstream's
UNIX socket. The same interface as ``ProxyProcess`` (url, admin url, logs, metrics), without
a process to start or a port to wait for: what most end-to-end tests need.

Keep ``ProxyProcess`` where the process is the point: signals, the listeners' own limits and
sockets, slow clients, the live agents, the container.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from proxy import logs
from proxy.server.app import build_admin_app, build_app
from proxy.server.state import STATE_KEY, ProxyState
from proxy.settings import add_arguments, from_namespace
from proxy.upstream.http1 import Http1Connection
from tests.conftest import sample_of, settled_metrics
from tests.fake_upstream import FakeUpstream

_NAMES = itertools.count()
_OURS = ("tailfloor", "proxy")


class _ThreadLog(logging.Handler):
    """One in-process proxy's log lines: those its own threads wrote, in the JSON format."""

    def __init__(self, prefix: str, level: str, access_log: bool) -> None:
        super().__init__(logging.getLevelName(level))
        self.prefix = prefix
        self.access_log = access_log
        self.lines: list[str] = []
        self.setFormatter(logs._JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        if not record.threadName or not record.threadName.startswith(self.prefix):
            return
        if record.name == "tailfloor.access" and not self.access_log:
            return
        self.lines.append(self.format(record))


class InProcessProxy:
    def __init__(self, fake: FakeUpstream, *extra: str, env: dict[str, str] | None = None,
                 before_start: Callable[[ProxyState], None] | None = None,
                 wait_indexed: bool = True, start_within: float = 20.0) -> None:
        """``before_start``: called with the state before the app starts (to hold a stage);
        ``wait_indexed``: whether the start waits for the first transcript scan."""
        self._before_start = before_start
        self._wait_indexed = wait_indexed
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        work = self._work = Path(tempfile.mkdtemp(prefix="tailfloor-inproc-"))
        if "--sessions" not in extra:
            (work / "no-sessions").mkdir()
            extra = (*extra, "--sessions", str(work / "no-sessions"))
        # JSON log lines, as ProxyProcess asks for (the tests parse them); a later flag wins.
        ns = parser.parse_args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                                "--upstream", fake.url, "--log-format", "json",
                                "--tailfloor-header", "detailed", *extra])
        self.settings = from_namespace(ns, {**os.environ, **(env or {})})
        self.name = f"tailfloor-inproc-{next(_NAMES)}"
        self.registry = CollectorRegistry()
        self._log = _ThreadLog(self.name, self.settings.log_level, self.settings.access_log)
        # tailfloor's own loggers only (never the root's level: the tests' other libraries
        # keep theirs); each instance's handler keeps its own level and threads.
        for name in _OURS:
            logging.getLogger(name).addHandler(self._log)
            logging.getLogger(name).setLevel(logging.DEBUG)
        logging.getLogger("tailfloor.access").setLevel(logging.INFO)
        self._unix = fake.unix_path
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(ready,), name=self.name,
                                        daemon=True)
        self._thread.start()
        if not ready.wait(start_within) or self._failure is not None:
            raise RuntimeError(f"the in-process proxy did not start: {self._failure}")
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"

    async def _open(self, protocol: Callable[[], Http1Connection]) -> Http1Connection:
        _, connection = await asyncio.get_running_loop().create_unix_connection(
            protocol, self._unix)
        return connection

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:
            self._failure = exc
            ready.set()
            return
        ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        app = build_app(self.settings, self.registry, upstream_opener=self._open,
                        name=self.name)
        self.state: ProxyState = app[STATE_KEY]
        if self._before_start is not None:
            self._before_start(self.state)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=self.settings.shutdown_grace)
        self._admin = web.AppRunner(build_admin_app(self.state), access_log=None)
        await self._runner.setup()
        await self._admin.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        admin = web.TCPSite(self._admin, "127.0.0.1", 0)
        await site.start()
        await admin.start()
        self.port = self._runner.addresses[0][1]
        self.admin_port = self._admin.addresses[0][1]
        if self.state.transcripts is not None and self._wait_indexed:
            # As a subprocess is started (until /readyz): the sessions already on disk known.
            await self.state.transcripts.wait_indexed()

    def logs(self) -> str:
        return "".join(line + "\n" for line in list(self._log.lines))

    def metrics_text(self) -> str:
        return generate_latest(self.registry).decode()

    def sample(self, name: str, *, settled: bool = True, **labels: str) -> float:
        """As ``ProxyProcess.sample``."""
        return sample_of(settled_metrics(self) if settled else self.metrics_text(), name,
                         **labels)

    def stop(self) -> None:
        async def down() -> None:
            self.state.draining = True
            await self._runner.cleanup()
            await self._admin.cleanup()

        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(down(), self.loop).result(30)
            except TimeoutError:
                raise AssertionError("the in-process proxy did not stop in 30 s; its tasks:\n"
                                     + _stacks(self.loop)) from None
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        for name in _OURS:
            logging.getLogger(name).removeHandler(self._log)
        shutil.rmtree(self._work, ignore_errors=True)


@pytest.fixture
def inproc(fake: FakeUpstream) -> Iterator[Callable[..., InProcessProxy]]:
    """Makes in-process proxies in front of the module's fake upstream; all stopped after."""
    made: list[InProcessProxy] = []

    def make(*extra: str, env: dict[str, str] | None = None) -> InProcessProxy:
        made.append(InProcessProxy(fake, *extra, env=env))
        return made[-1]

    yield make
    for proxy in made:
        proxy.stop()


def _stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Where each of the loop's tasks waits: what a stop that hangs is stuck on."""
    out = io.StringIO()
    for task in asyncio.all_tasks(loop):
        task.print_stack(limit=8, file=out)
    return out.getvalue()
