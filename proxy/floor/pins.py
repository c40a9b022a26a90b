"""Pinned messages: what the user said must hold, kept raw whatever a summary forgot.

A user message whose text matches one of the policy's ``pin_patterns`` (by default a
``!pin`` or ``📌`` marker at its start) is pinned; ``!unpin <text>`` ends the pins holding
that text (``!unpin`` alone: the newest). With ``pin_assistant``, a user message that is
only ``!pin ^`` pins the assistant message right before it. When a request no longer holds
a pin raw (the agent's compaction summarized it, a reset started a new session), the floor
inserts one message after the summary, before the raw tail: a short note, then each pin as
it was written, in transcript order; the same bytes on every request while the pins are
the same. The messages are read as the model is shown them (a Pi ``context_edit``
applied), so a pinned message the agent removed or rewrote past its pattern is no pin.

Patterns are the operator's, vetted when the rules are read (proxy/policy/pin_patterns.py).
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.policy.pin_patterns import ENVELOPE, MATCH_CHARS
from proxy.wire.content import message_text

__all__ = ["NO_PINS", "Pin", "PinSet", "merged", "missing", "pin_message", "pins_in",
           "points_back"]

KEPT_CHARS = 8 * 1024  # of one pin's text; a longer one is kept truncated, and says so
TRUNCATED = "\n[... truncated by tailfloor: the pinned message was longer]"
_UNPIN = re.compile(r"^\s*!unpin\b[ \t]*(.*)", re.IGNORECASE | re.DOTALL)
_POINT_BACK = re.compile(r"^\s*!pin\s*\^\s*$", re.IGNORECASE)
# What a session's pins remember besides the pins, bounded: a transcript is hostile input,
# and a pin index keeps thousands of sessions' pins. The newest ended pins and controls;
# of the unpins (exact up to these), so many and so much text, past which the session
# ends every pin it inherited.
KEPT_ENDED = 64
KEPT_CONTROLS = 256
KEPT_UNPINS = 256
KEPT_UNPIN_CHARS = 256 * 1024  # 64 unpins as long as they come; the pin index bounds the total


@dataclass(frozen=True, slots=True)
class Pin:
    entry_id: str
    text: str
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class PinSet:
    """The pins of a lineage in transcript order, and how many were dropped past the cap."""

    pins: tuple[Pin, ...] = ()
    dropped: int = 0
    # What this session's ``!unpin`` messages named (``""``: the newest pin), so that a
    # later session's unpin also ends a pin it inherited; one implied by an earlier one is
    # left out. ``unpins_all``: they were too many to keep, and end every inherited pin.
    unpins: tuple[str, ...] = ()
    # The newest ``!unpin`` and ``!pin ^`` messages read: a context edit of one of them, as
    # of a pin, changes what the transcript pins.
    controls: tuple[str, ...] = ()
    # The newest pins an ``!unpin`` or the cap ended: met again, they pin no more.
    ended: tuple[str, ...] = ()
    unpins_all: bool = False


NO_PINS = PinSet()


def pins_in(messages: Iterable[tuple[str, str, str]], patterns: Sequence[re.Pattern[str]],
            *, pin_assistant: bool = False, max_pinned: int = 16,
            start: PinSet = NO_PINS) -> PinSet:
    """The pins among ``(entry id, role, text)`` transcript messages, oldest first, after
    those of ``start`` (what the messages before them pinned)."""
    pins: list[Pin] = list(start.pins)
    unpins: list[str] = list(start.unpins)
    controls: list[str] = list(start.controls)
    # A pin or control ``start`` holds, met again: a tail of what was appended that reached
    # back past it (a message an edit removed still counted as appended) must neither pin
    # it twice nor unpin once more.
    ended: list[str] = list(start.ended)
    read = {p.entry_id for p in start.pins}.union(controls, ended) \
        if start is not NO_PINS else ()
    previous_assistant: tuple[str, str] | None = None
    dropped, unpins_all = start.dropped, start.unpins_all
    for entry_id, role, written in messages:
        if role == "user" and entry_id in read:
            previous_assistant = None
            continue
        text = ENVELOPE.sub("", written, count=1)
        if role == "assistant":
            previous_assistant = (entry_id, text)
            continue
        if role != "user":
            continue
        head = text[:MATCH_CHARS]
        unpin = _UNPIN.match(head)
        if unpin is not None:
            what = unpin.group(1).strip()
            unpins_all = unpins_all or _remember_unpin(unpins, what)
            controls.append(entry_id)
            kept = _unpinned(pins, what)
            ended += [p.entry_id for p in pins if p not in kept]
            pins = kept
        elif _POINT_BACK.match(head):
            controls.append(entry_id)
            if pin_assistant and previous_assistant is not None:
                pins.append(_pin(*previous_assistant))
        elif any(p.search(head) for p in patterns):
            pins.append(_pin(entry_id, text))
        # ``^`` is the message right before: once a user message is between, nothing (so
        # when an edit removed the message it named, it names no older one instead).
        previous_assistant = None
        if len(pins) > max_pinned:
            dropped += len(pins) - max_pinned
            ended += [p.entry_id for p in pins[:-max_pinned]]
            pins = pins[-max_pinned:]
    return PinSet(tuple(pins), dropped, () if unpins_all else tuple(unpins),
                  tuple(controls[-KEPT_CONTROLS:]), tuple(ended[-KEPT_ENDED:]), unpins_all)


def _remember_unpin(unpins: list[str], what: str) -> bool:
    """Adds ``what`` to a session's unpins unless an earlier one implies it (inherited pins
    only ever go: once none holds an earlier text, none holds a longer text that contains
    it); True when they grow past what is kept."""
    low = what.lower()  # kept so: an unpin is compared in lower case
    if low and any(u and u in low for u in unpins):
        return False
    unpins.append(low)
    return len(unpins) > KEPT_UNPINS or sum(map(len, unpins)) > KEPT_UNPIN_CHARS


def points_back(written: str) -> bool:
    """Whether a user message is a ``!pin ^`` (what ``pins_in`` reads it as): only such a
    message makes the assistant messages before it matter."""
    head = ENVELOPE.sub("", written, count=1)[:MATCH_CHARS]
    return _UNPIN.match(head) is None and _POINT_BACK.match(head) is not None


def _pin(entry_id: str, text: str) -> Pin:
    if len(text) > KEPT_CHARS:
        return Pin(entry_id, text[:KEPT_CHARS], truncated=True)
    return Pin(entry_id, text)


def _unpinned(pins: list[Pin], what: str) -> list[Pin]:
    if not what:
        return pins[:-1]
    return [p for p in pins if what.lower() not in p.text.lower()]


def merged(*sets: PinSet) -> PinSet:
    """Pins of several sessions of one lineage, oldest session first, each text once; a
    session's unpins end the pins it inherited too."""
    out: list[Pin] = []
    for pin_set in sets:
        if pin_set.unpins_all:
            out = []
        for what in pin_set.unpins:
            out = _unpinned(out, what)
        texts = {p.text for p in out}
        out += [p for p in pin_set.pins if p.text not in texts]
    return PinSet(tuple(out), sum(s.dropped for s in sets))


