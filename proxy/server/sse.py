"""Reading a Chat Completions SSE stream as it passes, without delaying it.

``StreamScanner.feed`` takes each upstream chunk and returns the bytes the client gets. In the
common case that is the very same chunk: the scanner only looks at complete lines, carrying a
partial line to the next chunk, and parses a line only when it may hold a usage object or an
error, so relaying costs a regex search per chunk (past the start every chunk of the stream
repeats: ``sse_interest``).

When tailfloor itself asked the upstream for usage (the client did not), the usage-only event
is removed again and the ``"usage":null`` field OpenAI adds to every chunk is cut out, so the
client sees what it asked for. That mode works on whole events: an incomplete event waits
for its end, which is harmless because a client cannot use half an event either.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from proxy.server.sse_interest import InterestTest
from proxy.wire.dialect import Dialect
from proxy.wire.stream import DONE, event_data
from proxy.wire.usage import Usage, UsageAdjustment

_INTERESTING = re.compile(rb'"usage"\s*:\s*\{|"error"\s*:|"finish_reason"\s*:\s*"')
# Responses and Anthropic events that say how a stream is going: usage, an error, the end.
_DIALECT_INTERESTING = re.compile(
    rb'"usage"\s*:\s*\{|"error"\s*:|"stop_reason"\s*:\s*"|"type"\s*:\s*"error"')
# The literals every match begins with.
_NEEDLES = (b'"usage"', b'"error"', b'"finish_reason"')
_EVENT_END = re.compile(rb"\r?\n\r?\n")
_USAGE_NULL = b',"usage":null'
MAX_PENDING = 16 * 1024 * 1024


class StreamScanner:
    def __init__(self, hide_usage: bool = False,
                 adjust: UsageAdjustment | None = None, dialect: Dialect | None = None) -> None:
        self.hide_usage = hide_usage
        self.adjust = adjust
        self.dialect = dialect
        # A dialect's events begin with ``{"type":``, a needle: no start to learn there.
        self._interesting: Callable[[bytes], object] = (
            InterestTest(_INTERESTING, _NEEDLES).test if dialect is None
            else _DIALECT_INTERESTING.search)
        self._usage_parts: dict[str, Any] = {}  # a dialect's usage, gathered over events
        # Whole-event processing is needed only when events may change.
        self._by_event = hide_usage or adjust is not None
        self.usage: Usage | None = None
        self.error: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.model: str | None = None  # the model the events name
        self.saw_done = False
        self.events = 0  # whole events seen (counted in whole-event mode only)
        self._pending = b""
        self._tail = b""

    @property
    def at_event_boundary(self) -> bool:
        """True when the bytes relayed so far end between two events (or none were relayed)."""
        if self._by_event:
            return not self._pending
        return not self._tail or self._tail.endswith((b"\n\n", b"\r\n\r\n"))

    def feed(self, chunk: bytes) -> bytes:
        if self._by_event:
            return self._feed_events(chunk)
        if not self._pending and chunk and chunk[-1] == 10:  # 10: b"\n"
            complete = chunk  # whole lines (every upstream read of one event): no slicing
        else:
            data = self._pending + chunk if self._pending else chunk
            cut = data.rfind(b"\n") + 1
            complete, self._pending = data[:cut], data[cut:]
            if len(self._pending) > MAX_PENDING:
                self._pending = b""
        # The last relayed bytes, for ``at_event_boundary``: the chunk itself, not a copy.
        self._tail = (self._tail + chunk)[-4:] if len(chunk) < 4 else chunk
        if complete:
            if self._interesting(complete):
                for line in complete.splitlines():
                    self._read_line(line)
            elif complete.find(DONE) >= 0:  # find: ``in`` first tries the needle as an int
                self.saw_done = True
        return chunk

    def flush(self) -> bytes:
        """What is still held back at the end of the stream (whole-event mode only)."""
        rest, self._pending = self._pending, b""
        if self._by_event and rest:
            return self._filter_event(rest)
        return b""

    def _feed_events(self, chunk: bytes) -> bytes:
        if (not self._pending and len(chunk) > 2 and chunk.find(b"\n\n") == len(chunk) - 2
                and chunk.find(b"\r") < 0):
            # One whole event, the way upstreams send them: no search for its end.
            return self._filter_event(chunk)
        data = self._pending + chunk if self._pending else chunk
        out: list[bytes] = []
        start = 0
        if data.find(b"\r") < 0:
            # Events ended by LF only (every upstream we know): found with find, where the
            # regex, which has no literal to look for first, tries every position.
            end = data.find(b"\n\n")
            while end >= 0:
                end += 2
                out.append(self._filter_event(data[start:end]))
                start = end
                end = data.find(b"\n\n", start)
        else:
            for match in _EVENT_END.finditer(data):
                event = data[start:match.end()]
                start = match.end()
                out.append(self._filter_event(event))
        self._pending = data[start:]
        if len(self._pending) > MAX_PENDING:
            out.append(self._pending)
            self._pending = b""
        return b"".join(out)

    def _filter_event(self, event: bytes) -> bytes:
        self.events += 1
        if self.dialect is None and not self._interesting(event):
            # No usage object, error or finish reason in it: nothing to read or change but
            # the ``"usage":null`` field (and the end marker), so no JSON is parsed.
            # find, not ``in``: ``in`` first tries its needle as an int, which costs more
            # than the search itself on a relayed event.
            if event.find(DONE) >= 0:
                for line in event.splitlines():
                    self._read_line(line)
            if self.hide_usage and event.find(_USAGE_NULL) >= 0:
                return event.replace(_USAGE_NULL, b"")
            return event
        parsed: object = None
        for line in event.splitlines():
            parsed = self._read_line(line) or parsed
        if self.dialect is not None:
            return self._dialect_event(event, parsed)
        usage = parsed.get("usage") if isinstance(parsed, dict) else None
        if isinstance(usage, dict) and isinstance(parsed, dict):
            if self.hide_usage and parsed.get("choices") == []:
                return b""
            if self.adjust is not None:
                changed = {**parsed, "usage": self.adjust.apply(usage)}
                return b"data: " + orjson.dumps(changed) + b"\n\n"
        if self.hide_usage and _USAGE_NULL in event:
            return event.replace(_USAGE_NULL, b"")
        return event

    def _dialect_event(self, event: bytes, parsed: object) -> bytes:
        """An event with its usage adjusted (its ``event:`` line and the rest kept)."""
        if self.dialect is None or self.adjust is None or not isinstance(parsed, dict):
            return event
        changed = self.dialect.adjusted_event(parsed, self.adjust)
        if changed is None:
            return event
        kept = [line for line in event.splitlines()
                if line.strip() and event_data(line) is None]
        return b"\n".join([*kept, b"data: " + orjson.dumps(changed)]) + b"\n\n"

    def _read_dialect(self, parsed: dict[str, Any]) -> None:
        assert self.dialect is not None
        facts = self.dialect.event_facts(parsed)
        if facts.usage is not None:
            self._usage_parts.update(facts.usage)
            self.usage = self.dialect.usage(self._usage_parts)
        if facts.error is not None:
            self.error = facts.error
        if facts.finish_reason is not None:
            self.finish_reason = facts.finish_reason
        if facts.model is not None:
            self.model = facts.model

    def _read_line(self, line: bytes) -> dict[str, Any] | None:
        payload = event_data(line)
        if payload is None:
            return None
        if payload == DONE:
            self.saw_done = True
            return None
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(parsed, dict):
            return None
        if self.dialect is not None:
            self._read_dialect(parsed)
            return parsed
        usage = parsed.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage.from_dict(usage)
        error = parsed.get("error")
        if isinstance(error, dict):
            self.error = error
        choices = parsed.get("choices")
        if choices and isinstance(choices, list) and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if isinstance(reason, str):
                self.finish_reason = reason
        model = parsed.get("model")
        if isinstance(model, str):
            self.model = model
        return parsed


class BodyFacts(NamedTuple):
    usage: Usage | None
    body: bytes  # what the client gets
    finish_reason: str | None
    model: str | None  # the model the answer names


def read_body_facts(body: bytes, adjust: UsageAdjustment | None = None,
                    dialect: Dialect | None = None) -> BodyFacts:
    """Usage, finish reason and model of a non-streaming chat completion body (parsed
    once), and the body the client gets: the same bytes, or the body with its usage
    adjusted when tailfloor changed the prompt."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return BodyFacts(None, body, None, None)
    if not isinstance(parsed, dict):
        return BodyFacts(None, body, None, None)
    if dialect is not None:
        facts = dialect.answer_facts(parsed)
        if facts.usage is None:
            return BodyFacts(None, body, facts.finish_reason, facts.model)
        if adjust is not None:
            body = orjson.dumps(dialect.adjusted_answer(parsed, adjust))
        return BodyFacts(dialect.usage(facts.usage), body, facts.finish_reason, facts.model)
    reason = _finish_reason(parsed)
    model = parsed.get("model")
    model = model if isinstance(model, str) else None
    usage = parsed.get("usage")
    if not isinstance(usage, dict):
        return BodyFacts(None, body, reason, model)
    if adjust is not None:
        body = orjson.dumps({**parsed, "usage": adjust.apply(usage)})
    return BodyFacts(Usage.from_dict(usage), body, reason, model)


def read_body_usage(body: bytes, adjust: UsageAdjustment | None = None,
                    dialect: Dialect | None = None) -> tuple[Usage | None, bytes, str | None]:
    """``read_body_facts`` without the model."""
    return read_body_facts(body, adjust, dialect)[:3]


def _finish_reason(parsed: dict[str, Any]) -> str | None:
    """The first choice's finish_reason."""
    choices = parsed.get("choices")
    if choices and isinstance(choices, list) and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    return None
