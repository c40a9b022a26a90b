"""Transcript entries: parse one JSON object of a Pi/OpenClaw transcript into a frozen record.

Pure: no I/O. The records keep only what the views and indexes need (ids, tree links, kind,
timestamps, compaction/reset fields, index keys). Message *content* is not kept in memory: it
is fetched again from the file or database when a view needs it (see ``catalog.ContentLoader``),
so memory does not grow with transcript size.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from proxy.values import frozen_value
from proxy.wire.content import content_text
from proxy.wire.openclaw import collapsed, normalised_pieces
from proxy.wire.pin_marks import holds_mark
from proxy.wire.tool_ids import call_id_key

__all__ = [
    "KNOWN_KINDS",
    "MESSAGE_KINDS",
    "Entry",
    "EntryDetail",
    "EntryError",
    "Header",
    "assistant_text_key",
    "parse_entry",
    "parse_header",
    "parse_timestamp",
    "summary_key",
    "tool_call_key",
    "user_text_key",
]

_MESSAGE = sys.intern("message")
KNOWN_KINDS = frozenset({
    "message", "compaction", "branch_summary", "custom_message", "model_change",
    "thinking_level_change", "custom", "label", "session_info", "reset",
    # Pi 1.x: usage (e.g. a cache warm) is a tree node without context; a context edit
    # removes or replaces an earlier message in what the model is shown.
    "usage", "context_edit",
})
# Entry kinds that can put a message in front of the model.
MESSAGE_KINDS = frozenset({"message", "custom_message", "branch_summary"})
SUPPORTED_VERSIONS = frozenset({1, 2, 3, 4})



class EntryError(ValueError):
    """A transcript object that cannot be used; ``kind`` is the metrics label."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Header:
    """Line 1 of a JSONL transcript (first row of an OpenClaw SQLite transcript)."""

    session_id: str
    version: int
    timestamp: float | None
    cwd: str | None = None
    parent_session: str | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A scan worker sends one for every session: made again by a call, not by the
        # generic state of a slotted class (which looks its fields up each time), and the
        # working directory interned again, one per project.
        return _header, (self.session_id, self.version, self.timestamp, self.cwd,
                         self.parent_session)


def _header(sid: str, version: int, timestamp: float | None, cwd: str | None,
            parent: str | None) -> Header:
    return Header(sid, version, timestamp, sys.intern(cwd) if cwd is not None else None, parent)


@frozen_value
class EntryDetail:
    """What only a compaction, branch summary, reset or context edit has: most entries
    are messages, and tens of thousands of tracked sessions keep every entry."""

    summary: str | None = None
    first_kept_id: str | None = None
    reason: str | None = None
    target_id: str | None = None  # context_edit: the entry it edits
    removes: bool = False  # context_edit: ``replacement: null``, the target leaves the context


@frozen_value
class Entry:
    """One transcript entry, without its message content.

    ``pos`` locates the entry for re-reading: the byte offset of the line in a JSONL file, or
    the ``seq`` of the row in OpenClaw's ``transcript_events``. ``size`` is the line's length
    in bytes including its newline (0 for rows). ``keys`` are the content-index keys of the
    entry (tool-call ids and user-text hashes, see ``tool_call_keys``/``user_text_key``).
    ``detail``: the fields of the rarer kinds (read through the properties below).
    ``may_pin``: a user message with a ``!`` or a 📌 in its text, which the default pin
    markers need (``floor.pin_index`` reads only those, and the ones edited since).
    """

    kind: str
    id: str
    parent_id: str | None
    timestamp: float | None
    pos: int
    size: int = 0
    role: str | None = None
    stop_reason: str | None = None
    keys: tuple[int, ...] = ()
    detail: EntryDetail | None = None
    may_pin: bool = False

    @property
    def summary(self) -> str | None:
        return self.detail.summary if self.detail is not None else None

    @property
    def first_kept_id(self) -> str | None:
        return self.detail.first_kept_id if self.detail is not None else None

    @property
    def reason(self) -> str | None:
        return self.detail.reason if self.detail is not None else None

    @property
    def target_id(self) -> str | None:
        return self.detail.target_id if self.detail is not None else None

    @property
    def removes(self) -> bool:
        return self.detail.removes if self.detail is not None else False

    @property
    def is_raw_message(self) -> bool:
        """A message the model sees verbatim: not a summary, not a failed assistant turn."""
        if self.kind == "custom_message":
            return True
        if self.kind != "message":
            return False
        if self.role == "assistant":
            return self.stop_reason not in ("error", "aborted")
        return self.role in ("user", "toolResult", "bashExecution", "custom")


