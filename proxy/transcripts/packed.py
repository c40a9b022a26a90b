"""A session's window of entry records packed into one ``bytes``: what every tracked
session keeps between the requests that read it. Pure, no I/O.

An ``Entry`` with its id, position, timestamp and key objects takes some 400 bytes; tens of
thousands of sessions are tracked and most are never read again after the scan. Packed, an
entry is a row of 25 bytes (position, size, timestamp, a two-byte code for its kind, role,
stop reason and pin mark, the lengths of its id and parent id, its number of index keys), 8 bytes
an index key and its ids as UTF-8; a parent id that repeats the id of the entry before
(nearly every one) is not stored again.

An entry a row cannot hold exactly (the fields of the rarer kinds, an unknown role or stop
reason, a NaN timestamp, an id that is empty, over 254 bytes or not valid UTF-8, more than
255 keys, a position or size out of range...) is kept as it is, beside the blob, under its
index: ``unpack`` gives back entries equal to those packed, always.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterator, Sequence

from proxy.transcripts.entries import KNOWN_KINDS, Entry

__all__ = ["Odd", "count", "first_pos", "keys_of", "pack", "unpack"]

Odd = dict[int, Entry]  # entry index -> the entry, kept as it is

_HEAD = struct.Struct("<II")  # entries, keys
_ROW = struct.Struct("<qIdHBBB")  # position, size, timestamp, code, id, parent id, keys
_KEY = struct.Struct("<Q")
_ROLES: tuple[str | None, ...] = (None, "user", "assistant", "toolResult", "bashExecution",
                                  "custom", "system")
_STOPS: tuple[str | None, ...] = (None, "stop", "toolUse", "error", "aborted", "length")
# (kind, role, stop reason, may pin) <-> a code: every combination of the values above
_COMBOS = tuple(itertools.product(sorted(KNOWN_KINDS), _ROLES, _STOPS, (False, True)))
_CODE = {combo: i for i, combo in enumerate(_COMBOS)}
ODD = 0xFFFF  # the code of an entry kept as it is
SAME = 255  # the parent length that means "the id of the entry before"
_MAX_ID = 254
_ODD_ROW = _ROW.pack(0, 0, 0.0, ODD, 0, 0, 0)


def pack(entries: Sequence[Entry], *, check_keys: bool = False) -> tuple[bytes, Odd | None]:
    """The blob of ``entries`` and the ones kept as they are (None: none)."""
    rows: list[bytes] = []
    keys: list[int] = []
    ids: list[bytes] = []
    odd: Odd | None = None
    previous: str | None = None
    row = _ROW.pack
    code_of = _CODE.get
    # One pass, one row at a time: the scan packs every session there is, and at a
    # window's size this beats a column at a time (a comprehension per column).
    for i, e in enumerate(entries):
        code = code_of((e.kind, e.role, e.stop_reason, e.may_pin), ODD)
        ts = e.timestamp
        if ts is None:
            ts = math.nan  # the row's None
        elif ts != ts:  # noqa: PLR0124 -- a NaN of its own stays an object
            code = ODD
        parent = e.parent_id
        try:
            ident = e.id.encode()
            if parent is None:
                link, plen = b"", 0
            elif parent == previous:
                link, plen = b"", SAME
            else:
                link = parent.encode()
                plen = len(link) or ODD  # an empty parent id would read back as None
            found = None
            if code != ODD and e.detail is None and 0 < len(ident) <= _MAX_ID \
                    and len(link) <= _MAX_ID and plen != ODD \
                    and (not check_keys or all(_KEY.pack(k) for k in e.keys)):
                found = row(e.pos, e.size, ts, code, len(ident), plen, len(e.keys))
        except (UnicodeEncodeError, struct.error):  # not UTF-8, a value out of range
            found = None
        previous = e.id
        if found is None:
            if odd is None:
                odd = {}
            odd[i] = e
            rows.append(_ODD_ROW)
            continue
        rows.append(found)
        keys += e.keys
        ids += (ident, link)
    try:
        key_bytes = struct.pack(f"<{len(keys)}Q", *keys)
    except struct.error:  # a key that is no 64-bit digest (never one ``entries`` made)
        return pack(entries, check_keys=True)
    return b"".join((_HEAD.pack(len(rows), len(keys)), *rows, key_bytes, *ids)), odd


def count(blob: bytes) -> int:
    """How many entries a blob holds."""
    return _HEAD.unpack_from(blob)[0] if blob else 0


def _sections(blob: bytes) -> tuple[int, int, int]:
    """A blob's number of entries, where its keys start and where its ids start."""
    rows, keys = _HEAD.unpack_from(blob)
    at_keys = _HEAD.size + rows * _ROW.size
    return rows, at_keys, at_keys + keys * _KEY.size


def unpack(blob: bytes, odd: Odd | None) -> list[Entry]:
    """The entries packed, equal to those given to ``pack``, in order."""
    if not blob:
        return []
    _rows, at_keys, at = _sections(blob)
    keys = struct.unpack_from(f"<{(at - at_keys) // _KEY.size}Q", blob, at_keys)
    out: list[Entry] = []
    previous: str | None = None
    key_at = 0
    for i, (pos, size, ts, code, id_len, plen, nkeys) in enumerate(
            _ROW.iter_unpack(memoryview(blob)[_HEAD.size:at_keys])):
        if code == ODD:
            assert odd is not None
            e = odd[i]
        else:
            end = at + id_len
            ident = blob[at:end].decode()
            if plen == SAME:
                parent = previous
            elif plen:
                at, end = end, end + plen
                parent = blob[at:end].decode()
            else:
                parent = None
            at = end
            kind, role, stop, may_pin = _COMBOS[code]
            e = Entry(kind, ident, parent, None if math.isnan(ts) else ts, pos, size, role,
                      stop, keys[key_at:key_at + nkeys], None, may_pin)
            key_at += nkeys
        out.append(e)
        previous = e.id
    return out


def keys_of(blob: bytes, odd: Odd | None) -> Iterator[int]:
    """The index keys of every entry packed (an entry's keys may repeat another's)."""
    if blob:
        _rows, at_keys, at_ids = _sections(blob)
        yield from struct.unpack_from(f"<{(at_ids - at_keys) // _KEY.size}Q", blob, at_keys)
    for e in (odd or {}).values():
        yield from e.keys


def first_pos(blob: bytes, odd: Odd | None) -> int | None:
    """The position of the first entry (None: no entry)."""
    if not count(blob):
        return None
    if odd is not None and 0 in odd:
        return odd[0].pos
    pos: int = struct.unpack_from("<q", blob, _HEAD.size)[0]
    return pos
