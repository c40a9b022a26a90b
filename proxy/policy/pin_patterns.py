"""Which user messages are pinned: the default marker, and the patterns the rules refuse.

A pin pattern is matched against user text for every transcript message tailfloor reads,
so one that could backtrack without bound (a quantified group that is itself quantified,
like ``(a+)+``) is refused when the rules are read, and only the first ``MATCH_CHARS``
characters of a message are ever matched.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_PIN_PATTERNS", "ENVELOPE", "MATCH_CHARS", "unsafe_pattern"]

# ``!pin`` or 📌 at the start (``!pin ^`` alone points at the assistant message before it).
# Each needs a mark ``proxy.wire.pin_marks.holds_mark`` looks for: change both together.
DEFAULT_PIN_PATTERNS = (r"^\s*(?:!pin\b(?!\s*\^\s*$)|📌)",)
MATCH_CHARS = 4096
# OpenClaw's timestamp before what the user typed ("[Wed 2026-12-02 17:12 UTC] "): not the
# user's words, so neither matched nor kept as part of a pin.
ENVELOPE = re.compile(r"^\[[A-Z][a-z]{2} \d{4}-\d{2}-\d{2} \d{2}:\d{2}[^\]\n]{0,40}\] ")
_REPEATS = ("*", "+", "{")



def unsafe_pattern(pattern: str) -> str | None:
    """Why a pin pattern is refused, or None: a repeated group (``*``, ``+`` or ``{n...}``
    after it) that holds a repetition or an alternative, at any depth, can backtrack
    without bound (``(a+)+``, ``((a+))+``, ``(a|aa)+``, ``(.*a){12}``)."""
    if len(pattern) > 512:
        return "longer than 512 characters"
    opened: list[int] = []
    risky: list[bool] = []  # per open group: it holds a repetition or an alternative
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":  # a character class: nothing in it groups or repeats
            end = pattern.find("]", i + 2)
            i = len(pattern) if end < 0 else end + 1
            continue
        if char == "(":
            opened.append(i)
            risky.append(False)
        elif char == ")" and opened:
            opened.pop()
            inner = risky.pop()
            repeated = pattern[i + 1:i + 2] in _REPEATS
            if inner and repeated:
                return ("a repeated group holding a repetition or an alternative can "
                        "backtrack without bound")
            if risky and (inner or repeated):
                risky[-1] = True
        elif char in ("*", "+", "{", "|") and risky:
            risky[-1] = True
        i += 1
    return None
