"""What a read of a session's pins looks at: with the default markers, the bytes a
transcript must hold for a pin at all, and which of its messages may pin (the picks a
catalog read renders). Pure: no I/O."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

import orjson

from proxy.policy.pin_patterns import DEFAULT_PIN_PATTERNS
from proxy.policy.records import Policy
from proxy.transcripts.entries import Entry
from proxy.transcripts.records import Pick

__all__ = ["LEADING", "default_marks", "marked_users", "needles", "newest_of",
           "rewritten_since", "seen_upto"]

LEADING = 4  # a segment's first user messages, always read (the clean-slate marker)
# What a JSONL line needs to hold for a default pin marker, ``!unpin`` or ``!pin ^`` in a
# user text, in lower case (IGNORECASE also takes U+0130 and U+0131 for an "i"), and the
# JSON escapes one could be written with: of "!", "p", "i", "n", "u", those two, a 📌's
# first half (not any escape: a tool's JSON output holds many).
_MARK_BYTES = (b"!pin", b"!unpin", b"!p\xc4", b"!unp\xc4", "\U0001f4cc".encode())
_MARK_ESCAPES = (rb"00(?:21|[57]0|[46]9|[46]e|[57]5)", rb"013[01]", rb"d83d")


@functools.lru_cache(maxsize=16)
def needles(marker: str) -> tuple[bytes | re.Pattern[bytes], ...]:
    """The default markers' bytes, the clean-slate ``marker`` as a JSON string holds it, and
    one pattern for the escapes of all their characters (a pattern is a pass of its own over
    the file's bytes)."""
    found: list[bytes | re.Pattern[bytes]] = [*_MARK_BYTES]
    escapes = [*_MARK_ESCAPES]
    if marker:
        found.append(orjson.dumps(marker)[1:-1].lower())
        escapes += sorted({b"%04x" % ord(c) for c in marker.lower() + marker.upper()})
    return (*found, re.compile(rb"\\u(?:" + b"|".join(escapes) + rb")"))


def default_marks(policy: Policy) -> bool:
    return all(p.pattern in DEFAULT_PIN_PATTERNS for p in policy.pin_patterns)


def newest_of(into: list[str], upto: list[int] | None = None) -> Pick:
    """A pick that renders nothing and puts the newest message's id in ``into`` (and in
    ``upto``, ``seen_upto`` of the messages)."""
    def pick(entries: Sequence[Entry], edits: Mapping[str, Entry]) -> list[Entry]:
        into[:] = [e.id for e in entries[-1:]]
        if upto is not None:
            upto[:] = [seen_upto(entries, edits)]
        return []
    return pick


def seen_upto(entries: Sequence[Entry], edits: Mapping[str, Entry]) -> int:
    """Where in the transcript the newest of ``entries`` and of the edits replacing them is
    (a line's offset, a row's number): a read of pins that saw them saw every edit up to
    there of the messages it looks at again later."""
    return max([entries[-1].pos if entries else -1, *(e.pos for e in edits.values())])


def rewritten_since(entries: Sequence[Entry], edits: Mapping[str, Entry], upto: int
                    ) -> set[str]:
    """The user messages among ``entries`` that a context edit after ``upto`` rewrites (not
    removes): a read of pins that did not see the edit may have read one as no pin."""
    if not edits:  # most reads: nothing edited among them
        return set()
    return {e.id for e in entries if e.role == "user" and (edit := edits.get(e.id)) is not None
            and edit.pos > upto and not edit.removes}


def marked_users(leading: list[list[str]]) -> Pick:
    """Of a segment's user messages, those the default markers may make pins or unpins, the
    ones an edit replaces and the first ``LEADING`` (their ids added to ``leading``)."""
    def pick(users: Sequence[Entry], edits: Mapping[str, Entry]) -> list[Entry]:
        leading.append([e.id for e in users[:LEADING]])
        return [e for i, e in enumerate(users) if i < LEADING or e.may_pin or e.id in edits]
    return pick
