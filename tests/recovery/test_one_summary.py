"""Two overflows of one session make one summary, whatever the order their steps interleave.

The end-to-end test (test_recovery.py, four concurrent requests) can only hope for the order
that matters; here the worker pool's seam holds the second request back at the one point where
it used to go wrong: it planned its cut before the first request stored its summary, and took
the lock only after the first had let it go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.facts.learned import TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.recovery.outcome import ErrorStep
from proxy.recovery.stage import Recovery
from tests.recovery import test_invariant as invariant
from tests.recovery.test_broken_store import _messages


class HeldCut:
    """Runs work in place; the first planning of a cut waits until ``release`` is set."""

    def __init__(self) -> None:
        self.cuts = 0
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if getattr(fn, "__name__", "") == "_cut":
            self.cuts += 1
            if self.cuts == 1:
                self.held.set()
                await self.release.wait()
        return fn(*args, **kwargs)


def test_an_overflow_that_takes_the_lock_after_a_summary_was_stored_reuses_it(
        tmp_path: Path) -> None:
    transport = invariant.MemorySummarizer()
    offload = HeldCut()
    recovery = Recovery(rules=invariant.Rules(), tokens=invariant.TOKENS,
                        models=ModelFactsResolver(invariant.WINDOWS, TokenRatios(), "test"),
                        transport=transport, offload=offload)
    recovery.open(tmp_path)
    messages = _messages("one")

    async def both() -> tuple[ErrorStep, ErrorStep, int]:
        _chat, first = invariant._request(recovery, messages)
        _chat, second = invariant._request(recovery, messages)
        later = asyncio.create_task(recovery.on_error(second, None, invariant.OVERFLOW,
                                                      attempt=0))
        await offload.held.wait()  # the later request waits inside its planning
        done = await recovery.on_error(first, None, invariant.OVERFLOW, attempt=0)
        calls = transport.calls  # the summarizer's calls for one summary (chunks, a merge)
        offload.release.set()  # the first request let the lock go and stored its summary
        return done, await later, calls

    try:
        done, later, calls = asyncio.run(both())
        assert done.compaction is not None and later.compaction is not None
        assert done.compaction.label == "compacted:overflow" and calls > 0
        assert transport.calls == calls
        assert later.compaction.label == "reused:overflow"
        assert later.compaction.messages == done.compaction.messages
    finally:
        asyncio.run(recovery.close())
