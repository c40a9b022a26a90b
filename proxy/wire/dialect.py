"""Requests in another API's dialect, seen by every stage as a chat completion. Pure.

The floor and recovery work on chat messages. A request in OpenAI Responses or Anthropic
Messages is translated once into a chat-shaped body (``Translation.chat``) together with the
span of the dialect's own items each chat message came from. What the stages send back is
turned into the dialect again by ``render``: every item whose chat messages all survived
unchanged and together is the client's item exactly as it came (its ids, signatures,
encrypted reasoning and cache breakpoints intact, in place); only what tailfloor inserted is
rendered, the way the agents render their own history in that dialect.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.values import frozen_value
from proxy.wire.content import content_text
from proxy.wire.usage import Usage, UsageAdjustment

__all__ = ["SYSTEM", "Dialect", "EventFacts", "Translation", "matched_runs", "opaque",
           "output_limit"]

Message = dict[str, Any]
Span = tuple[int, int]
# The span of a chat message made from the dialect's system field (instructions, system).
SYSTEM: Span = (-1, -1)
_OUTPUT_KEYS = ("max_completion_tokens", "max_tokens")


@frozen_value
class Translation:
    """A dialect request as the stages see it. ``sources[i]`` is the span of dialect items
    (``items[start:end]``) that ``chat["messages"][i]`` came from."""

    body: dict[str, Any]
    items: tuple[Any, ...]
    chat: dict[str, Any]
    sources: tuple[Span, ...]
    # Why the stages must not touch it (server-side state, a thread of new messages only).
    pass_reason: str | None = None


@frozen_value
class EventFacts:
    """What one stream event or one complete answer says about usage and how it ended."""

    usage: dict[str, Any] | None = None  # in the dialect's own shape
    error: dict[str, Any] | None = None  # {"message", "type", "code"}
    finish_reason: str | None = None  # in chat terms: stop, length, tool_calls, ...
    model: str | None = None  # the model the answer names, as it names it


@dataclass(slots=True)
class Run:
    """Consecutive chat messages of one outgoing request: the client's item ``span`` kept
    whole (``keep``), or messages to render in the dialect."""

    span: Span | None
    messages: list[Message] = field(default_factory=list)
    keep: bool = False


class Dialect(Protocol):
    name: str
    path: str  # where the summarizer's call goes on the upstream

    def translate(self, body: dict[str, Any]) -> Translation: ...

    def render(self, translation: Translation, chat: dict[str, Any]) -> dict[str, Any]: ...

    def usage(self, usage: Mapping[str, Any]) -> Usage: ...

    def adjusted_usage(self, usage: dict[str, Any],
                       adjust: UsageAdjustment) -> dict[str, Any]: ...

    def event_facts(self, event: Mapping[str, Any]) -> EventFacts: ...

    def adjusted_event(self, event: dict[str, Any],
                       adjust: UsageAdjustment) -> dict[str, Any] | None: ...

    def answer_facts(self, answer: Mapping[str, Any]) -> EventFacts: ...

    def adjusted_answer(self, answer: dict[str, Any],
                        adjust: UsageAdjustment) -> dict[str, Any]: ...

    def error_body(self, openai_error: bytes) -> bytes: ...

    def stream_error(self, message: str, code: str) -> bytes: ...

    def summary_request(self, chat: dict[str, Any]) -> dict[str, Any]: ...

    def summary_answer(self, answer: bytes) -> bytes: ...


def opaque(body: dict[str, Any], reason: str) -> Translation:
    """A request the stages must leave alone: no messages to read, ``reason`` said."""
    model, stream = body.get("model"), body.get("stream")
    chat = {"model": model if isinstance(model, str) else "", "stream": stream is True,
            "messages": []}
    return Translation(body=body, items=(), chat=chat, sources=(), pass_reason=reason)


def _key(message: object) -> bytes:
    try:
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return repr(message).encode()


def matched_runs(translation: Translation, messages: Sequence[Any]) -> list[Run]:
    """The outgoing chat ``messages`` as runs: the client's items kept whole where all of
    their chat messages are there, unchanged and together, else messages to render.

    A message is the client's when it equals one of the translated messages not yet used,
    in order (the stages only insert and cut, they never reorder). They are paired from the
    end: what the stages insert (a summary, restored or carried messages, notes) goes before
    the client's messages it joins, and may say the same as one of them (an agent's answer
    given twice): paired from the start, a restored copy would take the client's item, its
    reasoning and signatures, and leave the client's own message to be rendered without."""
    original = translation.chat.get("messages") or []
    by_key: dict[bytes, list[int]] = defaultdict(list)
    for position, known in enumerate(original):
        by_key[_key(known)].append(position)
    per_span: dict[Span, int] = defaultdict(int)
    for source in translation.sources:
        per_span[source] += 1
    spans: list[Span | None] = []
    first = len(original)
    for message in reversed(messages):
        found = by_key.get(_key(message))
        while found and found[-1] >= first:
            found.pop()  # each position is passed once: linear however many messages repeat
        index = found.pop() if found else None
        if index is not None:
            first = index
        spans.append(translation.sources[index] if index is not None else None)
    runs: list[Run] = []
    for message, span in zip(messages, reversed(spans), strict=True):
        if runs and span is not None and runs[-1].span == span:
            runs[-1].messages.append(message)
        else:
            runs.append(Run(span, [message]))
    for run in runs:
        run.keep = run.span is not None and len(run.messages) == per_span[run.span]
        if not run.keep:
            run.span = None
    return _merge_rendered(runs)


