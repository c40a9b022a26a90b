"""What a failed live test leaves behind, so it can be diagnosed without a rerun.

A live test registers its sources (the requests the fake upstream saw, tailfloor's log at
DEBUG, the agent's transcripts and logs) with the ``evidence`` fixture; when the test fails,
``tests/conftest.py``'s report hook writes each to ``$TAILFLOOR_ARTIFACTS/<test>/`` (default
``.ci-artifacts/`` in the repository) and adds the paths and the last lines of each to the
failure report, which CI prints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from tests.fake_upstream import FakeUpstream

ROOT = Path(__file__).resolve().parent.parent
TAIL_LINES = 30
PROBLEM_LINES = 40
# Lines of a log that say something went wrong: printed first, because CI's report of a long
# failure keeps only its start and its end, and a log's tail is often after the cause.
_PROBLEM = re.compile(r"(?i)\b(warn(ing)?|error|fail(ed|ure|s)?|exception|traceback|refused|"
                      r"timed? ?out|abort(ed)?)\b"
                      r'|"ms":\s*\d{4,}')  # and tailfloor's requests that took a second or more
# Never written out: the agents send their (fake) keys, but a habit is a habit.
_SECRET_HEADERS = {"authorization", "x-api-key", "cookie", "x-tailfloor-agent-key"}

Source = Callable[[], "str | bytes"]


def artifacts_root() -> Path:
    return Path(os.environ.get("TAILFLOOR_ARTIFACTS") or ROOT / ".ci-artifacts")


class Evidence:
    def __init__(self, test_id: str) -> None:
        self.test_id = test_id
        self.sources: dict[str, Source] = {}

    def add(self, name: str, source: Source) -> None:
        """``source`` is called only if the test fails (it reads the state at that moment)."""
        self.sources[name] = source

    def add_files(self, name: str, paths: Callable[[], Iterable[Path]]) -> None:
        """Every file ``paths`` yields at failure time, concatenated with a header each."""
        def read() -> str:
            parts = []
            for path in sorted(paths()):
                try:
                    parts.append(f"===== {path}\n{path.read_text(errors='replace')}")
                except OSError as exc:
                    parts.append(f"===== {path}: {exc}")
            return "\n".join(parts) or "(no files)"
        self.add(name, read)

    def add_fake(self, fake: FakeUpstream, name: str = "upstream-requests.json") -> None:
        """The requests the fake upstream received, in order (headers without secrets)."""
        def dump() -> bytes:
            return orjson.dumps([
                {"method": r.method, "path": r.path,
                 "headers": {str(k): str(v) for k, v in r.headers.items()
                             if k.lower() not in _SECRET_HEADERS},
                 "body": _json_or_text(r.body)} for r in list(fake.received)],
                option=orjson.OPT_INDENT_2)
        self.add(name, dump)

    def write(self) -> tuple[Path, list[str]]:
        """Write every source; the directory and a short report for the failure message."""
        directory = artifacts_root() / re.sub(r"[^A-Za-z0-9_.-]+", "_", self.test_id)[-150:]
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"evidence written to {directory}"]
        tails: list[str] = []
        for name, source in self.sources.items():
            try:
                data = source()
            except Exception as exc:  # a broken source must not hide the test's failure
                data = f"(could not read: {type(exc).__name__}: {exc})"
            raw = data.encode() if isinstance(data, str) else data
            (directory / name).write_bytes(raw)
            text = raw.decode(errors="replace").splitlines()
            if not name.endswith(".json"):
                problems = problem_lines(text)
                if problems:
                    lines.append(f"--- {name}: the last {len(problems)} lines that say "
                                 "something went wrong:")
                    lines.extend(line[:400] for line in problems)
            tail = text[-TAIL_LINES:]
            tails.append(f"--- {name} ({len(raw)} bytes), last {len(tail)} lines:")
            tails.extend(line[:400] for line in tail)
        return directory, lines + tails


def problem_lines(lines: list[str]) -> list[str]:
    """The last lines of a log that name an error, a failure or a warning, or a request
    that took a second or more (colour codes off)."""
    plain = (_ANSI.sub("", line) for line in lines)
    return [line for line in plain
            if _PROBLEM.search(line) and not _NOISE.search(line)][-PROBLEM_LINES:]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# OpenClaw's SQLite maintenance reports every rejected attempt as a warning, several a minute
# in a live run: they would push out the few lines that matter.
_NOISE = re.compile(r"slow SQLite reclamation Worker operation")


def _json_or_text(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")
