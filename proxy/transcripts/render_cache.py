"""Rendered tail messages kept between requests, within a budget.

An agent's requests after a compaction restore nearly the same newest messages each time;
reading their lines again, decoding and rendering them cost more than the rest of the floor's
decision. A transcript entry's bytes do not change once written (an edit is another entry), so
a rendering is kept under everything that locates those bytes: the store object itself, the
entry's id, position and size, the context edit that replaces it, and the render options. A
store that is replaced (a file rotated or rewritten) is another object: its entries miss.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import tzinfo

import orjson

from proxy.transcripts.entries import Entry
from proxy.transcripts.records import TailMessage, TranscriptStore
from proxy.transcripts.render import RenderOptions

__all__ = ["RenderedTail"]

# Counted in transcript bytes; decoded and rendered, a kept entry takes about 2.5 times its
# line in memory, so this is some 20 MB at most.
MAX_BYTES = 8 * 1024 * 1024
MAX_ENTRIES = 20_000

_Key = tuple[int, str, int, int, tuple[str, int, int] | None, str, tzinfo]


def _key(store: TranscriptStore, entry: Entry, edit: Entry | None,
         opts: RenderOptions) -> _Key:
    # The options by their fields: a key is hashed twice a lookup, and the dataclass's own
    # hash is Python code (half the cost of a lookup).
    return (id(store), entry.id, entry.pos, entry.size,
            (edit.id, edit.pos, edit.size) if edit is not None else None,
            opts.flavor, opts.tz)


def cost_of(entry: Entry, edit: Entry | None, message: TailMessage) -> int:
    """Bytes a kept rendering stands for: the lines read (a database row has no line size:
    its object is measured)."""
    size = entry.size + (edit.size if edit is not None else 0)
    if size:
        return size
    try:
        return len(orjson.dumps(message.raw)) + 256
    except orjson.JSONEncodeError:  # nested deeper than orjson writes: not worth keeping
        return MAX_BYTES


class RenderedTail:
    """A least-recently-used map, safe to share between the worker threads."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self._kept: OrderedDict[_Key, tuple[TranscriptStore, TailMessage, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: TranscriptStore, entry: Entry, edit: Entry | None,
            opts: RenderOptions) -> TailMessage | None:
        return self.get_many(store, [entry], {entry.id: edit} if edit is not None else {},
                             opts)[0]

    def get_many(self, store: TranscriptStore, entries: Sequence[Entry],
                 edits: Mapping[str, Entry], opts: RenderOptions) -> list[TailMessage | None]:
        """``get`` for each entry (with its edit in ``edits``), under one hold of the lock."""
        keys = [_key(store, e, edits.get(e.id), opts) for e in entries]
        out: list[TailMessage | None] = []
        with self._lock:
            kept = self._kept
            for key in keys:
                found = kept.get(key)
                # The id of a store that was dropped can be reused: the held store must be it.
                if found is None or found[0] is not store:
                    out.append(None)
                    continue
                kept.move_to_end(key)
                out.append(found[1])
        return out

    def put(self, store: TranscriptStore, entry: Entry, edit: Entry | None,
            opts: RenderOptions, message: TailMessage) -> None:
        cost = cost_of(entry, edit, message)
        if cost > min(self.max_bytes, MAX_BYTES) // 8:
            return  # one huge message would push out everything else
        key = _key(store, entry, edit, opts)
        with self._lock:
            old = self._kept.pop(key, None)
            if old is not None:
                self.bytes -= old[2]
            self._kept[key] = (store, message, cost)
            self.bytes += cost
            while self._kept and (self.bytes > self.max_bytes
                                  or len(self._kept) > self.max_entries):
                _, (_, _, dropped) = self._kept.popitem(last=False)
                self.bytes -= dropped
