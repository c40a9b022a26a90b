"""The pins of each session, read from its transcript and kept up to date as it grows.

The first time a session's pins are asked for, every raw message of its transcript is read
(each segment, across in-session resets); afterwards only the messages added since. A
lineage's pins are its own and, when the policy carries its reset kind, its predecessors'
(so a pin survives ``new_session``, ``sessions.reset`` and an idle rollover). Bounded: the
pins of at most ``MAX_SESSIONS`` sessions are remembered, least recently asked first out.
Blocking (transcript reads): the floor runs it in a worker thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from proxy.floor.carry import reset_kind
from proxy.floor.pins import NO_PINS, PinSet, merged, pins_in
from proxy.policy.records import Policy
from proxy.transcripts.records import SessionRecord, TailMessage
from proxy.wire.content import message_text

__all__ = ["PinIndex"]

MAX_SESSIONS = 4096
_INCREMENTAL = 200  # new messages read from the end; beyond, the transcript is read again
_DEPTH = 4  # predecessors whose pins a lineage inherits


class Transcripts(Protocol):
    """The catalog queries pins need (``proxy.transcripts.catalog.Catalog``)."""

    def tail(self, session_id: str, k: int, before: str | None = None) -> list[TailMessage]: ...

    def full(self, session_id: str) -> SessionRecord | None: ...


@dataclass(frozen=True, slots=True)
class _Scanned:
    count: int  # the session's raw messages when it was read
    resets: int
    rules: int  # id() of the policy's patterns it was read with
    pins: PinSet


class PinIndex:
    def __init__(self, catalog: Transcripts) -> None:
        self.catalog = catalog
        self._lock = threading.Lock()
        self._scanned: OrderedDict[str, _Scanned] = OrderedDict()

    def may_hold(self, session_id: str) -> bool:
        """False only when the session was read and pins nothing (memory: the event loop
        may ask)."""
        with self._lock:
            found = self._scanned.get(session_id)
        return found is None or bool(found.pins.pins)

    def lineage(self, session_id: str, policy: Policy) -> PinSet:
        """The pins a request of ``session_id``'s lineage must hold."""
        sets: list[PinSet] = []
        seen: set[str] = set()
        sid: str | None = session_id
        while sid is not None and sid not in seen and len(seen) <= _DEPTH:
            seen.add(sid)
            sets.append(self.own(sid, policy))
            sid = self._inherits_from(sid, policy)
        return merged(*reversed(sets))

    def _inherits_from(self, session_id: str, policy: Policy) -> str | None:
        record = self.catalog.full(session_id)
        if record is None or record.predecessor is None:
            return None
        return record.predecessor if policy.carries(reset_kind(record.link)) else None

    def own(self, session_id: str, policy: Policy) -> PinSet:
        record = self.catalog.full(session_id)
        if record is None:
            return PinSet()
        count, resets = record.message_count, len(record.resets)
        with self._lock:
            known = self._scanned.get(session_id)
        if known is not None and known.rules == id(policy.pin_patterns) \
                and known.resets == resets:
            if known.count == count:
                with self._lock:
                    if session_id in self._scanned:
                        self._scanned.move_to_end(session_id)
                return known.pins
            grown = count - known.count
            if 0 < grown <= _INCREMENTAL:
                newest = self.catalog.tail(session_id, grown)
                return self._keep(session_id, count, resets, policy,
                                  self._read(newest, policy, known.pins))
        messages: list[TailMessage] = []
        for reset in record.resets:
            messages += self.catalog.tail(session_id, count + 8, before=reset.entry_id)
        messages += self.catalog.tail(session_id, count + 8)
        return self._keep(session_id, count, resets, policy, self._read(messages, policy))

    def _read(self, messages: list[TailMessage], policy: Policy,
              start: PinSet = NO_PINS) -> PinSet:
        return pins_in(_texts(messages), policy.pin_patterns,
                       pin_assistant=policy.pin_assistant, max_pinned=policy.max_pinned,
                       start=start)

    def _keep(self, session_id: str, count: int, resets: int, policy: Policy,
              pins: PinSet) -> PinSet:
        with self._lock:
            self._scanned[session_id] = _Scanned(count, resets, id(policy.pin_patterns), pins)
            self._scanned.move_to_end(session_id)
            while len(self._scanned) > MAX_SESSIONS:
                self._scanned.popitem(last=False)
        return pins

    def active(self) -> int:
        """Pins held for the sessions remembered (the gauge)."""
        with self._lock:
            return sum(len(s.pins.pins) for s in self._scanned.values())


def _texts(messages: list[TailMessage]) -> Iterator[tuple[str, str, str]]:
    for record in messages:
        if record.role not in ("user", "assistant") or not record.messages:
            continue
        yield record.entry_id, record.role, message_text(record.messages[0])
