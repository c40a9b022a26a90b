"""The eval's pins column (tests/bench/pin_column.py) on summaries written here: what it
counts is what the message list holds, checked against facts worked out by hand from
tests/bench/summary_tasks.py."""

from __future__ import annotations

from proxy.wire.content import message_text
from tests.bench.pin_column import column, received
from tests.bench.summary_tasks import CHECKLIST, CODING, TASKS
from tests.pins.test_pins import NOTE


def test_every_fact_s_words_are_in_its_task_and_pins_are_user_messages() -> None:
    for task in TASKS:
        said = "\n".join(str(m.get("content")) + str(m.get("tool_calls", ""))
                         for m in task.messages)
        assert all(f.verbatim and f.verbatim in said for f in task.facts), task.name
        assert all(task.messages[i]["role"] == "user" for i in task.pins), task.name


def test_an_empty_summary_leaves_the_tail_and_the_pins() -> None:
    # checklist, last 4 messages raw: the build error and the items left; pinned: the
    # first message (the constraint, documentation only, the checklist path) and the
    # rejection. The changelog path was said only in a message nobody pinned.
    result = column(CHECKLIST, "", tail=4)
    assert set(result.lost_without) == {"constraint", "documentation only", "checklist path",
                                        "changelog path", "rejected approach"}
    assert result.lost_with == ("changelog path",) and result.pinned == 2
    assert round(result.without, 1) == 28.6 and round(result.with_pins, 1) == 85.7
    # nothing pinned in the coding task: the column is the same either way
    coding = column(CODING, "", tail=4)
    assert coding.pinned == 0 and coding.without == coding.with_pins


def test_the_pins_go_right_after_the_summary_as_the_user_wrote_them() -> None:
    sent, pinned = received(CHECKLIST, "a summary", tail=4, pinned=True)
    texts = [message_text(m) for m in sent]
    assert pinned == 2 and "a summary" in texts[1] and texts[2].startswith(NOTE)
    assert "!pin " + CHECKLIST.messages[1]["content"] in texts[2]
    assert "!pin " + CHECKLIST.messages[9]["content"] in texts[2]
    assert texts[3:] == [message_text(m) for m in CHECKLIST.messages[-4:]]


def test_a_summary_that_keeps_a_fact_word_for_word_counts_it() -> None:
    kept = column(CHECKLIST, "Edits go to docs/release/CHANGELOG.md by hand.", tail=4)
    assert "changelog path" not in kept.lost_without and kept.lost_with == ()
    assert kept.with_pins == 100.0
