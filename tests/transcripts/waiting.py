"""Waiting for a live TranscriptService in tests: poll, never a hook in production code."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from proxy.transcripts.service import TranscriptService
from proxy.transcripts.watch import watch_batches


async def until(predicate: Callable[[], bool], within: float = 1.0) -> bool:
    """Whether ``predicate()`` holds within ``within`` seconds (checked every 10 ms)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if predicate():
                return True
        except (IndexError, KeyError, AttributeError):
            pass  # the view is not there yet
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)


async def idle(service: TranscriptService, quiet: float = 0.15, within: float = 2.0) -> None:
    """Return once no batch was applied for ``quiet`` seconds (at most ``within``)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        generation = service.generation
        await asyncio.sleep(quiet)
        if generation == service.generation:
            return


def following(root: Path, stop: asyncio.Event
              ) -> tuple[asyncio.Task[None], asyncio.Queue[set[str]]]:
    """``watch_batches`` over ``root`` in a task, and the queue its batches go to."""
    batches: asyncio.Queue[set[str]] = asyncio.Queue()

    async def follow() -> None:
        async for batch in watch_batches([str(root)], stop):
            await batches.put(batch)

    return asyncio.create_task(follow()), batches
