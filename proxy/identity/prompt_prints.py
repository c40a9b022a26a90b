"""Request fingerprints: what a request's system prompt and tools look like, per session.

An agent that sends no identity at all (Pi by default) starts a new session with the same
system prompt and tools as the last one; the fingerprint (volatile parts such as dates, uuids
and OpenClaw's per-session Runtime fields normalised) is what ties the two, and only within
one certain tenant (see lineage). Pure: hashing and bounded in-memory maps.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from proxy.wire.content import head_length, message_text

__all__ = ["Fingerprints", "fingerprint", "normalised_pieces"]

# Volatile parts of system prompts: dates and times (Pi's "Current date:"), uuids and
# OpenClaw's per-session Runtime fields (2026.7 puts the Runtime line in the system prompt).
_VOLATILE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|(?<=sessionId=)[^ |\n]+|(?<=session=)[^ |\n]+")
_SLICE = 65_536
_TRIES = 64
# What a date or uuid is made of; a session value follows "session=" or "sessionId=".
_MATCHED = frozenset("0123456789abcdefABCDEF-:.TZ+ ")
_KEYWORD = "session"  # what both keywords of a session value ("session=", "sessionId=") begin with


def normalised_pieces(text: str, step: int = _SLICE) -> Iterator[str]:
    """``_VOLATILE.sub("~", text)`` in pieces, a slice of about ``step`` characters at a
    time: the regular expression tries every position, ~1 s for 8 MB in one call that holds
    the interpreter. A slice ends after a newline or ``|``, else after a space that follows
    no digit, else before the first word that could begin a session value, else after a
    character no date or uuid holds: no match holds such a character or needs what comes
    before it, so the pieces joined are the text normalised whole. Only a slice with none of
    them (or one that begins with such a word) is cut where it ends: a hostile prompt's, never
    a real one's."""
    start, end_of_text = 0, len(text)
    while start < end_of_text:
        end = min(end_of_text, start + step)
        if end < end_of_text:
            cut = max(text.rfind("\n", start, end), text.rfind("|", start, end))
            if cut < start:
                cut = _safe_cut(text, start, end)
            if cut >= start:
                end = cut + 1
        yield _VOLATILE.sub("~", text[start:end])
        start = end


def _safe_cut(text: str, start: int, end: int) -> int:
    """The end (inclusive) of a slice of ``text[start:end]`` no match crosses; -1: none."""
    last = end
    for _ in range(_TRIES):
        cut = text.rfind(" ", start, last)
        if cut < start:
            break
        if cut == start or not text[cut - 1].isdigit():
            return cut
        last = cut
    # A session value runs to a space, "|" or newline, none of which is here: cut before the
    # first keyword that could begin one (one reaching past the slice's end included).
    reach = end + len(_KEYWORD) + 2
    at = text.find(_KEYWORD, start, reach)
    while at >= 0:
        follows = text[at + len(_KEYWORD):at + len(_KEYWORD) + 3]
        if follows[:1] == "=" or follows == "Id=":
            return at - 1 if at > start else -1
        at = text.find(_KEYWORD, at + 1, reach)
    for cut in range(end - 1, max(start, end - _TRIES) - 1, -1):
        char = text[cut]
        # \d is any decimal digit, not only ASCII's.
        if char not in _MATCHED and not char.isdecimal():
            return cut
    return -1


def fingerprint(body: Mapping[str, Any]) -> str | None:
    """System prompt(s) and tools of a request, volatile parts normalised; None without both."""
    messages = body.get("messages")
    listed = messages if isinstance(messages, list) else []
    system = [message_text(m) for m in listed[:head_length(listed)]]
    tools = body.get("tools")
    if not system and not tools:
        return None
    digest = hashlib.blake2b(digest_size=12)
    for text in system:
        for piece in normalised_pieces(text):
            digest.update(piece.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    try:
        digest.update(orjson.dumps(tools or []))
    except TypeError:
        return None
    return digest.hexdigest()


class Fingerprints:
    """Recorded request fingerprints per session, bounded (oldest sessions forgotten first)."""

    def __init__(self, limit: int = 50_000, per_fingerprint: int = 64) -> None:
        self._limit = limit
        self._per = per_fingerprint
        self._by_session: OrderedDict[str, str] = OrderedDict()
        self._by_print: dict[str, OrderedDict[str, None]] = {}
        # What this process recorded, for a shared store to pass on to the other replicas.
        self.recorded: deque[tuple[str, str]] = deque(maxlen=4096)
        # Called after each fingerprint recorded here (a shared store passes it on at once).
        self.on_learned: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return len(self._by_session)

    def get(self, session_id: str) -> str | None:
        return self._by_session.get(session_id)

    def record(self, session_id: str, print_: str) -> None:
        learned = self._by_session.get(session_id) != print_
        if learned:
            self.recorded.append((session_id, print_))
        self.merge(session_id, print_)
        if learned:
            self.on_learned()

    def merge(self, session_id: str, print_: str) -> None:
        """Record a fingerprint (another replica's, or this one's)."""
        old = self._by_session.get(session_id)
        if old == print_:
            self._by_session.move_to_end(session_id)
            return
        if old is not None:
            self._forget(session_id, old)
        self._by_session[session_id] = print_
        holders = self._by_print.setdefault(print_, OrderedDict())
        holders[session_id] = None
        if len(holders) > self._per:
            self._forget(next(iter(holders)), print_)
        while len(self._by_session) > self._limit:
            sid, fp = next(iter(self._by_session.items()))
            self._forget(sid, fp)

    def sessions(self, print_: str) -> list[str]:
        return list(self._by_print.get(print_, ()))

    def _forget(self, session_id: str, print_: str) -> None:
        self._by_session.pop(session_id, None)
        holders = self._by_print.get(print_)
        if holders is not None:
            holders.pop(session_id, None)
            if not holders:
                del self._by_print[print_]


