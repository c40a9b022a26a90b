"""The summary-quality harness: its scoring judged on hand-written summaries, and a run end to
end against the real small model (the score is reported, not asserted)."""

from __future__ import annotations

import pytest

from tests.bench.eval_summaries import main
from tests.bench.summary_tasks import ASSISTANT, CHECKLIST, CODING, TASKS, Task, score
from tests.model.conftest import ModelServer
from tests.model.relay import RecordingRelay

GOOD = {
    "checklist": """## Goal
Revise the release checklist in docs/release/checklist.md.

## Constraints & Preferences
- Leave the database alone. Today, we are only editing documentation.

## Progress
### Done
- [x] Items 1 (backup) and 2 (tag) rewritten; link tests pass.
- [x] Fixed the docs build error "ERROR: toctree contains reference to nonexisting document
  'release/rollback'" by removing release/rollback from docs/index.rst.

## Key Decisions
- **Changelog by hand**: we rejected generating the changelog from commits (merge noise); it
  stays hand-written in docs/release/CHANGELOG.md.

## Next Steps
1. Item 3: the changelog entry.
2. Item 4: the announcement.
""",
    "coding": """## Goal
Fix the failing test tests/test_parse.py::test_dates.

## Progress
### Done
- [x] The test failed with ValueError: month must be in 1..12.
- [x] Read and edited src/parse.py: parse_date swapped day and month; it now builds
  date(year, month, day). 3 tests pass.

## Next Steps
1. Add a test for two-digit years.
""",
    "assistant": """## Constraints & Preferences
- Window seats; never fly before 9 am.

## Progress
- Dentist booked for Thursday next week at 15:00.
- Promised to remind the user on Wednesday at 18:00 to call their sister Ana about her
  birthday dinner.

## Next Steps
1. Remind the user at 18:00 today to call Ana.
2. Ask whether the Lisbon trip is in May or June (open question).
""",
}

# What a weak summary does: the gist, without the facts, and the rejected approach as a plan.
BAD = {
    "checklist": """## Goal
Work on some documentation.

## Next Steps
1. Generate the changelog from commit messages.
""",
    "coding": "The user asked for help with a test and the assistant worked on it.",
    "assistant": "The user talked about travel and appointments.",
}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_a_good_summary_keeps_every_fact(task: Task) -> None:
    assert score(task, GOOD[task.name]).score == 100.0


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_a_bad_summary_scores_low(task: Task) -> None:
    assert score(task, BAD[task.name]).score <= 25.0


def test_a_rejected_approach_back_among_the_next_steps_is_lost() -> None:
    planned = GOOD["checklist"].replace(
        "2. Item 4: the announcement.",
        "2. Item 4: the announcement.\n3. Generate the changelog from commits after all.")
    results = {f.name: f.survived for f in score(CHECKLIST, planned).facts}
    assert results["rejected approach"] is False
    assert sum(results.values()) == len(results) - 1


def test_each_task_names_its_facts_once() -> None:
    for task in (CHECKLIST, CODING, ASSISTANT):
        names = [f.name for f in task.facts]
        assert len(names) == len(set(names)) >= 6


def test_the_harness_runs_against_the_small_model(model_server: ModelServer,
                                                  relay: RecordingRelay,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    relay.exchanges.clear()
    report = main(["--upstream", relay.url, "--model", "smollm2", "--runs", "1",
                   "--window", str(model_server.n_ctx), "--max-tokens", "64"])
    printed = capsys.readouterr().out
    assert set(report) == {t.name for t in TASKS}
    for task in TASKS:
        for prompt in ("tailfloor", "bare"):
            row = report[task.name][prompt]
            assert row["runs"] == 1 and 0.0 <= row["score"] <= 100.0
            assert set(row["facts"]) == {f.name for f in task.facts}
            assert f"{task.name:10} {prompt:9} score" in printed
        pins = report[task.name]["pins"]
        assert pins["runs"] == 1 and pins["pinned"] == len(task.pins)
        assert pins["with"] >= pins["without"]
        assert f"{task.name:10} pins      without" in printed
    # every summary came from the model: tailfloor's summarizer prompt, the bare one, then
    # tailfloor's summary of what the pins column's compaction summarizes
    calls = relay.chats()
    assert [c.is_summary for c in calls] == [True, False, True] * len(TASKS)
    assert all(c.status == 200 for c in calls)
    with capsys.disabled():
        print("\n" + printed)
