"""The transcript watcher never silently stops: a file truncated and written again in place
is read again, roots that appear later (or are deleted and created again) are followed, and
a watcher that fails is restarted, counted, and reported by readiness meanwhile."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from proxy.metrics import Metrics
from proxy.transcripts import service as service_module
from proxy.transcripts.service import TranscriptService
from tests.transcripts.conftest import CAPTURES, PI_FILE
from tests.transcripts.waiting import idle, until

PI_ID = "01a22a42-1ed4-778c-a542-c559c46de9e7"
OTHER_ID = "0badc0de-1ed4-778c-a542-c559c46de9e7"
PI_DIR = CAPTURES / "pi-02-rpc-main" / "sessions"


def _rewritten(original: bytes) -> bytes:
    """Another session's transcript, longer than the original: what a rewrite in place
    leaves behind."""
    text = original.decode().replace(PI_ID, OTHER_ID)
    return (text + text.splitlines(keepends=True)[-1]).encode()


async def _started(roots: Sequence[Path], metrics: Metrics | None = None) -> TranscriptService:
    svc = TranscriptService(list(roots), metrics or Metrics(), tail_limit=50, tz=UTC)
    await svc.start()
    return svc


@pytest.fixture
def pi_root(tmp_path: Path) -> Path:
    root = tmp_path / "pi" / "sessions"
    shutil.copytree(PI_DIR, root)
    return root


@pytest.fixture
async def pi_service(pi_root: Path) -> AsyncIterator[TranscriptService]:
    svc = await _started([pi_root])
    yield svc
    await svc.stop()


@pytest.mark.parametrize("pause", [False, True])
async def test_a_file_truncated_and_written_again_in_place_is_read_again(
        pi_service: TranscriptService, pi_root: Path, pause: bool) -> None:
    path = pi_root / "--home-agent-pi-work--" / PI_FILE
    assert pi_service.catalog.get(PI_ID) is not None
    new = _rewritten(path.read_bytes())
    with path.open("r+b") as f:  # the same inode throughout
        f.truncate(0)
        if pause:  # the watcher sees the empty file first
            f.flush()
            await idle(pi_service)
        f.write(new)
    assert await until(lambda: pi_service.catalog.get(OTHER_ID) is not None, 2.0)
    assert await until(lambda: pi_service.catalog.get(PI_ID) is None, 2.0)


async def test_a_root_that_appears_later_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "later" / "sessions"
    metrics = Metrics()
    svc = await _started([root], metrics)
    try:
        assert len(svc.catalog) == 0
        shutil.copytree(PI_DIR, root)
        assert await until(lambda: svc.catalog.get(PI_ID) is not None, 4.0)
        # ...and followed from then on.
        path = root / "--home-agent-pi-work--" / PI_FILE
        path.write_bytes(_rewritten(path.read_bytes()))
        assert await until(lambda: svc.catalog.get(OTHER_ID) is not None, 4.0)
        restarts = metrics.registry.get_sample_value("tailfloor_watcher_restarts_total",
                                                     {"reason": "roots"})
        assert restarts is not None and restarts >= 1
    finally:
        await svc.stop()


async def test_a_root_deleted_and_created_again_is_followed(
        pi_service: TranscriptService, pi_root: Path) -> None:
    shutil.rmtree(pi_root)
    await asyncio.sleep(0.3)
    shutil.copytree(PI_DIR, pi_root)
    path = pi_root / "--home-agent-pi-work--" / PI_FILE
    await asyncio.sleep(2.5)  # the new directory is watched by now
    path.write_bytes(_rewritten(path.read_bytes()))
    assert await until(lambda: pi_service.catalog.get(OTHER_ID) is not None, 4.0)


async def test_a_failing_watcher_is_restarted_and_readiness_says_so_meanwhile(
        pi_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The Rust watcher cannot be made to fail on demand: its seam fails twice, then works.
    real = service_module.watch_batches
    failures = [RuntimeError("inotify watch limit reached")] * 2

    async def flaky(*args: Any, **kwargs: Any) -> AsyncIterator[set[str]]:
        if failures:
            await asyncio.sleep(0.05)
            raise failures.pop()
        async for batch in real(*args, **kwargs):
            yield batch

    monkeypatch.setattr(service_module, "watch_batches", flaky)
    metrics = Metrics()
    svc = await _started([pi_root], metrics)
    try:
        value = metrics.registry.get_sample_value
        assert await until(lambda: not svc.watcher_ok(grace=0.05), 2.0)
        assert value("tailfloor_watcher_up") == 0
        assert await until(lambda: value("tailfloor_watcher_restarts_total",
                                         {"reason": "error"}) == 2, 5.0)
        # Up again once the restarted watcher has run a while (or delivered a batch).
        assert await until(lambda: svc.watcher_ok(grace=0.05)
                           and value("tailfloor_watcher_up") == 1, 10.0)
        path = pi_root / "--home-agent-pi-work--" / PI_FILE
        await asyncio.sleep(0.3)
        path.write_bytes(_rewritten(path.read_bytes()))
        assert await until(lambda: svc.catalog.get(OTHER_ID) is not None, 4.0)
    finally:
        await svc.stop()


async def test_a_watcher_that_keeps_failing_at_once_stays_down_for_readiness(
        pi_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: Any, **kwargs: Any) -> AsyncIterator[set[str]]:
        await asyncio.sleep(0.01)
        raise RuntimeError("no watches left")
        yield set()  # pragma: no cover - makes this an async generator

    monkeypatch.setattr(service_module, "watch_batches", broken)
    svc = await _started([pi_root], Metrics())
    try:
        # Restarts alone do not make it healthy: down since the first failure.
        assert await until(lambda: not svc.watcher_ok(grace=2.0), 5.0)
    finally:
        await svc.stop()
