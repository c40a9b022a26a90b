"""Fixed conversations whose summaries are scored on the facts that must survive them.

Each task is a conversation (OpenAI messages, tool calls included) and its facts; a fact is a
regular expression a good summary matches (case-insensitive). A rejected approach must be
stated as rejected, and must not come back among the next steps: such a fact also names a
pattern that must not appear in the summary's ``Next Steps`` section.

Each fact also names the words of the conversation that state it (``verbatim``), and each
task the user messages a user would pin (``pins``): the "pins" column checks those words,
verbatim, in what the model receives after a compaction (tests/bench/pin_column.py).

Pure data and scoring: nothing here calls a model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PIN_MARK", "TASKS", "Fact", "FactResult", "Task", "TaskScore", "next_steps",
           "pinned_copy", "score"]

Message = dict[str, Any]
PIN_MARK = "!pin "  # the default pin pattern's marker, as a user types it


@dataclass(frozen=True, slots=True)
class Fact:
    name: str
    pattern: str
    not_in_next_steps: str | None = None  # e.g. a rejected approach
    verbatim: str = ""  # the conversation's own words for it (the pins column checks these)

    def check(self, summary: str) -> bool:
        if not re.search(self.pattern, summary, re.IGNORECASE | re.DOTALL):
            return False
        banned = self.not_in_next_steps
        return banned is None or not re.search(banned, next_steps(summary), re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    messages: tuple[Message, ...]
    facts: tuple[Fact, ...]
    # The user messages (indexes into ``messages``) a user would pin: constraints and
    # decisions stated once, not the task's progress (that is the summary's job).
    pins: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FactResult:
    name: str
    survived: bool


@dataclass(frozen=True, slots=True)
class TaskScore:
    task: str
    facts: tuple[FactResult, ...]

    @property
    def score(self) -> float:
        """The share of facts that survived, 0-100."""
        return 100.0 * sum(f.survived for f in self.facts) / len(self.facts)


def next_steps(summary: str) -> str:
    """The text of the ``Next Steps`` section (empty when the summary has none)."""
    found = re.search(r"^#+\s*next steps?\s*$(.*?)(?=^#+\s|\Z)", summary,
                      re.IGNORECASE | re.MULTILINE | re.DOTALL)
    return found.group(1) if found else ""


def pinned_copy(task: Task) -> tuple[Message, ...]:
    """The task's messages as the user would have written them pinning ``task.pins``."""
    return tuple({**m, "content": PIN_MARK + m["content"]} if i in task.pins else m
                 for i, m in enumerate(task.messages))


