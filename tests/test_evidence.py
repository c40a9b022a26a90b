"""A failed live test's report names what went wrong first: CI keeps only the start and the
end of a long failure, and the cause is rarely in a log's last lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.evidence import Evidence


def test_the_lines_that_say_what_failed_come_before_the_tails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILFLOOR_ARTIFACTS", str(tmp_path))
    log = ([f"ok line {i}" for i in range(50)]
           + ["\x1b[33mopenai-compat: chat completion failed: Error: agent run failed\x1b[39m"]
           + [f"ok line {i}" for i in range(50, 100)]
           + ['{"level":"info","msg":"POST /v1/chat/completions 200","ms":61234.5}']
           + ['{"level":"info","msg":"POST /v1/chat/completions 200","ms":934.5}']
           + ["[session-sqlite] slow SQLite reclamation Worker operation error=\"inputs changed\""]
           + [f"ok line {i}" for i in range(100, 200)])
    evidence = Evidence("tests/x.py::test_y")
    evidence.add("gateway.log", lambda: "\n".join(log))
    evidence.add("upstream-requests.json", lambda: b'[{"error": "not a log line"}]')
    directory, report = evidence.write()

    assert (directory / "gateway.log").read_text().splitlines() == log
    failed = report.index("openai-compat: chat completion failed: Error: agent run failed")
    first_tail = next(i for i, line in enumerate(report) if line.startswith("--- gateway.log ("))
    slow = report.index('{"level":"info","msg":"POST /v1/chat/completions 200","ms":61234.5}')
    assert 0 < failed < slow < first_tail
    assert not any('"ms":934.5' in line or "reclamation" in line
                   for line in report[:first_tail])
    assert report[-1] == "[{\"error\": \"not a log line\"}]"  # a JSON source: its tail only
    assert sum("not a log line" in line for line in report) == 1
    assert "ok line 10" not in report and "ok line 199" in report
