"""The pins of each session, read from its transcript and kept up to date as it grows.

The first time a session's pins are asked for, every raw message of its transcript is read
(each segment, across in-session resets, as the model is shown them: a Pi ``context_edit``
removes or rewrites its target), however long it is. With the default markers, a search of
the file's bytes comes first: most transcripts hold no marker at all, and then nothing is
parsed. Otherwise only the user messages that hold a ``!`` or a 📌 can pin or unpin, so only
those are rendered (the entries say which, ``Entry.may_pin``), with the ones an edit
replaces and each segment's first few (for the clean-slate marker). Afterwards only the
messages after the newest one read (with the default markers, only the new user messages
that may pin), unless an edit appended since targets a pin or an ``!unpin`` read earlier, or
rewrites a user message among the newest that was read as no pin: then the transcript is
read again, so the pin ends (removed, or rewritten to text that pins no more), holds the new
text, or begins. A lineage's pins are its own and, when the policy carries
its reset kind, its predecessors' (so a pin survives ``new_session``, ``sessions.reset`` and
an idle rollover).
Bounded: the pins of at most ``MAX_SESSIONS`` sessions, and ``MAX_WEIGHT`` of their texts,
are remembered, least recently asked first out. Blocking (transcript reads): the floor runs
it in a worker thread.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.floor.carry import reset_kind
from proxy.floor.clean_slate import marked_clean
from proxy.floor.pin_reads import (
    default_marks,
    marked_users,
    needles,
    newest_of,
    rewritten_since,
    seen_upto,
)
from proxy.floor.pins import NO_PINS, PinSet, merged, pins_in, points_back
from proxy.policy.records import Policy
from proxy.transcripts.entries import Entry
from proxy.transcripts.records import Pick, SessionRecord, TailMessage
from proxy.wire.content import message_text

__all__ = ["PinIndex", "Transcripts"]

MAX_SESSIONS = 4096
# Of what the remembered sessions' pins hold, all together (``_weight``): 16 pins of 8 KiB
# each in every one of 4,096 sessions would be half a gigabyte.
MAX_WEIGHT = 16 * 1024 * 1024
_INCREMENTAL = 200  # newest messages the last one read is looked for in; beyond, read again
_DEPTH = 4  # predecessors whose pins a lineage inherits
_USERS = ("user",)
_ALL = 1 << 40  # messages: every one
_UNSURE = (("", ""),)  # edits no read can have seen: the next request reads again


class Transcripts(Protocol):
    """The catalog queries pins need (``proxy.transcripts.catalog.Catalog``)."""

    def tail(self, session_id: str, k: int, before: str | None = None,
             roles: Container[str] | None = None, pick: Pick | None = None,
             *, window_only: bool = False) -> list[TailMessage]: ...

    def full(self, session_id: str) -> SessionRecord | None: ...

    def get(self, session_id: str) -> SessionRecord | None: ...

    def edits(self, session_id: str) -> dict[str, str]: ...

    def holds(self, session_id: str, needles: Sequence[bytes | re.Pattern[bytes]]
              ) -> bool | None: ...


@dataclass(frozen=True, slots=True)
class _Scanned:
    last: str | None  # the newest raw message when it was read (of the current segment)
    resets: int
    policy: tuple[object, ...]  # what it was read with (``_pin_policy``)
    pins: PinSet
    clean: bool  # its first user message asked for a clean slate: it inherits nothing
    edits: tuple[tuple[str, str], ...]  # (pin or control entry, its latest edit) when read
    # The catalog's record it was read from: the catalog makes a new one whenever the
    # session's entries change, so the same one means no edit came since.
    record: SessionRecord
    # Where the newest entry it saw is (``seen_upto``): an edit after it that rewrites a
    # message it read as no pin may have made it a pin (read again).
    seen_upto: int
    weight: int  # ``_weight(pins)``


def _pin_policy(policy: Policy) -> tuple[object, ...]:
    # The patterns tuple itself (compared by identity, and kept alive so its id cannot be
    # reused), and every other field a read depends on.
    return (policy.pin_patterns, policy.pin_assistant, policy.max_pinned,
            policy.clean_slate_marker)


class PinIndex:
    def __init__(self, catalog: Transcripts) -> None:
        self.catalog = catalog
        self._lock = threading.Lock()
        self._scanned: OrderedDict[str, _Scanned] = OrderedDict()
        self._weight = 0  # of the sessions in ``_scanned``
        # Whether each session's lineage pinned anything when last asked (its own pins and
        # those it inherits), and the sessions whose request showed a pin the index had not
        # read yet (-> the transcript's message count then).
        self._held: OrderedDict[str, bool] = OrderedDict()
        self._expected: OrderedDict[str, int] = OrderedDict()

    def may_hold(self, session_id: str) -> bool:
        """False only when the session's lineage was read and pins nothing, and no request
        showed a pin since that the index has not read (memory: the event loop may ask)."""
        with self._lock:
            if session_id in self._expected:
                return True
            held = self._held.get(session_id)
        return held is None or held

    def holds(self, session_id: str, pinned: bool) -> None:
        """What a request of ``session_id`` found its lineage pins (``may_hold`` answers
        with it)."""
        with self._lock:
            _bounded(self._held, session_id, pinned)

    def expect(self, session_id: str) -> None:
        """A request of the session holds a new pin raw, which its transcript may not hold
        yet (the watcher lags the agent): the session's requests read the index until a
        read finds the pin, or the transcript has grown past it."""
        record = self.catalog.get(session_id)
        with self._lock:
            if session_id not in self._expected:
                _bounded(self._expected, session_id,
                         record.message_count if record is not None else 0)

    def lineage(self, session_id: str, policy: Policy, *, inherit: bool = True) -> PinSet:
        """The pins a request of ``session_id``'s lineage must hold: its own, and its
        predecessors' unless ``inherit`` is off or a session on the way asked for a clean
        slate."""
        sets: list[PinSet] = []
        seen: set[str] = set()
        sid: str | None = session_id
        while sid is not None and sid not in seen and len(seen) <= _DEPTH:
            seen.add(sid)
            scanned = self._own(sid, policy)
            if scanned is None:
                break
            sets.append(scanned.pins)
            if not inherit or scanned.clean:
                break
            sid = self._inherits_from(sid, policy)
        return merged(*reversed(sets))

    def _inherits_from(self, session_id: str, policy: Policy) -> str | None:
        record = self.catalog.full(session_id)
        if record is None or record.predecessor is None:
            return None
        return record.predecessor if policy.carries(reset_kind(record.link)) else None

    def own(self, session_id: str, policy: Policy) -> PinSet:
        scanned = self._own(session_id, policy)
        return scanned.pins if scanned is not None else NO_PINS

    def _own(self, session_id: str, policy: Policy) -> _Scanned | None:
        record = self.catalog.full(session_id)
        if record is None:
            return None
        resets, read_with = len(record.resets), _pin_policy(policy)
        with self._lock:
            known = self._scanned.get(session_id)
        if known is not None and known.resets == resets and known.policy[0] is read_with[0] \
                and known.policy[1:] == read_with[1:]:
            if record is known.record:
                with self._lock:
                    if session_id in self._scanned:
                        self._scanned.move_to_end(session_id)
                return known
            # Taken before the read: an edit appended during it shows at the next request.
            checked = self._edits(session_id, known.pins)
            since = self._since(session_id, known, policy) \
                if checked == known.edits else None  # else an edit of what it read came
            if since is not None:
                newest, last, upto = since
                if not newest:
                    return self._keep(session_id, known.pins, record=record, last=last,
                                      read_with=read_with, clean=known.clean,
                                      edits=known.edits, upto=upto)
                pins = self._read(newest, policy, known.pins)
                return self._keep(session_id, pins, record=record, last=last,
                                  read_with=read_with, clean=known.clean,
                                  edits=self._edits_after(session_id, pins, known.pins,
                                                          checked, record),
                                  upto=upto)
        return self._first_read(session_id, record, policy, read_with)

    def _since(self, session_id: str, known: _Scanned, policy: Policy
               ) -> tuple[list[TailMessage], str | None, int] | None:
        """The messages after the last one read that may change the pins, the newest, and
        ``seen_upto``; None when the last one read is not among the newest ``_INCREMENTAL``
        the catalog holds, or an edit since rewrote a user message among them, up to the
        last one read, that was read as no pin (read the transcript again). Not counts: a
        long transcript's window slides, and its count of messages with it."""
        last = known.last
        if last is None:  # the segment was empty: nothing says the window holds all of it
            return None
        newest: list[str] = []
        upto: list[int] = []
        marked = default_marks(policy) and not policy.pin_assistant

        def pick(entries: Sequence[Entry], edits: Mapping[str, Entry]) -> list[Entry]:
            at = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].id == last),
                      None)
            if at is None:
                return []
            if rewritten_since(entries[:at + 1], edits, known.seen_upto) - read:
                return []  # a message read as no pin was rewritten since: read again
            newest.append(entries[-1].id)
            upto.append(max(known.seen_upto, seen_upto(entries, edits)))
            if marked:
                # Only a new user message with a default marker can pin or unpin: those are
                # read and rendered, not every new message (a tool's output, a reply).
                return [e for e in entries[at + 1:]
                        if e.role == "user" and (e.may_pin or e.id in edits)]
            # A ``!pin ^`` first among the new ones points at the assistant message before.
            return [e for e in entries[at:at + 1] if e.role == "assistant"] + \
                [*entries[at + 1:]]

        # What the catalog holds in memory: the newest read is among its newest messages.
        read = _read_ids(known.pins)
        messages = self.catalog.tail(session_id, _INCREMENTAL, pick=pick, window_only=True)
        return (messages, newest[0], upto[0]) if newest else None

    def _first_read(self, session_id: str, record: SessionRecord, policy: Policy,
                    read_with: tuple[object, ...]) -> _Scanned:
        # The edits before the read: one appended during it (a long transcript's first read
        # takes a while) differs from them at the next request, which reads again.
        edits = self.catalog.edits(session_id)
        marked = default_marks(policy)
        marker = policy.clean_slate_marker or ""
        if marked and marker.isascii():
            # Most transcripts hold no marker at all: a search of the file's bytes says so
            # for a fraction of what parsing it costs (a long one is only read from its end
            # at a start). The newest message first: what is appended during the search is
            # read with what comes after it.
            newest: list[str] = []
            upto: list[int] = []
            self.catalog.tail(session_id, 1, pick=newest_of(newest))
            # what an incremental read will look at again: the edits it then need not see
            self.catalog.tail(session_id, _INCREMENTAL, pick=newest_of([], upto),
                              window_only=True)
            if self.catalog.holds(session_id, needles(marker)) is False:
                return self._keep(session_id, NO_PINS, record=record, read_with=read_with,
                                  clean=False, last=newest[0] if newest else None, edits=(),
                                  upto=upto[0] if upto else -1)
        k = _ALL  # every message: a long transcript's count is only of the window it keeps
        leading: list[list[str]] = []
        messages, last, seen = self._whole(session_id, k, record, _USERS,
                                           marked_users(leading) if marked else None)
        first = next((m for m in messages if m.role == "user" and m.messages), None)
        if marked and (first is None or not leading or first.entry_id not in leading[0]):
            # The session's first user message with a rendering may be one not read.
            messages, last, seen = self._whole(session_id, k, record, _USERS)
            first = next((m for m in messages if m.role == "user" and m.messages), None)
        if policy.pin_assistant and any(points_back(t) for _i, _r, t in _texts(messages)):
            messages, last, seen = self._whole(session_id, k, record)
        clean = first is not None and marked_clean(message_text(first.messages[0]),
                                                   policy.clean_slate_marker)
        pins = self._read(messages, policy)
        return self._keep(session_id, pins, record=record, last=last, read_with=read_with,
                          clean=clean, edits=_of_read(edits, pins), upto=seen)

    def _whole(self, session_id: str, k: int, record: SessionRecord,
               roles: tuple[str, ...] | None = None, pick: Pick | None = None
               ) -> tuple[list[TailMessage], str | None, int]:
        """Every segment's last ``k`` messages (``roles``: of those, these only; ``pick``:
        of those, its picks), the newest message, and ``seen_upto`` of the current segment.
        Pins are read from user messages; an assistant message matters only to a ``!pin ^``
        after it, so most first reads render the users' and leave the rest to what asks for
        them."""
        messages: list[TailMessage] = []
        newest: list[str] = []
        upto: list[int] = []

        def chosen(entries: Sequence[Entry], edits: Mapping[str, Entry]) -> list[Entry]:
            newest[:] = [e.id for e in entries[-1:]]
            upto[:] = [seen_upto(entries, edits)]
            if roles is not None:
                entries = [e for e in entries if (e.role or e.kind) in roles]
            return pick(entries, edits) if pick is not None else [*entries]

        for reset in record.resets:
            messages += self.catalog.tail(session_id, k, before=reset.entry_id, pick=chosen)
        newest.clear()
        upto.clear()
        messages += self.catalog.tail(session_id, k, pick=chosen)
        return messages, newest[0] if newest else None, upto[0] if upto else -1

    def _read(self, messages: list[TailMessage], policy: Policy,
              start: PinSet = NO_PINS) -> PinSet:
        return pins_in(_texts(messages), policy.pin_patterns,
                       pin_assistant=policy.pin_assistant, max_pinned=policy.max_pinned,
                       start=start)

    def _edits(self, session_id: str, pins: PinSet) -> tuple[tuple[str, str], ...]:
        """The latest edits of the messages ``pins`` was read from. Only those: Pi 1.x
        removes every failed turn with an edit, and none of those changes a pin."""
        if not pins.pins and not pins.controls:
            return ()
        return _of_read(self.catalog.edits(session_id), pins)

    def _edits_after(self, session_id: str, pins: PinSet, before: PinSet,
                     checked: tuple[tuple[str, str], ...], record: SessionRecord
                     ) -> tuple[tuple[str, str], ...]:
        """The edits to check a grown read's pins against: those taken before the read, of
        what it had read before; of a new pin or control, those now when nothing was
        appended since the read began (else none can be trusted: the next request reads
        again)."""
        read = _read_ids(pins)
        if read <= _read_ids(before):
            return tuple(e for e in checked if e[0] in read)
        return self._edits(session_id, pins) if self.catalog.get(session_id) is record \
            else _UNSURE

    def _keep(self, session_id: str, pins: PinSet, *, record: SessionRecord,
              last: str | None, read_with: tuple[object, ...], clean: bool,
              edits: tuple[tuple[str, str], ...] | None = None,
              upto: int) -> _Scanned:
        if edits is None:
            edits = self._edits(session_id, pins)
        scanned = _Scanned(last, len(record.resets), read_with, pins, clean, edits, record,
                           upto, _weight(pins))
        with self._lock:
            flagged = self._expected.get(session_id)
            if flagged is not None and (pins.pins or record.message_count > flagged):
                del self._expected[session_id]
            before = self._scanned.pop(session_id, None)
            self._weight += scanned.weight - (before.weight if before is not None else 0)
            self._scanned[session_id] = scanned
            while len(self._scanned) > MAX_SESSIONS or (self._weight > MAX_WEIGHT
                                                        and len(self._scanned) > 1):
                self._weight -= self._scanned.popitem(last=False)[1].weight
        return scanned

    def active(self) -> int:
        """Pins held for the sessions remembered (the gauge)."""
        with self._lock:
            return sum(len(s.pins.pins) for s in self._scanned.values())


def _weight(pins: PinSet) -> int:
    """About what a session's pins hold, in characters (a text of emoji takes four times
    as many bytes): their texts, what they remember, and a little for each object."""
    return (256 + sum(len(p.text) + 128 for p in pins.pins)
            + sum(len(u) + 64 for u in pins.unpins)
            + 64 * (len(pins.controls) + len(pins.ended)))


def _read_ids(pins: PinSet) -> set[str]:
    """The messages ``pins`` was read from: its pins' and its controls'."""
    return {p.entry_id for p in pins.pins}.union(pins.controls)


def _of_read(edits: Mapping[str, str], pins: PinSet) -> tuple[tuple[str, str], ...]:
    read = _read_ids(pins)
    return tuple(sorted((target, edit) for target, edit in edits.items() if target in read))


def _bounded(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > MAX_SESSIONS:
        table.popitem(last=False)


def _texts(messages: list[TailMessage]) -> Iterator[tuple[str, str, str]]:
    for record in messages:
        if record.role not in ("user", "assistant") or not record.messages:
            continue
        yield record.entry_id, record.role, message_text(record.messages[0])
