"""Parsing a chat body: only when its cost fits, one large body at a time, no collection in it.

``parse`` estimates the body's cost (``body_cost.py``); a body over the bounds, or whose
parsed form would not fit the whole body budget, is not parsed (it goes upstream as it came,
``none; reason=too_large``). Otherwise its request reserves that cost in the budget (waiting
up to ``BUDGET_WAIT`` for other requests to give theirs back, then 503 ``busy``) and the body
is parsed. A large body's estimate and parse run in a worker thread, and one large body at a
time (``ProxyState.parsing``): each is one call that holds the interpreter, and two of them
in a row would keep the event loop waiting for both.

The garbage collector is paused during a parse (and a dialect's translation): every few
hundred objects the parser makes could start a collection, and a collection of the older
generations walks every object alive, the ones the parse already made included; over a
large parse that is several full walks of a growing heap (measured: 100-150 ms of
collections in a 20 ms parse of 200,000 empty lists).
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any, TypeVar

import orjson

from proxy.chat import ChatRequest, is_large_body
from proxy.errors import BadRequest, Busy
from proxy.server.body_cost import BodyCost, body_cost
from proxy.server.held_bodies import Hold
from proxy.server.state import ProxyState
from proxy.wire.dialect import Dialect

__all__ = ["BUDGET_WAIT", "in_thread", "parse", "parsed", "parses_running", "without_collections"]

T = TypeVar("T")

BUDGET_WAIT = 2.0  # seconds a body may wait for room in the budget before 503 busy


class _Collections:
    """The collector paused while any parse runs (parses in several threads overlap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsing = 0
        self._resume = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            if not self._parsing:
                self._resume = gc.isenabled()
                gc.disable()
            self._parsing += 1
        try:
            yield
        finally:
            with self._lock:
                self._parsing -= 1
                if not self._parsing and self._resume:
                    gc.enable()


_COLLECTIONS = _Collections()


def without_collections() -> AbstractContextManager[None]:
    """The collector paused for a parse made elsewhere (the inspector's, when a page asks),
    with the same count as the request path's parses."""
    return _COLLECTIONS.paused()


def parses_running() -> int:
    """Parses running now, in any thread (the collector is paused while one is)."""
    return _COLLECTIONS._parsing


async def parse(state: ProxyState, raw: bytes, hold: Hold, agent: str | None,
                dialect: Dialect | None, *, owner: str = "") -> ChatRequest:
    """``raw`` parsed (or left unread when parsing it costs too much); its cost held in
    ``hold``; ``owner``: a hash of the request's credential, whose bodies alone its cost is
    counted from. Raises ``BadRequest`` for a body that is not a JSON object, ``Busy`` when the
    budget stayed full."""
    large = is_large_body(len(raw))
    translated = dialect is not None
    cost: BodyCost
    if large:
        cost = await in_thread(state, hold, body_cost, raw, dialect=translated,
                               recent=state.recent_bodies, owner=owner)
    else:
        cost = body_cost(raw, dialect=translated, recent=state.recent_bodies, owner=owner)
    if not cost.parsable or cost.memory > state.bodies.total:
        return ChatRequest.unread(raw, agent, dialect)
    if not await hold.reserve(max(0, cost.memory - hold.amount), BUDGET_WAIT):
        raise Busy("tailfloor holds as many request bodies as it may; retry shortly")
    if not large:
        return parsed(raw, agent, dialect, cost.memory)
    chat: ChatRequest = await in_thread(state, hold, parsed, raw, agent, dialect, cost.memory)
    return chat


async def in_thread(state: ProxyState, hold: Hold, work: Callable[..., T], *args: Any,
                    **kwargs: Any) -> T:
    """``work`` in a worker thread, one large body at a time. A thread cannot be stopped: if
    the request is cancelled meanwhile (its client left), the turn and what ``hold`` has are
    kept until the thread ends, since it goes on building what the budget counts."""
    await state.parsing.acquire()
    running = asyncio.ensure_future(state.offload(work, *args, **kwargs))
    try:
        result = await asyncio.shield(running)
    except asyncio.CancelledError:
        if not running.done():
            running.add_done_callback(partial(_ended, state, hold.detach()))
            raise
        _ended(state, None, running)
        raise
    except BaseException:
        state.parsing.release()
        # The future keeps what the work raised, whose traceback keeps this frame: a cycle
        # that would hold the body until a full collection walks it.
        del running
        raise
    state.parsing.release()
    return result


def _ended(state: ProxyState, kept: Hold | None, done: asyncio.Future[Any]) -> None:
    """The thread of a cancelled request ended: its turn and its bytes go back."""
    if kept is not None:
        kept.release()
    state.parsing.release()
    if not done.cancelled():
        done.exception()  # retrieved: nobody awaits it any more


def parsed(raw: bytes, agent: str | None, dialect: Dialect | None, weight: int = 0
           ) -> ChatRequest:
    """``raw`` parsed, and translated for a dialect (the translation makes as many objects
    again, so the collector stays paused for it too)."""
    with _COLLECTIONS.paused():
        body = _json_object(raw)
        if dialect is None:
            return ChatRequest.parse(raw, body, agent, weight=weight)
        return ChatRequest.translated(raw, body, agent, dialect, weight=weight)


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body
