"""Message content for a plan or a tail: read the entries' objects from their store, apply
Pi's context edits, render. The catalog holds no content (see ``entries``): a plan is read
again every time; a tail's renderings may be kept within a byte budget (``rendered``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.transcripts.entries import Entry
from proxy.transcripts.records import TailMessage, TranscriptStore
from proxy.transcripts.render import RenderOptions, Source, edited, render
from proxy.transcripts.render_cache import RenderedTail
from proxy.transcripts.view import ContextPlan

__all__ = ["framing", "render_plan", "tail_records"]

_FRAMING = ("role", "timestamp", "provider", "model")


def render_plan(store: TranscriptStore, plan: ContextPlan, opts: RenderOptions
                ) -> list[dict[str, Any]]:
    """The messages the agent sends for this plan (its system prompt excluded)."""
    wanted = ([plan.compaction] if plan.compaction else []) + list(plan.entries)
    objs = _edited(store, wanted, store.load(wanted), plan.edits)
    items = [Source(e.kind, o, e.timestamp) for e, o in zip(wanted, objs, strict=True)
             if o is not None]
    return render(items, opts)


def tail_records(store: TranscriptStore, picked: Sequence[Entry], edits: Mapping[str, Entry],
                 opts: RenderOptions, kept: RenderedTail | None = None) -> list[TailMessage]:
    """Each picked entry with its own rendering (no cross-message repairs); renderings in
    ``kept`` are used as they are, the others read (together) and kept there."""
    found: dict[int, TailMessage] = {}
    if kept is not None:
        for i, hit in enumerate(kept.get_many(store, picked, edits, opts)):
            if hit is not None:
                found[i] = hit
    missing = [e for i, e in enumerate(picked) if i not in found]
    objs = iter(_edited(store, missing, store.load(missing), edits) if missing else ())
    out: list[TailMessage] = []
    for i, entry in enumerate(picked):
        if i in found:
            out.append(found[i])
            continue
        obj = next(objs)
        if obj is None:
            continue
        msgs = render([Source(entry.kind, obj, entry.timestamp)], opts, replay=False)
        message = TailMessage(entry.id, entry.timestamp, entry.role or entry.kind,
                              framing(obj), tuple(msgs))
        if kept is not None:
            kept.put(store, entry, edits.get(entry.id), opts, message)
        out.append(message)
    return out


def framing(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Of a transcript object, its message's role, own time, provider and model: what the
    floor reads besides the rendering (the time an agent stamps a user text's prefix with,
    and whether the agent wrote the answer itself)."""
    inner = obj.get("message")
    if not isinstance(inner, Mapping):
        return {}
    return {"message": {k: inner[k] for k in _FRAMING if k in inner}}


def _edited(store: TranscriptStore, entries: Sequence[Entry],
            objs: Sequence[Mapping[str, Any] | None], edits: Mapping[str, Entry]
            ) -> list[Mapping[str, Any] | None]:
    """``objs`` with the content of their replacing context edits, read once."""
    if not edits:
        return list(objs)
    wanted = [edits[e.id] for e in entries if e.id in edits]
    loaded = dict(zip((e.id for e in wanted), store.load(wanted), strict=True))
    out: list[Mapping[str, Any] | None] = []
    for entry, obj in zip(entries, objs, strict=True):
        edit = edits.get(entry.id)
        change = loaded.get(edit.id) if edit is not None else None
        out.append(obj if obj is None or change is None else edited(entry.kind, obj, change))
    return out
