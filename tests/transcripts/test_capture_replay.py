"""Every recorded agent request equals the context view of the transcript as it stood then.

Recordings of real Pi 0.73.1 and 1.6.0, OpenClaw 2026.7.35 and 2026.9.6 runs (trimmed copies
under tests/fixtures/transcripts/captures; the Pi 1.6 ones from ``record_pi.py``). For each
request that is not a summarization call,
the view computed from the entries written before the request (same session: the one
active at that time) must equal the request's messages without the system prompt and
without the parts OpenClaw never stores (Runtime line, internal-context message, the
overflow retry's "Continue..." message). A Pi 1.x cache-warming request (output capped at one
token) repeats the request before it, whatever the transcript gained since.
"""

from __future__ import annotations

import pytest

from tests.transcripts.capture_replay import (
    RUNS,
    context_at,
    is_summarization,
    load_run,
    requests,
    stored_part,
)

# Requests that come before any transcript exists cannot be reproduced from one: Pi and
# OpenClaw write nothing until the first reply (deferred first write) -- but they do write
# the first user message before the first request, so none are listed here. OpenClaw
# 2026.7.35's precheck run refused every turn locally; its only request is a summarization.
CASES = [(run, req["n"]) for run in RUNS for req in requests(run)]


@pytest.fixture(scope="module")
def loaded_runs() -> dict[str, object]:
    return {run: load_run(run) for run in RUNS}


@pytest.mark.parametrize(("run", "n"), CASES, ids=[f"{r}-{n}" for r, n in CASES])
def test_request_matches_transcript_view(run: str, n: int,
                                         loaded_runs: dict[str, object]) -> None:
    req = next(r for r in requests(run) if r["n"] == n)
    if is_summarization(req):
        assert req["tools"] == 0  # summarization calls never carry tools
        return
    if req.get("max_tokens") == 1:
        warmed = [r for r in requests(run) if r["n"] < n and r.get("max_tokens") != 1
                  and not is_summarization(r)][-1]
        assert req["messages"] == warmed["messages"]
        assert context_at(loaded_runs[run], req["ts"]) != stored_part(req["messages"])
        return
    view = context_at(loaded_runs[run], req["ts"])  # type: ignore[arg-type]
    assert view is not None, "no transcript entries before the request"
    assert view == stored_part(req["messages"])


def test_every_run_has_checked_requests() -> None:
    checked = {run for run in RUNS for req in requests(run) if not is_summarization(req)}
    assert checked == set(RUNS) - {"oc735-00-precheck"}
    assert sum(1 for run in RUNS for r in requests(run) if not is_summarization(r)) >= 110
    warms = [r for run in RUNS if run.startswith("pi16") for r in requests(run)
             if r.get("max_tokens") == 1]
    assert len(warms) >= 4
