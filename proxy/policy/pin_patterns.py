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
DEFAULT_PIN_PATTERNS = (r"^\s*(?:!pin\b(?!\s*\^\s*$)|📌)",)
MATCH_CHARS = 4096
# OpenClaw's timestamp before what the user typed ("[Wed 2026-12-02 17:12 UTC] "): not the
# user's words, so neither matched nor kept as part of a pin.
ENVELOPE = re.compile(r"^\[[A-Z][a-z]{2} \d{4}-\d{2}-\d{2} \d{2}:\d{2}[^\]\n]{0,40}\] ")
_NESTED = re.compile(r"\((?:[^()\\]|\\.)*[+*}](?:[^()\\]|\\.)*\)\s*(?:[+*]|\{\d*,)")


def unsafe_pattern(pattern: str) -> str | None:
    """Why a pin pattern is refused, or None."""
    if len(pattern) > 512:
        return "longer than 512 characters"
    if _NESTED.search(pattern):
        return "a quantified group inside a quantifier can backtrack without bound"
    return None
