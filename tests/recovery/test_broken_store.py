"""A full or broken state disk wastes nothing: a summary that was made is used for the retry
even though it cannot be stored, a store that cannot be read is taken for an empty one, and
the failures are counted, logged once per episode."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.facts.learned import TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.metrics import Metrics
from proxy.recovery.sqlite_store import CompactionStore
from proxy.recovery.stage import Recovery
from proxy.server.record import Recorder
from proxy.wire.summary import unwrap_summary
from tests.fake_behaviour import SUMMARY_TEXT
from tests.recovery.test_invariant import (
    OVERFLOW,
    TOKENS,
    WINDOWS,
    MemorySummarizer,
    Rules,
    _request,
    inline,
)
from tests.recovery.test_plan import conversation


class FullDisk(CompactionStore):
    """What SQLite says when the state disk is full (writes) or broken (reads)."""

    healthy = False

    def put(self, *args: Any, **kwargs: Any) -> int:
        if self.healthy:
            return super().put(*args, **kwargs)
        raise sqlite3.OperationalError("database or disk is full")

    def find_for(self, messages: Sequence[Any], session_key: str) -> Any:
        if self.healthy:
            return super().find_for(messages, session_key)
        raise sqlite3.OperationalError("disk I/O error")


def _messages(name: str) -> list[dict[str, Any]]:
    body = conversation([0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 0, 1] * 4)
    for message in body:
        if isinstance(message.get("content"), str):
            message["content"] += " lorem ipsum" * 200
    return [{"role": "system", "content": f"agent {name}"}, *body]


def test_a_summary_that_cannot_be_stored_is_used_and_the_failure_counted_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    transport = MemorySummarizer()
    recovery = Recovery(rules=Rules(), tokens=TOKENS,
                        models=ModelFactsResolver(WINDOWS, TokenRatios(), "test"),
                        transport=transport, offload=inline)
    recovery.open(tmp_path, store=FullDisk)
    metrics = Metrics(CollectorRegistry())
    record = Recorder(metrics)
    try:
        caplog.set_level(logging.INFO, logger="tailfloor.overflow")
        for name in ("a", "b", "c"):
            calls = transport.calls
            _chat, view = _request(recovery, _messages(name))
            step = asyncio.run(recovery.on_error(view, None, OVERFLOW, attempt=0))
            assert step.action == "retry" and step.compaction is not None
            assert step.compaction.label == "compacted:overflow"
            assert unwrap_summary(step.compaction.messages[1]) == SUMMARY_TEXT.strip()
            assert step.compaction.store_error is not None
            assert transport.calls > calls  # summarized, and that summary is what is sent
            record.compaction(step.compaction)
        errors = metrics.registry.get_sample_value("tailfloor_store_errors_total",
                                                   {"store": "sqlite", "kind": "failed"})
        assert errors == 3
        warned = [r for r in caplog.records if "could not be stored" in r.getMessage()]
        assert len(warned) == 1
        FullDisk.healthy = True  # the disk has room again: stored, and the episode ends
        _chat, view = _request(recovery, _messages("d"))
        step = asyncio.run(recovery.on_error(view, None, OVERFLOW, attempt=0))
        assert step.compaction is not None and step.compaction.store_error is None
        record.compaction(step.compaction)
        assert any("takes summaries again" in r.getMessage() for r in caplog.records)
    finally:
        FullDisk.healthy = False
        asyncio.run(recovery.close())
