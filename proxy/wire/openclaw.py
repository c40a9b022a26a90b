"""OpenClaw's additions on the wire, each written once. Pure.

- the user-text prefix ``[Mon 2026-11-30 02:27 UTC] `` (the message's time in the agent's
  timezone; the zone is a name or an offset, seconds optional);
- the Runtime line ``Runtime: agent=<id> | session=<key> | sessionId=<id> | ...``, at the end
  of the system prompt (2026.7), of the first user message (2026.9) or as a second text part
  of the summary after a compaction;
- the trailing internal-context user message and the "Continue ..." turn of its overflow
  retry, neither of which it stores in the transcript.

User text is compared across transcript and wire as ``normalise_user_text`` makes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

__all__ = [
    "INTERNAL_CONTEXT",
    "OPENCLAW_CONTINUE",
    "USER_PREFIX",
    "RuntimeLine",
    "collapsed",
    "find_runtime",
    "is_reset_command",
    "normalise_user_text",
    "normalised_pieces",
    "parse_runtime",
    "render_prefix",
    "strip_user_prefix",
]

INTERNAL_CONTEXT = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
OPENCLAW_CONTINUE = "Continue the current task from the existing transcript"
# Groups: the shown date and time, the zone label.
USER_PREFIX = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\d{4}-\d{2}-\d{2} \d{2}:\d{2})(?::\d{2})?"
    r"(?: ([A-Za-z0-9:+\-/_]{1,40}))?\] ")
RUNTIME_MARK = "Runtime: agent="
_RUNTIME_SUFFIX = re.compile(r"\n\nRuntime: agent=[^\n]*$")
_RUNTIME_START = "\n\nRuntime: agent="
_RUNTIME_AT_END = re.compile(r"(?:^|\n)(Runtime: agent=[^\n]*)\s*$")
_MAX_ID_LENGTH = 256
_COUNTER_SUFFIX = re.compile(r":\d+$")


@dataclass(frozen=True, slots=True)
class RuntimeLine:
    agent: str | None
    session_key: str | None
    session_id: str | None
    location: str  # "system" | "first_user" | "summary"


def render_prefix(ts: float, tz: tzinfo = UTC) -> str:
    """The prefix OpenClaw writes for a message of epoch time ``ts`` in zone ``tz``."""
    return datetime.fromtimestamp(ts, tz).strftime("[%a %Y-%m-%d %H:%M %Z] ")


def strip_user_prefix(text: str) -> str:
    """User text as the transcript stores it: the time prefix and Runtime suffix removed."""
    # The patterns are looked for only where they can match: every user message of every
    # transcript and request comes through here.
    found = USER_PREFIX.match(text) if text.startswith("[") else None
    if found is not None:
        text = text[found.end():]
    return _RUNTIME_SUFFIX.sub("", text) if _RUNTIME_START in text else text


def normalise_user_text(text: str) -> str:
    """User text as both the transcript and any request carry it: prefix and Runtime
    suffix dropped, whitespace collapsed."""
    return "".join(normalised_pieces(text))


def normalised_pieces(text: str) -> Iterator[str]:
    """``normalise_user_text(text)`` in pieces (what a digest of it reads)."""
    return collapsed(strip_user_prefix(text.lstrip()))


_SLICE = 65_536


def collapsed(text: str, step: int = _SLICE) -> Iterator[str]:
    """The pieces of ``" ".join(text.split())``, made ``step`` characters at a time: a text
    of megabytes split whole is a list of a word object per word (~12 times the text) made
    in one call that holds the interpreter."""
    within = False  # the last piece ended inside a word (it may go on in the next slice)
    started = False
    for start in range(0, len(text), step):
        part = text[start:start + step]
        words = part.split()
        if not words:
            within = False
            continue
        piece = " ".join(words)
        yield piece if not started or (within and not part[0].isspace()) else " " + piece
        started = True
        within = not part[-1].isspace()


def is_reset_command(text: str) -> bool:
    """OpenClaw's ``/new`` and ``/reset``: stored as the user's last turn of the ended
    session, but handled by the agent itself and never sent to a model."""
    return _RESET_COMMAND.match(normalise_user_text(text)) is not None


_RESET_COMMAND = re.compile(r"^/(?:new|reset)(?:\s|$)")


def clean_id(value: object) -> str | None:
    """A session id as a client names it: trimmed, a ``:<n>`` counter suffix dropped."""
    if not isinstance(value, str):
        return None
    value = _COUNTER_SUFFIX.sub("", value.strip())
    return value if 0 < len(value) <= _MAX_ID_LENGTH else None


def parse_runtime(text: str, location: str) -> RuntimeLine | None:
    """The Runtime line of a text. OpenClaw appends it after any text it did not write (the
    user's turn, the model's summary), so the last occurrence that starts a line counts."""
    start = text.rfind(RUNTIME_MARK)
    while start > 0 and text[start - 1] != "\n":
        start = text.rfind(RUNTIME_MARK, 0, start)
    if start < 0:
        return None
    end = text.find("\n", start)
    line = text[start + len("Runtime: "): end if end >= 0 else len(text)]
    fields: dict[str, str] = {}
    for item in line.split(" | "):
        key, sep, value = item.partition("=")
        key = key.strip()
        if sep and key not in fields:
            fields[key] = value.strip()
    return RuntimeLine(agent=fields.get("agent") or None,
                       session_key=fields.get("session") or None,
                       session_id=clean_id(fields.get("sessionId")), location=location)


def find_runtime(texts: list[str]) -> str | None:
    """The Runtime line that ends one of ``texts`` (the last one that has it), verbatim."""
    for text in reversed(texts):
        found = _RUNTIME_AT_END.search(text)
        if found:
            return found.group(1)
    return None
