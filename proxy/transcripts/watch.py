"""watchfiles over directories, as batches of changed paths.

Directories are watched (recursively), never single files, so renames, new files and
replaced databases are all seen. ``debounce``/``step`` are small (50/10 ms by default)
to keep the delay from a write to the updated view well under 100 ms. The Rust watcher
wakes up every ``rust_timeout`` ms even when nothing happens, so a stop request is
honoured promptly; those empty wake-ups are not passed on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from watchfiles import awatch

__all__ = ["watch_batches"]


async def watch_batches(paths: Sequence[str], stop: asyncio.Event, *, debounce_ms: int = 50,
                        step_ms: int = 10, rust_timeout_ms: int = 200
                        ) -> AsyncIterator[set[str]]:
    """Yield the set of changed paths per batch until ``stop`` is set."""
    watcher = awatch(*paths, watch_filter=None, debounce=debounce_ms, step=step_ms,
                     stop_event=stop, rust_timeout=rust_timeout_ms, yield_on_timeout=True,
                     recursive=True, ignore_permission_denied=True)
    async for changes in watcher:
        if changes:
            yield {path for _change, path in changes}