def parse_timestamp(value: object) -> float | None:
    """ISO-8601 string or epoch milliseconds -> epoch seconds; None when unusable."""
    if type(value) is str:  # what nearly every entry has: straight to it
        try:
            return datetime.fromisoformat(value).timestamp() if value else None
        except ValueError:
            return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) / 1000.0
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def parse_header(obj: object) -> Header:
    """Validate a session header object; raise EntryError(missing_header|bad_version)."""
    if not isinstance(obj, Mapping) or obj.get("type") != "session":
        raise EntryError("missing_header", "first entry is not a session header")
    sid = obj.get("id")
    if not isinstance(sid, str) or not sid:
        raise EntryError("missing_header", "session header has no id")
    version = obj.get("version", 1)
    if not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
        raise EntryError("bad_version", f"unsupported transcript version {version!r}")
    cwd = obj.get("cwd")
    parent = obj.get("parentSession")
    return Header(
        session_id=sid, version=version, timestamp=parse_timestamp(obj.get("timestamp")),
        cwd=sys.intern(cwd) if isinstance(cwd, str) else None,  # one per project, not session
        parent_session=parent if isinstance(parent, str) else None)


def _str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def parse_entry(obj: object, pos: int, size: int = 0, *, v1_index: int | None = None,
                v1_parent: str | None = None) -> Entry:
    """Turn one decoded JSON object into an Entry.

    ``v1_index``: for version-1 transcripts (no ids) the line index (header = 0); the entry
    gets the id ``v1-<index>`` and ``v1_parent`` as parent, which is how Pi's own migration
    chains them, and a compaction's ``firstKeptEntryIndex`` maps onto the same naming.
    Raises EntryError(kind) for objects that are not usable entries.
    """
    # A decoded line is a dict: the exact type first, the ABC's instance check is slow, and
    # so is a call per field (the scan parses every entry of every session).
    if obj.__class__ is not dict and not isinstance(obj, Mapping):
        raise EntryError("malformed", "entry is not a JSON object")
    get = cast("Mapping[str, Any]", obj).get
    kind = get("type")
    if not isinstance(kind, str):
        raise EntryError("malformed", "entry has no type")
    if kind == "session":
        raise EntryError("misplaced_header", "session header after line 1")
    if kind not in KNOWN_KINDS:
        raise EntryError("unknown_type", f"unknown entry type {kind[:40]!r}")
    entry_id = get("id")
    if v1_index is not None and not isinstance(entry_id, str):
        entry_id, parent = f"v1-{v1_index}", v1_parent
    else:
        parent = get("parentId")
        if not isinstance(parent, str):
            parent = None
    if not entry_id or not isinstance(entry_id, str):
        raise EntryError("malformed", "entry has no id")
    # Ids are not interned: a tracked session keeps them packed (``packed``, where a parent
    # that repeats the entry before is not stored again), and interning every id of every
    # transcript only churned the interpreter's table of interned strings.
    parent = parent or None
    ts = parse_timestamp(get("timestamp"))
    if kind == "message":
        msg = get("message")
        if msg.__class__ is not dict and not isinstance(msg, Mapping):
            raise EntryError("malformed", "message entry without a message role")
        message = cast("Mapping[str, Any]", msg)
        role = message.get("role")
        if not isinstance(role, str):
            raise EntryError("malformed", "message entry without a message role")
        # A few distinct values in every entry of every session: one object each, not one
        # per entry (each parse makes new strings; 10,000 sessions keep them all).
        stop = message.get("stopReason")
        if ts is None:
            ts = parse_timestamp(message.get("timestamp"))
        return Entry(_MESSAGE, entry_id, parent, ts, pos, size, sys.intern(str(role)),
                     sys.intern(stop) if isinstance(stop, str) else None,
                     _message_keys(message), None,
                     role == "user" and _may_pin(message.get("content")))
    return _other(kind, cast("Mapping[str, Any]", obj), entry_id, parent, ts=ts, pos=pos,
                  size=size)


def _other(kind: str, obj: Mapping[str, Any], entry_id: str, parent: str | None, *,
           ts: float | None, pos: int, size: int) -> Entry:
    """An entry of a kind other than ``message``."""
    summary = first_kept = reason = target = None
    removes = False
    keys: tuple[int, ...] = ()
    if kind == "compaction":
        summary = _str(obj, "summary") or ""
        first_kept = _str(obj, "firstKeptEntryId")
        found = summary_key(summary)
        keys = (found,) if found is not None else ()
        index = obj.get("firstKeptEntryIndex")
        if first_kept is None and isinstance(index, int) and not isinstance(index, bool):
            first_kept = f"v1-{index}"
    elif kind == "branch_summary":
        summary = _str(obj, "summary") or ""
    elif kind == "reset":
        first_kept = _str(obj, "firstKeptEntryId")
        reason = _str(obj, "reason")
    elif kind == "custom_message":
        keys = _user_keys(obj.get("content"))
    elif kind == "context_edit":
        target, removes = _edit_target(obj)
    return Entry(sys.intern(kind), entry_id, parent, ts, pos, size, None, None, keys,
                 _detail(summary, first_kept, reason, target, removes))


