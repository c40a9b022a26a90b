from __future__ import annotations

import argparse
import asyncio
import io
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from proxy.cli.main import main as cli_main
from proxy.metrics import Metrics
from proxy.policy.files import RulesHolder, load_rules_dir, watch_rules
from proxy.policy.parse import RulesError
from tests.conftest import registry_sample
from tests.transcripts.test_idle_watch import CountedStop

GOOD = ('[defaults]\nmin_tail_messages = {n}\n'
        '[[rules]]\nname = "ops"\nagent = "ops-*"\nmode = "off"\n')


def reloads(metrics: Metrics, outcome: str) -> float:
    return registry_sample(metrics.registry, "tailfloor_rules_reloads_total", outcome=outcome)


def test_open_rejects_a_bad_directory(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text("[defaults]\nmode = 1\n")
    (tmp_path / "b.toml").write_text("[defaults]\nmin_tail_messages = -1\n")
    with pytest.raises(RulesError) as caught:
        RulesHolder.open(tmp_path)
    assert len(caught.value.problems) == 2
    with pytest.raises(RulesError, match="not a directory"):
        load_rules_dir(tmp_path / "missing")


def test_without_directory_the_builtin_rules_apply() -> None:
    holder = RulesHolder.open(None)
    assert holder.rules.defaults.min_tail_messages == 30
    assert holder.reload() is None


def test_reload_keeps_last_good_rules_on_a_bad_edit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    rules_file = tmp_path / "10-policy.toml"
    rules_file.write_text(GOOD.format(n=12))
    (tmp_path / ".hidden.toml").write_text("garbage = [")
    (tmp_path / "notes.txt").write_text("ignored")
    holder = RulesHolder.open(tmp_path, metrics)
    assert holder.rules.defaults.min_tail_messages == 12
    assert holder.reload() is None  # nothing changed: not counted
    rules_file.write_text(GOOD.format(n=12).replace('mode = "off"', 'mode = "sometimes"'))
    with caplog.at_level(logging.ERROR):
        assert holder.reload() is False
    assert holder.rules.defaults.min_tail_messages == 12
    assert holder.rules.resolve("ops-1", None, None).mode == "off"
    assert "10-policy.toml: rules[0] 'ops': field mode = 'sometimes'" in caplog.text
    assert holder.last_error is not None
    rules_file.write_text(GOOD.format(n=40))
    assert holder.reload() is True
    assert holder.rules.defaults.min_tail_messages == 40 and holder.last_error is None
    assert (reloads(metrics, "ok"), reloads(metrics, "error")) == (1.0, 1.0)


def _configmap(root: Path, version: str, text: str) -> None:
    """Lay out files the way the kubelet does: <dir>/..<ts>/ + ..data symlink + file links."""
    target = root / f"..{version}"
    target.mkdir()
    (target / "policy.toml").write_text(text)
    data = root / "..data"
    previous = data.resolve() if data.is_symlink() else None
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(target.name)
    os.replace(tmp_link, data)
    if previous is not None:
        shutil.rmtree(previous)
    if not (root / "policy.toml").is_symlink():
        (root / "policy.toml").symlink_to("..data/policy.toml")


async def _until(predicate: Callable[[], bool], within: float = 5.0) -> float:
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > within:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)
    return time.perf_counter() - start


