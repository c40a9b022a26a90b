"""The user-text prefix an agent puts on the wire, learned from the request itself. Pure.

OpenClaw sends user turns as ``[Mon 2026-11-30 02:27 UTC] text``, in the agent's timezone,
while the transcript keeps the bare text and a UTC timestamp. The catalog renders the prefix
in the proxy's own timezone, which need not be the agent's. Where the request's own messages
match the transcript, the request shows the truth: whether there is a prefix at all, its
offset from UTC and its zone label. Restored and carried user messages are then given the
same form, so they read exactly like the agent's own history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.wire.content import first_text
from proxy.wire.openclaw import USER_PREFIX

__all__ = ["Prefix", "learn_prefix", "restyle"]

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Prefix:
    """How the agent prefixes user text: ``None`` offset means no prefix at all."""

    offset_minutes: int | None
    label: str = ""

    def render(self, ts: float) -> str:
        if self.offset_minutes is None:
            return ""
        when = datetime.fromtimestamp(ts, UTC) + timedelta(minutes=self.offset_minutes)
        label = f" {self.label}" if self.label else ""
        return when.strftime("[%a %Y-%m-%d %H:%M") + label + "] "


def learn_prefix(own: Sequence[Any], times: Sequence[float | None]) -> Prefix | None:
    """The prefix rule shown by the request's user messages; ``times`` are the transcript
    times of ``own`` (None where unknown or not matched). None: nothing to learn from."""
    for message, ts in zip(own, times, strict=False):
        if not isinstance(message, Mapping) or message.get("role") != "user" or ts is None:
            continue
        text = first_text(message)
        if text is None:
            continue
        found = USER_PREFIX.match(text)
        if found is None:
            return Prefix(None)
        shown = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
        actual = datetime.fromtimestamp(ts, UTC).replace(second=0, microsecond=0)
        minutes = round((shown - actual).total_seconds() / 60 / 15) * 15
        return Prefix(minutes, found.group(2) or "")
    return None


def restyle(messages: Sequence[Message], times: Sequence[float | None],
            rule: Prefix | None) -> list[Message]:
    """User messages re-prefixed by ``rule`` (unchanged when there is no rule)."""
    if rule is None:
        return list(messages)
    out: list[Message] = []
    for message, ts in zip(messages, times, strict=True):
        text = first_text(message) if message.get("role") == "user" else None
        if text is None or ts is None:
            out.append(message)
            continue
        bare = USER_PREFIX.sub("", text, count=1)
        new = rule.render(ts) + bare
        content = message["content"]
        if isinstance(content, str):
            out.append({**message, "content": new})
        else:
            out.append({**message, "content": [{**content[0], "text": new}, *content[1:]]})
    return out