def _detail(summary: str | None, first_kept: str | None, reason: str | None,
            target: str | None, removes: bool) -> EntryDetail | None:
    if summary is None and first_kept is None and reason is None and target is None \
            and not removes:
        return None  # a message, or a kind with none of these fields
    return EntryDetail(summary, first_kept, reason, target, removes)


def _edit_target(obj: Mapping[str, Any]) -> tuple[str | None, bool]:
    """A context edit's target and whether it removes it. An edit Pi could not have written
    (no target, a replacement without content) stays a tree node that changes nothing, so
    the entries after it keep their branch."""
    replacement = obj.get("replacement")
    usable = replacement is None or (isinstance(replacement, Mapping) and isinstance(
        replacement.get("content"), str | list))
    target = _str(obj, "targetId") if usable else None
    if not target:
        return None, False
    return sys.intern(target), replacement is None


# A hash already fed its tag, copied for each key: a new hash object costs more than the
# hashing of a short text (the scan makes a key for every message of every session).
_TAGGED = {tag: hashlib.blake2b(tag, digest_size=8) for tag in (b"u", b"a", b"t", b"s")}


def _digest(tag: bytes, text: str) -> int:
    h = _TAGGED[tag].copy()
    h.update(text.encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "big")


def _digest_of(tag: bytes, pieces: Iterator[str]) -> int | None:
    """``_digest`` of the pieces' text joined (None when it is empty), without joining it."""
    digest = _TAGGED[tag].copy()
    empty = True
    for piece in pieces:
        digest.update(piece.encode("utf-8", "surrogatepass"))
        empty = empty and not piece
    return None if empty else int.from_bytes(digest.digest(), "big")


def user_text_key(text: str) -> int | None:
    """Index key of a user message's text (None for empty text)."""
    return _digest_of(b"u", normalised_pieces(text))


def assistant_text_key(text: str) -> int | None:
    """Index key of an assistant message's text as the agents send it: its non-blank text
    blocks joined (None for no text). Not normalised: it is computed for several messages of
    every request, and a reply is long."""
    return _digest(b"a", text) if text else None


@functools.lru_cache(maxsize=256)  # a tool result repeats the id of the call just before
def tool_call_key(call_id: str) -> int | None:
    """Index key of a tool-call id, the same for each of its wire forms (wire.tool_ids)."""
    core = call_id_key(call_id)
    return _digest(b"t", core) if core else None


def summary_key(summary: str) -> int | None:
    """Index key of a compaction summary's text (whitespace collapsed; None when empty):
    a summary is long model output no other session holds, so it names its session."""
    return _digest_of(b"s", collapsed(summary))


def _may_pin(content: object) -> bool:
    """Whether a user content has a default pin mark in a text (or a shape not read here)."""
    if isinstance(content, str):
        return holds_mark(content)
    if not isinstance(content, list):
        return False  # renders as no message
    for block in content:
        if block.__class__ is not dict:
            return True
        text = block.get("text")
        if isinstance(text, str) and holds_mark(text):
            return True
    return False


def _user_keys(content: object) -> tuple[int, ...]:
    if content.__class__ is list and len(content) == 1 \
            and content[0].__class__ is dict:
        text = content[0].get("text")
        # one text block, as a user turn mostly is: content_text's join of it
        key = user_text_key(text if isinstance(text, str) else "")
    else:
        key = user_text_key(content_text(content))
    return (key,) if key else ()


def _message_keys(msg: Mapping[str, Any]) -> tuple[int, ...]:
    role = msg.get("role")
    if role == "user":
        return _user_keys(msg.get("content"))
    if role == "toolResult":
        call = msg.get("toolCallId")
        key = tool_call_key(call) if isinstance(call, str) else None
        return (key,) if key is not None else ()
    if role != "assistant":
        return ()
    ids: list[object] = []
    texts: list[str] = []
    content = msg.get("content")
    for b in content if isinstance(content, list) else ():
        if b.__class__ is not dict and not isinstance(b, Mapping):
            continue
        kind = b.get("type")
        if kind == "toolCall":
            ids.append(b.get("id"))
        elif kind == "text":
            text = b.get("text")
            if isinstance(text, str) and text.strip():
                texts.append(text)
    keys = [tool_call_key(i) for i in ids if isinstance(i, str)]
    keys.append(assistant_text_key("".join(texts)))
    return tuple(dict.fromkeys(k for k in keys if k is not None))
