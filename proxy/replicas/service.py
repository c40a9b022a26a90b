"""The shared store as the application runs it: the parts wired together and the sync loop.

Started with the application when ``--store`` is set. The embedded SQLite store stays: it
stands in while the shared store does not answer. Readiness never depends on the shared
store: a replica without it works as a single process does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.identity.prompt_prints import Fingerprints
from proxy.recovery.compaction_store import LocalCompactions, Offload
from proxy.replicas.client import SharedClient
from proxy.replicas.compactions import SharedCompactions
from proxy.replicas.config import StoreURL
from proxy.replicas.facts import SharedFacts
from proxy.replicas.lock import SharedSummaryLock
from proxy.replicas.signing import Signer
from proxy.upstream.stream_options import StreamOptionsMemory

__all__ = ["SharedStore"]

_LOG = logging.getLogger("tailfloor.store")
SYNC_INTERVAL = 1.0  # seconds between rounds of reading what the other replicas learned


class SharedStore:
    def __init__(self, url: StoreURL, *, local: LocalCompactions, offload: Offload,
                 windows: LearnedWindows, ratios: TokenRatios,
                 stream_options: StreamOptionsMemory,
                 prints: Fingerprints, on_error: Callable[[], None] = lambda: None,
                 on_forged: Callable[[], None] = lambda: None,
                 max_per_session: int = 16) -> None:
        self.client = SharedClient(url, timeout=url.timeout, on_error=on_error)
        signer = Signer(url.keys, on_forged)
        self.compactions = SharedCompactions(self.client, local, offload,
                                             max_per_session=max_per_session, signer=signer)
        self.lock = SharedSummaryLock(self.client)
        self.facts = SharedFacts(self.client, windows=windows, ratios=ratios,
                                 stream_options=stream_options, prints=prints,
                                 compactions=self.compactions, signer=signer)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # What this process learns is pushed at once, without waiting for the next round:
        # a new session's first request may reach another replica right after its
        # predecessor's last one.
        for memory in (windows, ratios, stream_options, prints):
            memory.on_learned = self.kick

    async def start(self) -> None:
        if await self.client.ping():
            _LOG.info("shared store %s: compactions and learned facts are shared",
                      self.client.url)
        self._task = asyncio.create_task(self._sync_loop(), name="shared-store-sync")

    def kick(self) -> None:
        """Pass on what this process just learned without waiting for the next round."""
        if self.facts.pending():
            self._wake.set()

    async def _sync_loop(self) -> None:
        loop = asyncio.get_running_loop()
        read_at = 0.0
        while True:
            try:
                await self.compactions.flush_marks()
                if loop.time() >= read_at:
                    read_at = loop.time() + SYNC_INTERVAL
                    await self.facts.sync()
                else:
                    await self.facts.push()
            except Exception:  # a bug here must not stop the sharing for good
                _LOG.exception("shared store sync failed; trying again")
            with contextlib.suppress(TimeoutError):
                # Woken at once by what this process learns (pushed, not a whole round): a
                # new session's first request may reach another replica right after its
                # predecessor's last one. Not wait_for: on 3.11 it swallows a cancel that
                # comes as the event is set, and the loop then sleeps a whole round.
                async with asyncio.timeout(max(read_at - loop.time(), 0.0)):
                    await self._wake.wait()
            self._wake.clear()

    async def close(self) -> None:
        task, self._task = self._task, None
        # Cancelled again until it ends: a cancel that lands as a store call completes is
        # swallowed by wait_for on 3.11 (it returns the result), and the loop goes on.
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
        with contextlib.suppress(Exception):
            # What was learned last, for the replicas that go on.
            await self.compactions.flush_marks()
            await self.facts.push()
        await self.client.close()