def missing(pins: Sequence[Pin], messages: Sequence[Any]) -> list[Pin]:
    """The pins the request does not hold raw: no user or assistant message's text is the
    pin's or holds it (OpenClaw puts a timestamp before the user's text in requests, not in
    its transcript)."""
    if not pins:
        return []
    held = [message_text(m) for m in messages
            if isinstance(m, dict) and m.get("role") in ("user", "assistant")]
    return [p for p in pins if not any(p.text.strip() in h for h in held)]


def pin_message(pins: Sequence[Pin], note: str, budget: int,
                count: Callable[[str], int]) -> tuple[dict[str, Any] | None, int, int]:
    """The message that carries ``pins`` (None: none fits), the number kept and dropped.
    Newest pins are kept first within ``budget`` tokens; a single pin larger than the
    budget is kept truncated, with a marker, never dropped silently."""
    kept: list[str] = []
    used = count(note)
    for pin in reversed(pins):
        text = pin.text + (TRUNCATED if pin.truncated else "")
        cost = count(text)
        if used + cost > budget:
            if kept:
                break
            text = _cut(text, budget - used, count)
            if not text:
                break
            cost = count(text)
        kept.append(text)
        used += cost
    if not kept:
        return None, 0, len(pins)
    body = note + "\n\n" + "\n\n".join(reversed(kept))
    return {"role": "user", "content": body}, len(kept), len(pins) - len(kept)


def _cut(text: str, tokens: int, count: Callable[[str], int]) -> str:
    """``text`` shortened to about ``tokens`` tokens, marked as truncated."""
    if tokens <= count(TRUNCATED) + 8:
        return ""
    chars = max(0, (tokens - count(TRUNCATED)) * 3)
    while chars > 0 and count(text[:chars] + TRUNCATED) > tokens:
        chars = chars * 3 // 4
    return text[:chars] + TRUNCATED if chars > 0 else ""
