"""Rendered tail messages kept between requests, within a budget.

An agent's requests after a compaction restore nearly the same newest messages each time;
reading their lines again, decoding and rendering them cost more than the rest of the floor's
decision. A transcript entry's bytes do not change once written (an edit is another entry), so
a rendering is kept under everything that locates those bytes: the store object itself, the
entry's id, position and size, the context edit that replaces it, and the render options. A
store that is replaced (a file rotated or rewritten) is another object: its entries miss.

A rendering is kept as the JSON bytes of its message and renderings, not as their dicts and
lists: a thousand agents' renderings were some 650,000 objects that every full garbage
collection walked (0.25-0.5 s holding the interpreter, each time). Keys and values here are
made of strings, numbers and bytes only, so the collector stops tracking them. A hit is
decoded again, a few microseconds a message: some 0.2 ms a request at an agent's usual tail
of 40 messages. A tail of hundreds (a long session restored by content) would pay that
every request, so the renderings of a read that decodes ``HEAT_FROM`` or more stay decoded,
the last ``HOT`` of them, within ``max_decoded_bytes`` of the memory their objects hold as
``_decoded_cost`` reckons it from the JSON (a transcript is hostile input: a message of
thousands of empty parts decodes to 10-20 times its JSON). Only those: held longer than their
request, short tails' objects cost more (in the collector's young generations, 0.1 ms a
request) than decoding them again. Like every rendering handed out, they are shared, never
changed.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from datetime import tzinfo

import orjson

from proxy.transcripts.entries import Entry
from proxy.transcripts.records import TailMessage, TranscriptStore
from proxy.transcripts.render import RenderOptions

__all__ = ["RenderedTail"]

# Counted in the memory a kept rendering holds: its JSON, and ``ROW`` bytes for its key, its
# row, its slot in the map and the entry's id, ``EDIT`` more for a context edit's place in
# the key (tests/transcripts/test_rendered_tail.py measures them).
MAX_BYTES = 8 * 1024 * 1024
MAX_ENTRIES = 20_000
ROW = 424
EDIT = 200
HOT = 2048  # renderings of long tails decoded lately, kept as objects
HEAT_FROM = 64
# Of the objects a JSON value decodes to, an upper reckoning of the bytes a string's, an
# element's (of a list or a dict: each comma and colon) and a dict's or list's take beside the
# JSON's own bytes (a short non-ASCII string is ~75 bytes, a float 32, an empty dict 64, a
# list 56 and the room it grows into; a key past 64 bytes is a string of its own each time).
_STRING, _ELEMENT, _CONTAINER = 40, 32, 136
# UTF-8 lead bytes of a character past U+FFFF and of one past U+00FF: one such character
# makes its whole string four (two) bytes a character, where the JSON has one for ASCII.
_FOUR_BYTE_TEXT = re.compile(rb"[\xf0-\xf4]")
_TWO_BYTE_TEXT = re.compile(rb"[\xc4-\xef]")

# store id, entry id, position, size, its edit (id, position, size), flavour, zone number
_Key = tuple[int, str, int, int, tuple[str, int, int] | None, str, int]
# entry id, timestamp, role, JSON of [framing, renderings] (``_cost`` of it and its key)
_Kept = tuple[str, float | None, str, bytes]


def _line_bytes(entry: Entry, edit: Entry | None) -> int:
    """The transcript bytes a rendering stands for: its lines (0: database rows, which have
    no line size)."""
    return entry.size + (edit.size if edit is not None else 0)


def _cost(blob: bytes, key: _Key) -> int:
    """The memory a kept rendering holds: its JSON (a bytes object's 33-byte head included)
    and its row. Counted in the transcript's bytes instead, an agent's short lines held 1.4 to
    2.9 times what the budget said, and went on growing once it was full."""
    return len(blob) + 33 + ROW + (EDIT if key[4] is not None else 0)


class RenderedTail:
    """A least-recently-used map, safe to share between the worker threads."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES,
                 max_decoded_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.max_decoded_bytes = (max_decoded_bytes if max_decoded_bytes is not None
                                  else max_bytes // 5)
        self.bytes = 0
        self.decoded_bytes = 0  # of the renderings held decoded, by ``_decoded_cost``
        self._kept: OrderedDict[_Key, _Kept] = OrderedDict()
        # Each also in _kept; with its ``_decoded_cost``.
        self._hot: OrderedDict[_Key, tuple[TailMessage, int]] = OrderedDict()
        # Each store with a kept rendering is held, so its id is not another store's while
        # a key names it; counted by renderings, let go with the last.
        self._stores: dict[int, TranscriptStore] = {}
        self._held: Counter[int] = Counter()
        self._zones: dict[tzinfo, int] = {}  # the zones of the options (one per catalog)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def _zone(self, tz: tzinfo) -> int:
        """A small number for each zone the options name (one per catalog): keys hold it,
        not the zone, an object the collector would track."""
        zone = self._zones.get(tz)
        if zone is None:
            zone = self._zones.setdefault(tz, len(self._zones))
        return zone

    def get(self, store: TranscriptStore, entry: Entry, edit: Entry | None,
            opts: RenderOptions) -> TailMessage | None:
        return self.get_many(store, [entry], {entry.id: edit} if edit is not None else {},
                             opts)[0]

    def get_many(self, store: TranscriptStore, entries: Sequence[Entry],
                 edits: Mapping[str, Entry], opts: RenderOptions) -> list[TailMessage | None]:
        """``get`` for each entry (with its edit in ``edits``), under one hold of the lock."""
        out: list[TailMessage | None] = [None] * len(entries)
        cold: list[tuple[int, _Kept]] = []
        with self._lock:
            if self._stores.get(id(store)) is not store:
                return out  # nothing kept of this store: no key to make
            zone = self._zone(opts.tz)
            keys = [_key(store, e, edits.get(e.id), opts.flavor, zone) for e in entries]
            kept, hot = self._kept, self._hot
            for i, key in enumerate(keys):
                found = kept.get(key)
                if found is None:
                    continue
                kept.move_to_end(key)
                warm = hot.get(key)
                if warm is None:
                    cold.append((i, found))
                else:
                    hot.move_to_end(key)
                    out[i] = warm[0]
        if cold:
            decoded = [(i, found, _decoded(found)) for i, found in cold]
            for i, _found, message in decoded:
                out[i] = message
            if len(decoded) >= HEAT_FROM:
                self._heat(keys, decoded)
        return out

    def _heat(self, keys: list[_Key], decoded: list[tuple[int, _Kept, TailMessage]]) -> None:
        largest = self.max_decoded_bytes // 8
        costs = [_decoded_cost(found[3]) for _i, found, _m in decoded]
        with self._lock:
            for (i, found, message), cost in zip(decoded, costs, strict=True):
                # Still the very row decoded (not one put since under this key).
                if cost <= largest and self._kept.get(keys[i]) is found:
                    self._cool(keys[i])  # another thread's decoding of it, if any
                    self._hot[keys[i]] = (message, cost)
                    self.decoded_bytes += cost
            while self._hot and (len(self._hot) > HOT
                                 or self.decoded_bytes > self.max_decoded_bytes):
                self.decoded_bytes -= self._hot.popitem(last=False)[1][1]

    def _cool(self, key: _Key) -> None:
        warm = self._hot.pop(key, None)
        if warm is not None:
            self.decoded_bytes -= warm[1]

    def put(self, store: TranscriptStore, entry: Entry, edit: Entry | None,
            opts: RenderOptions, message: TailMessage) -> None:
        largest = min(self.max_bytes, MAX_BYTES) // 8  # one would push out everything else
        if _line_bytes(entry, edit) > largest:
            return  # before writing its JSON: such a line is read again every request
        try:
            # Copied to its own size: orjson's answer keeps the room it was written in, 4 KB
            # or more for a message of a few hundred bytes. Renderings and their framing
            # hold only what JSON has (dicts, lists, strings, numbers), so they come back equal
            # (tests/transcripts/test_rendered_tail.py); what orjson cannot write (a lone
            # surrogate, an integer past 64 bits, nesting past 255) is not kept.
            blob = memoryview(orjson.dumps([message.framing, message.messages])).tobytes()
        except orjson.JSONEncodeError:
            return
        with self._lock:
            key = _key(store, entry, edit, opts.flavor, self._zone(opts.tz))
            cost = _cost(blob, key)
            if cost > largest:
                return
            self._stores[key[0]] = store
            old = self._kept.pop(key, None)
            self._cool(key)
            if old is not None:
                self.bytes -= _cost(old[3], key)
            else:
                self._held[key[0]] += 1
            self._kept[key] = (message.entry_id, message.timestamp, message.role, blob)
            self.bytes += cost
            while self._kept and (self.bytes > self.max_bytes
                                  or len(self._kept) > self.max_entries):
                gone, dropped = self._kept.popitem(last=False)
                self._cool(gone)
                self.bytes -= _cost(dropped[3], gone)
                self._let_go(gone[0])

    def _let_go(self, store_id: int) -> None:
        self._held[store_id] -= 1
        if self._held[store_id] <= 0:
            del self._held[store_id]
            del self._stores[store_id]


def _key(store: TranscriptStore, entry: Entry, edit: Entry | None, flavor: str,
         zone: int) -> _Key:
    # The options by their fields: a key is hashed twice a lookup, and the dataclass's own
    # hash is Python code (half the cost of a lookup).
    return (id(store), entry.id, entry.pos, entry.size,
            (edit.id, edit.pos, edit.size) if edit is not None else None, flavor, zone)


def _decoded_cost(blob: bytes) -> int:
    """The memory ``blob`` decoded holds, reckoned from its JSON from above (1.0-3.0
    times what tests/transcripts/test_rendered_tail.py measures of real and hostile shapes):
    a pass over its bytes for each of quotes, commas, colons, openings and wide characters. Its
    text is reckoned at the widest a character of it takes (orjson writes UTF-8)."""
    wide = 4 if _FOUR_BYTE_TEXT.search(blob) else 2 if _TWO_BYTE_TEXT.search(blob) else 1
    return (wide * len(blob) + _STRING * blob.count(b'"')
            + _ELEMENT * (blob.count(b",") + blob.count(b":"))
            + _CONTAINER * (blob.count(b"{") + blob.count(b"[")))


def _decoded(kept: _Kept) -> TailMessage:
    entry_id, timestamp, role, blob = kept
    framing, messages = orjson.loads(blob)
    return TailMessage(entry_id, timestamp, role, framing, tuple(messages))