def score(task: Task, summary: str) -> TaskScore:
    return TaskScore(task.name, tuple(FactResult(f.name, f.check(summary)) for f in task.facts))


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def _call(call_id: str, name: str, arguments: str) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def _result(call_id: str, text: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


_TEST_LOG = "\n".join(f"tests/docs/test_links.py::test_page[{n}] PASSED" for n in range(12))

CHECKLIST = Task("checklist", (
    {"role": "system", "content": "You are a careful documentation assistant."},
    _user("We are revising the release checklist in docs/release/checklist.md. Leave the "
          "database alone. Today, we are only editing documentation."),
    _assistant("Understood: documentation only, no database changes. What is first?"),
    _user("Item 1: describe the backup step. Item 2: describe the tag step. Item 3: the "
          "changelog. Item 4: the announcement."),
    _assistant("I rewrote items 1 and 2 in docs/release/checklist.md."),
    _user("Test log after the edit:\n" + _TEST_LOG),
    _assistant("All link tests pass."),
    _user("For the changelog we could generate it from commit messages, or keep writing it by "
          "hand in docs/release/CHANGELOG.md."),
    _assistant("Generating it from commits would pull in merge noise and internal commits."),
    _user("Right, we reject generating the changelog from commits: too much merge noise. Keep "
          "writing it by hand."),
    _assistant("Agreed, the changelog stays hand-written."),
    _user("The docs build failed with: ERROR: toctree contains reference to nonexisting "
          "document 'release/rollback'"),
    _assistant("That comes from docs/index.rst still listing release/rollback; I removed it "
               "and the build passes."),
    _user("Good. What is left?"),
    _assistant("Two items remain: item 3 (the changelog entry) and item 4 (the announcement)."),
), (
    Fact("constraint", r"database", verbatim="Leave the database alone."),
    Fact("documentation only", r"only (editing )?documentation|documentation only",
         verbatim="Today, we are only editing documentation."),
    Fact("checklist path", re.escape("docs/release/checklist.md"),
         verbatim="docs/release/checklist.md"),
    Fact("changelog path", re.escape("docs/release/CHANGELOG.md"),
         verbatim="docs/release/CHANGELOG.md"),
    Fact("error verbatim", re.escape("toctree contains reference to nonexisting document"),
         verbatim="toctree contains reference to nonexisting document 'release/rollback'"),
    Fact("rejected approach",
         r"(reject\w*|against|not|instead of)\b.{0,60}generat\w*.{0,40}commit"
         r"|commit\w*.{0,80}(reject\w*|noise)",
         not_in_next_steps=r"generat\w*.{0,40}commit",
         verbatim="we reject generating the changelog from commits"),
    Fact("remaining items", r"(item 3|changelog).*(item 4|announcement)",
         verbatim="item 3 (the changelog entry) and item 4 (the announcement)"),
), pins=(1, 9))

CODING = Task("coding", (
    {"role": "system", "content": "You are a coding agent with read, edit and bash tools."},
    _user("The test tests/test_parse.py::test_dates fails. Please fix it."),
    _call("c1", "bash", '{"command":"pytest tests/test_parse.py -q"}'),
    _result("c1", "FAILED tests/test_parse.py::test_dates - ValueError: month must be in 1..12"),
    _call("c2", "read", '{"path":"src/parse.py"}'),
    _result("c2", "def parse_date(text):\n    day, month, year = text.split('/')\n"
                  "    return date(int(year), int(day), int(month))"),
    _assistant("parse_date swaps day and month when it builds the date."),
    _call("c3", "edit", '{"path":"src/parse.py","old":"int(day), int(month)",'
                        '"new":"int(month), int(day)"}'),
    _result("c3", "edited src/parse.py"),
    _call("c4", "bash", '{"command":"pytest tests/test_parse.py -q"}'),
    _result("c4", "3 passed"),
    _assistant("Fixed: parse_date now builds date(year, month, day); the tests pass."),
    _user("Thanks. Next, add a test for two-digit years."),
), (
    Fact("failing test", re.escape("test_dates"), verbatim="tests/test_parse.py::test_dates"),
    Fact("file read and edited", re.escape("src/parse.py"), verbatim="src/parse.py"),
    Fact("error", r"month must be in 1\.\.12", verbatim="month must be in 1..12"),
    Fact("the fix", r"swap|day and month|month, day|month and day",
         verbatim="int(month), int(day)"),
    Fact("tests pass", r"pass", verbatim="3 passed"),
    Fact("next step", r"two-digit year", verbatim="add a test for two-digit years"),
))  # no pins: nothing the user said there is a standing instruction

ASSISTANT = Task("assistant", (
    {"role": "system", "content": "You are a personal assistant. Today is Wednesday."},
    _user("Monday: I prefer window seats, and I never fly before 9 am."),
    _assistant("Noted: window seats, no flights before 9 am."),
    _user("Monday: book my dentist for next week, any afternoon."),
    _assistant("Booked: dentist on Thursday next week at 15:00."),
    _user("Tuesday evening: remind me to call my sister Ana about her birthday dinner."),
    _assistant("I promise to remind you on Wednesday at 18:00 to call Ana about her birthday "
               "dinner."),
    _user("Also on Tuesday: should the Lisbon trip be in May or June? I have not decided."),
    _assistant("I will keep the Lisbon dates open until you decide between May and June."),
    _user("Wednesday morning: what do you have for me today?"),
), (
    Fact("seat preference", r"window", verbatim="I prefer window seats"),
    Fact("time preference", r"9 ?am|9:00|before 9", verbatim="I never fly before 9 am"),
    Fact("appointment", r"dentist", verbatim="dentist on Thursday next week at 15:00"),
    Fact("promise", r"remind.*(ana|sister)|(ana|sister).*remind",
         verbatim="remind you on Wednesday at 18:00 to call Ana"),
    Fact("promise time", r"18:00|6 ?pm", verbatim="Wednesday at 18:00"),
    Fact("open question", r"lisbon", verbatim="the Lisbon trip"),
    Fact("options", r"may.*june|june.*may", verbatim="May or June"),
), pins=(1,))

TASKS: Sequence[Task] = (CHECKLIST, CODING, ASSISTANT)
