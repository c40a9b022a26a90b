"""A chat request, parsed once: the record every stage of the request path reads, its
translation from another dialect and its rendering back, and what the floor made of it.

A request is "large" (its parsing, identification, rendering and counting run in a worker
thread, never on the event loop) above ``LARGE_BYTES`` or ``LARGE_MESSAGES``: decided here,
once, for every stage.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

from proxy.report import AGENT, Origin
from proxy.values import frozen_value
from proxy.wire.dialect import opaque

if TYPE_CHECKING:
    from proxy.wire.dialect import Dialect, Translation

__all__ = ["LARGE_BYTES", "LARGE_MESSAGES", "ChatRequest", "Draft", "is_large_body"]

# Requests above either bound are worked on in a worker thread, never on the event loop.
LARGE_BYTES = 256 * 1024
LARGE_MESSAGES = 2000


def is_large_body(size: int) -> bool:
    """A body whose parsing, rendering or counting is CPU work for a worker thread."""
    return size > LARGE_BYTES


def _large(raw: bytes, body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    return len(raw) > LARGE_BYTES or (isinstance(messages, list)
                                      and len(messages) > LARGE_MESSAGES)


# The first "model" key of a body (a key: its quotes are not escaped as they are in strings).
_MODEL = re.compile(rb'(?<!\\)"model"\s*:\s*"((?:[^"\\]|\\.){1,200})"')


@frozen_value
class ChatRequest:
    """A chat completion request, parsed once. ``raw`` is exactly what the client sent."""

    raw: bytes
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    agent_id: str | None
    # False for a body too large to read (see ``unread``): it goes upstream as it came.
    inspected: bool = True
    # A request in another dialect (Responses, Anthropic Messages): ``raw`` and ``body`` are
    # its chat translation, what every stage works on; ``client_raw`` is what the client sent.
    dialect: Dialect | None = None
    translation: Translation | None = None
    client_raw: bytes = b""
    large: bool = False  # worked on in a worker thread (the module docstring), decided once
    # Bytes its parsed forms hold, estimated before parsing (proxy/server/body_cost.py); 0
    # when it was not estimated. What keeps the request (the inspector) counts it.
    weight: int = 0

    @property
    def route(self) -> str:
        return self.dialect.name if self.dialect is not None else "chat_completions"

    @property
    def pass_reason(self) -> str | None:
        """Why a dialect request must reach the upstream as it came (server-side state...)."""
        return self.translation.pass_reason if self.translation is not None else None

    @classmethod
    def parse(cls, raw: bytes, body: dict[str, Any], agent_id: str | None, *,
              weight: int = 0) -> ChatRequest:
        model = body.get("model")
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return cls(
            raw=raw, body=body, model=model if isinstance(model, str) else "",
            stream=body.get("stream") is True, include_usage=include_usage, agent_id=agent_id,
            large=_large(raw, body), weight=weight)

    @classmethod
    def translated(cls, raw: bytes, body: dict[str, Any], agent_id: str | None,
                   dialect: Dialect, *, weight: int = 0) -> ChatRequest:
        """A request in ``dialect``, translated once into the chat shape the stages read."""
        try:
            translation = dialect.translate(body)
            chat_raw = orjson.dumps(translation.chat)
        except (orjson.JSONEncodeError, TypeError, RecursionError):
            # Nested deeper than orjson writes: nothing here can be rewritten, so it goes
            # upstream as it came, said in x-tailfloor.
            translation = opaque(body, "too_deep")
            chat_raw = orjson.dumps(translation.chat)
        chat = translation.chat
        model = chat.get("model")
        return cls(raw=chat_raw, body=chat, model=model if isinstance(model, str)
                   else "", stream=chat.get("stream") is True, include_usage=True,
                   agent_id=agent_id, dialect=dialect, translation=translation, client_raw=raw,
                   large=_large(chat_raw, chat), weight=weight)

    def outgoing(self, body: bytes) -> bytes:
        """What goes upstream for ``body`` (a body the stages made): the client's own bytes
        when they left it alone, else, for a dialect request, rendered in its dialect."""
        if self.translation is None or self.dialect is None:
            return body
        if body is self.raw or body == self.raw:
            return self.client_raw
        try:
            return orjson.dumps(self.dialect.render(self.translation, orjson.loads(body)))
        except (orjson.JSONEncodeError, orjson.JSONDecodeError, TypeError, RecursionError):
            return self.client_raw  # a rewrite that cannot be written: the client's request

    @classmethod
    def unread(cls, raw: bytes, agent_id: str | None,
               dialect: Dialect | None = None) -> ChatRequest:
        """A body with so many JSON values that parsing it alone would hold the interpreter
        for tens of milliseconds: not parsed, not rewritten, only its model read for the
        metrics label."""
        found = _MODEL.search(raw[:65536])
        model = found.group(1).decode("utf-8", "replace") if found else ""
        return cls(raw=raw, body={}, model=model, stream=False, include_usage=False,
                   agent_id=agent_id, inspected=False, dialect=dialect,
                   large=is_large_body(len(raw)))


@frozen_value
class Draft:
    """What the floor made of a chat request: what recovery starts from, and what a retry
    after an overflow compacts again (never an earlier compaction)."""

    body: bytes
    messages: tuple[dict[str, Any], ...] | None = None  # parsed ``body`` when tailfloor built it
    origins: tuple[Origin, ...] | None = None  # where each of ``messages`` came from

    def origin(self, index: int) -> Origin:
        """Where message ``index`` of the draft came from (the agent's, when not built)."""
        return self.origins[index] if self.origins is not None else AGENT

    def message_list(self, chat: ChatRequest) -> list[Any] | None:
        if self.messages is not None:
            return list(self.messages)
        found = chat.body.get("messages")
        return found if isinstance(found, list) else None