def _merge_rendered(runs: list[Run]) -> list[Run]:
    merged: list[Run] = []
    for run in runs:
        if merged and not run.keep and not merged[-1].keep:
            merged[-1].messages.extend(run.messages)
        else:
            merged.append(run)
    return merged


def output_limit(translation: Translation, chat: Mapping[str, Any]) -> int | None:
    """The output limit the stages set when it differs from the client's (a clamp)."""
    before = _limit(translation.chat)
    after = _limit(chat)
    return after if after is not None and after != before else None


def _limit(body: Mapping[str, Any]) -> int | None:
    for key in _OUTPUT_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def render_runs(translation: Translation, runs: Sequence[Run],
                render: Callable[[list[Message]], list[Any]]) -> tuple[list[Any], list[Message]]:
    """The dialect's item list for ``runs`` and the system-role messages among the rendered
    ones (each dialect puts those in its own place)."""
    items: list[Any] = []
    system: list[Message] = []
    for run in runs:
        if run.keep and run.span is not None:
            if run.span != SYSTEM:
                items.extend(translation.items[run.span[0]:run.span[1]])
            continue
        conversation = [m for m in run.messages if m.get("role") not in ("system", "developer")]
        system.extend(m for m in run.messages if m.get("role") in ("system", "developer"))
        items.extend(render(conversation))
    return items, system


def kept_system(runs: Sequence[Run]) -> bool:
    return any(run.keep and run.span == SYSTEM for run in runs)


@dataclass(frozen=True, slots=True)
class Fields:
    """Where a dialect keeps the conversation, the system prompt and the output limit."""

    items: str  # "input" | "messages"
    system: str  # "instructions" | "system"
    limit: str  # "max_output_tokens" | "max_tokens"


def assemble(translation: Translation, chat: Mapping[str, Any], fields: Fields,
             render: Callable[[list[Message]], list[Any]]) -> dict[str, Any]:
    """The client's body with the stages' messages and output limit, in the dialect: kept
    items as they came, the rest rendered, a changed system prompt in the system field."""
    runs = matched_runs(translation, chat.get("messages") or [])
    items, system = render_runs(translation, runs, render)
    out = dict(translation.body)
    out[fields.items] = items
    if not kept_system(runs):
        if system:
            out[fields.system] = "\n\n".join(content_text(m.get("content")) for m in system)
        else:
            out.pop(fields.system, None)
    limit = output_limit(translation, chat)
    if limit is not None:
        out[fields.limit] = limit
    return out


def split_system(chat: Mapping[str, Any]) -> tuple[str | None, list[Message]]:
    """A summarizer call's chat messages as its system text and the rest."""
    messages = chat.get("messages") or []
    system = [content_text(m.get("content")) for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    return ("\n\n".join(system) if system else None), rest


def with_usage(answer: dict[str, Any], adjust: Callable[[dict[str, Any]], dict[str, Any]]
               ) -> dict[str, Any]:
    """An answer with its ``usage`` member adjusted (the same answer when it has none)."""
    usage = answer.get("usage")
    return {**answer, "usage": adjust(usage)} if isinstance(usage, dict) else answer
