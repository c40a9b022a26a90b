"""The characters a pin needs. Pure.

Every default pin pattern (``proxy.policy.pin_patterns.DEFAULT_PIN_PATTERNS``), ``!unpin`` and
``!pin ^`` need a ``!`` or a 📌 in the user's text. A transcript entry parsed without one
(``Entry.may_pin``) is skipped by the first read of a session's pins. Here, below both the
transcripts and the policy, so each can name it.
"""

from __future__ import annotations

__all__ = ["holds_mark"]


def holds_mark(text: str) -> bool:
    """Whether a text holds a ``!`` or a 📌."""
    return "!" in text or "\U0001f4cc" in text