async def test_watcher_follows_configmap_symlink_swaps(tmp_path: Path) -> None:
    metrics = Metrics()
    _configmap(tmp_path, "2026_11_30_01", GOOD.format(n=10))
    holder = RulesHolder.open(tmp_path, metrics)
    stop = asyncio.Event()
    task = asyncio.create_task(watch_rules(holder, stop))
    await asyncio.sleep(0.2)  # let the watcher start
    try:
        _configmap(tmp_path, "2026_11_30_02", GOOD.format(n=20))
        latency = await _until(lambda: holder.rules.defaults.min_tail_messages == 20)
        print(f"rules reload latency after a ConfigMap swap: {latency * 1e3:.0f} ms")
        assert latency < 1.0
        _configmap(tmp_path, "2026_11_30_03", "[defaults]\nmin_tail_messages = 'x'\n")
        await _until(lambda: reloads(metrics, "error") >= 1)
        assert holder.rules.defaults.min_tail_messages == 20
        (tmp_path / "20-extra.toml").write_text('[[rules]]\nname = "late"\nagent = "z"\n')
        _configmap(tmp_path, "2026_11_30_04", GOOD.format(n=25))
        await _until(lambda: holder.rules.defaults.min_tail_messages == 25
                     and len(holder.rules.rules) == 2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


def test_cli_rules_check_valid_and_explained(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.toml").write_text(GOOD.format(n=8))
    code = cli_main(["rules", "check", str(tmp_path), "--agent", "ops-eu", "--model", "gpt-4o"])
    out = capsys.readouterr().out
    assert code == 0
    assert "OK: 1 file(s): p.toml" in out
    assert "0. 'ops' [p.toml rules[0]] when agent='ops-*'; sets mode" in out
    assert "rule 'ops' (p.toml rules[0]) applies" in out
    assert "mode = 'off'" in out and "window 128000" in out


def test_cli_rules_check_reports_every_problem(tmp_path: Path) -> None:
    from proxy.cli import rules as rules_command
    (tmp_path / "a.toml").write_text("[defaults]\nmode = 1\nreserve_tokens = 'x'\n")
    (tmp_path / "b.toml").write_text("[[rules]]\nagent = 3\n")
    out = io.StringIO()
    ns = cli_parse(["rules", "check", str(tmp_path)])
    assert rules_command.run(ns, out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("3 problem(s):")
    assert any("a.toml: [defaults]: field mode = 1" in line for line in lines)
    assert any("b.toml: rules[0]: field agent = 3" in line for line in lines)


def cli_parse(argv: list[str]) -> argparse.Namespace:
    from proxy.cli.main import build_parser
    return build_parser().parse_args(argv)


async def test_a_quiet_rules_directory_does_not_wake_the_watcher(tmp_path: Path) -> None:
    (tmp_path / "floor.toml").write_text(GOOD.format(n=10))
    holder = RulesHolder.open(tmp_path, Metrics())
    stop = CountedStop()
    task = asyncio.create_task(watch_rules(holder, stop))
    try:
        # an edit seen proves the watch is set; then a quiet second
        for n in range(11, 40):
            (tmp_path / "floor.toml").write_text(GOOD.format(n=n))
            try:
                await _until(lambda n=n: holder.rules.defaults.min_tail_messages == n, 0.5)
                break
            except AssertionError:
                continue
        before = stop.looks
        await asyncio.sleep(1.0)
        # watchfiles' awatch with a 10 ms step looks ~100 times a second
        assert stop.looks - before <= 2, stop.looks - before
        (tmp_path / "floor.toml").write_text(GOOD.format(n=50))
        await _until(lambda: holder.rules.defaults.min_tail_messages == 50)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_an_edit_landing_while_the_watch_is_set_up_is_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The edit lands after start-up's read and before the watch is armed (another process
    rewriting the file as this one starts): the rules in force must still become it."""
    from proxy.policy import files
    real = files.watch_batches
    rules_file = tmp_path / "floor.toml"
    rules_file.write_text(GOOD.format(n=10))
    holder = RulesHolder.open(tmp_path, Metrics())

    def late_edit(*args: object, **kwargs: object) -> object:
        rules_file.write_text(GOOD.format(n=20))  # before the watch exists: no event
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(files, "watch_batches", late_edit)
    stop = asyncio.Event()
    task = asyncio.create_task(watch_rules(holder, stop))
    try:
        await _until(lambda: holder.rules.defaults.min_tail_messages == 20, 3.0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_edits_apply_while_no_watch_can_be_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The watch fails every time (inotify's watch limit reached, say): each retry's read
    still brings the edits in."""
    from proxy.policy import files
    rules_file = tmp_path / "floor.toml"
    rules_file.write_text(GOOD.format(n=10))
    holder = RulesHolder.open(tmp_path, Metrics())
    tries: list[float] = []

    async def no_watch(*_args: object, **_kwargs: object) -> AsyncIterator[object]:
        tries.append(time.monotonic())
        raise OSError(28, "inotify watch limit reached")
        yield  # an async generator, as the real one is

    monkeypatch.setattr(files, "watch_batches", no_watch)
    monkeypatch.setattr(files, "RETRY_SECONDS", 0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(watch_rules(holder, stop))
    try:
        await _until(lambda: len(tries) >= 2, 3.0)
        rules_file.write_text(GOOD.format(n=20))
        await _until(lambda: holder.rules.defaults.min_tail_messages == 20, 5.0)
        rules_file.write_text(GOOD.format(n=30))
        await _until(lambda: holder.rules.defaults.min_tail_messages == 30, 5.0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert "watching rules directory" in caplog.text
