"""Message content for a plan or a tail: read the entries' objects from their store, apply
Pi's context edits, render. Content is never kept in memory between requests (see
``entries``), so every view reads it again here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.transcripts.entries import Entry
from proxy.transcripts.records import TailMessage, TranscriptStore
from proxy.transcripts.render import RenderOptions, Source, edited, render
from proxy.transcripts.view import ContextPlan

__all__ = ["render_plan", "tail_records"]


def render_plan(store: TranscriptStore, plan: ContextPlan, opts: RenderOptions
                ) -> list[dict[str, Any]]:
    """The messages the agent sends for this plan (its system prompt excluded)."""
    wanted = ([plan.compaction] if plan.compaction else []) + list(plan.entries)
    objs = _edited(store, wanted, store.load(wanted), plan.edits)
    items = [Source(e.kind, o, e.timestamp) for e, o in zip(wanted, objs, strict=True)
             if o is not None]
    return render(items, opts)


def tail_records(store: TranscriptStore, picked: Sequence[Entry], edits: Mapping[str, Entry],
                 opts: RenderOptions) -> list[TailMessage]:
    """Each picked entry with its own rendering (no cross-message repairs)."""
    objs = _edited(store, picked, store.load(picked), edits)
    out: list[TailMessage] = []
    for entry, obj in zip(picked, objs, strict=True):
        if obj is None:
            continue
        msgs = render([Source(entry.kind, obj, entry.timestamp)], opts, replay=False)
        out.append(TailMessage(entry.id, entry.timestamp, entry.role or entry.kind, obj,
                               tuple(msgs)))
    return out


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
