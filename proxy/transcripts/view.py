"""What the model is shown: the active branch, its boundaries, the context plan. Pure.

The rules follow Pi's ``buildSessionContext`` plus OpenClaw's ``reset`` entries:

1. The leaf is the last entry; the active branch is the path leaf -> root via ``parentId``.
2. The last ``reset`` entry R on the branch hides everything before it (or before its
   ``firstKeptEntryId`` when it keeps some messages); compactions before R are ignored too.
3. The last compaction C after R: its summary, then the branch entries before C starting
   at ``C.firstKeptEntryId`` (none if that id is not found there), then everything after C.
4. Only ``message``, ``custom_message`` and non-empty ``branch_summary`` entries are shown.
5. Pi 1.x ``context_edit`` entries among the chosen entries: the latest one per target wins;
   ``replacement: null`` hides the target, a replacement changes its content (rendered by
   ``render.edited``). System-role messages carry Pi's prompt, never a chat message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from proxy.transcripts.entries import MESSAGE_KINDS, Entry
from proxy.transcripts.records import CompactionInfo, ResetMark

__all__ = ["Branch", "ContextPlan", "active_branch", "boundaries", "context_plan",
           "edits_of", "plan_is_local", "replacements", "segment_start", "segment_within",
           "tail_of"]


@dataclass(frozen=True, slots=True)
class Branch:
    """The active branch root -> leaf, and whether a parent link was broken on the way."""

    entries: tuple[Entry, ...]
    missing_parent: str | None = None


@dataclass(frozen=True, slots=True)
class ContextPlan:
    """The entries to render, in order; ``compaction`` (if any) is rendered first as summary."""

    compaction: Entry | None
    entries: tuple[Entry, ...]
    reset: Entry | None
    edits: Mapping[str, Entry] = field(default_factory=dict)  # entry id -> its replacement


def active_branch(entries: Sequence[Entry], by_id: Mapping[str, Entry] | None = None,
                  leaf: Entry | None = None) -> Branch:
    """Walk from the leaf (default: the last entry) to the root.

    A ``parentId`` that names no known entry ends the walk there (reported in
    ``missing_parent``); a cycle ends it too.
    """
    if not entries and leaf is None:
        return Branch(())
    if by_id is None:
        if leaf is None:
            chain = _chain(entries)
            if chain is not None:
                return chain
        by_id = {e.id: e for e in entries}
    current: Entry | None = leaf if leaf is not None else entries[-1]
    path: list[Entry] = []
    seen: set[str] = set()
    missing: str | None = None
    while current is not None and current.id not in seen:
        seen.add(current.id)
        path.append(current)
        parent = current.parent_id
        if parent is None:
            break
        current = by_id.get(parent)
        if current is None:
            missing = parent
    path.reverse()
    return Branch(tuple(path), missing)


def _chain(entries: Sequence[Entry]) -> Branch | None:
    """The walk's result for a window where each entry's parent is the entry before (a
    transcript that never branched: nearly every window), without the walk; None for any
    other window. Ids must be unique: the walk follows the last entry holding an id."""
    ids = {e.id for e in entries}
    if len(ids) != len(entries) or not all(
            e.parent_id == before.id for before, e in pairwise(entries)):
        return None
    top = entries[0].parent_id  # the walk ends at the first entry, at its missing parent
    return Branch(tuple(entries), None if top is None or top in ids else top)


def _last_reset(path: Sequence[Entry]) -> int:
    for i in range(len(path) - 1, -1, -1):
        if path[i].kind == "reset":
            return i
    return -1


def segment_start(path: Sequence[Entry]) -> tuple[int, Entry | None]:
    """Index of the first visible entry after the last reset, and that reset entry."""
    r = _last_reset(path)
    if r < 0:
        return 0, None
    reset = path[r]
    if reset.first_kept_id:
        for i in range(r):
            if path[i].id == reset.first_kept_id:
                return i, reset
    return r + 1, reset


def context_plan(path: Sequence[Entry]) -> ContextPlan:
    """The equivalent of Pi's buildSessionContext, honouring OpenClaw reset entries."""
    start, reset = segment_start(path)
    comp_index = -1
    for i in range(len(path) - 1, start - 1, -1):
        if path[i].kind == "compaction":
            comp_index = i
            break
    if comp_index < 0:
        return _plan(None, path[start:], reset)
    comp = path[comp_index]
    kept_from = comp_index
    for i in range(start, comp_index):
        if path[i].id == comp.first_kept_id:
            kept_from = i
            break
    return _plan(comp, [*path[kept_from:comp_index], *path[comp_index + 1:]], reset)


def _plan(compaction: Entry | None, chosen: Sequence[Entry], reset: Entry | None
          ) -> ContextPlan:
    edits = edits_of(chosen)
    shown = tuple(e for e in chosen if _shown(e) and not _removed(e, edits))
    replaced = {e.id: edits[e.id] for e in shown if e.id in edits}
    return ContextPlan(compaction, shown, reset, replaced)


def edits_of(entries: Iterable[Entry]) -> dict[str, Entry]:
    """The latest context edit of each target among ``entries``."""
    return {e.target_id: e for e in entries if e.kind == "context_edit" and e.target_id}


def _removed(entry: Entry, edits: Mapping[str, Entry]) -> bool:
    edit = edits.get(entry.id)
    return edit is not None and edit.removes


def replacements(path: Sequence[Entry], picked: Sequence[Entry]) -> dict[str, Entry]:
    """The edits that change the content of ``picked`` entries (from ``tail_of(path)``)."""
    edits = edits_of(path)
    return {e.id: edits[e.id] for e in picked if e.id in edits and not edits[e.id].removes}


def _shown(entry: Entry) -> bool:
    if entry.kind == "branch_summary":
        return bool(entry.summary)
    if entry.kind == "message" and entry.role == "system":
        return False
    return entry.kind in MESSAGE_KINDS


def tail_of(path: Sequence[Entry], k: int, before: str | None = None) -> list[Entry]:
    """The last ``k`` raw messages of the branch segment that ends before entry ``before``.

    Without ``before``: the current segment (after the last reset). With ``before`` set to a
    reset entry's id: the segment that reset closed (what a carry-forward needs). Compaction
    does not hide raw messages here: the transcript still has them.
    """
    end = len(path)
    if before is not None:
        end = next((i for i, e in enumerate(path) if e.id == before), len(path))
    start, _reset = segment_start(path[:end])
    if k <= 0:
        return []
    edits = edits_of(path[start:end])
    picked: list[Entry] = []
    for i in range(end - 1, start - 1, -1):
        if path[i].is_raw_message and not _removed(path[i], edits):
            picked.append(path[i])
            if len(picked) >= k:
                break
    picked.reverse()
    return picked


def boundaries(path: Sequence[Entry], rooted: bool, marks: Iterable[Entry]
               ) -> tuple[CompactionInfo | None, tuple[ResetMark, ...]]:
    """The last compaction in force on the branch, and every reset entry seen.

    ``path`` may be the newest part of the branch only (``rooted`` False); then a
    compaction older than it (from ``marks``, the compaction/reset entries kept aside)
    counts as long as no reset came after it.
    """
    ordered = sorted(marks, key=lambda m: m.pos)
    resets = tuple(ResetMark(m.id, m.timestamp, m.reason) for m in ordered if m.kind == "reset")
    start, _reset = segment_start(path)
    for e in reversed(path[start:]):
        if e.kind == "compaction":
            return CompactionInfo(e.id, e.summary or "", e.first_kept_id, e.timestamp), resets
    if rooted or any(e.kind == "reset" for e in path):
        return None, resets
    first = path[0].pos if path else None
    for m in reversed(ordered):
        if first is not None and m.pos >= first:
            continue
        if m.kind == "reset":
            break
        return CompactionInfo(m.id, m.summary or "", m.first_kept_id, m.timestamp), resets
    return None, resets


def plan_is_local(path: Sequence[Entry], plan: ContextPlan) -> bool:
    """Whether a plan computed from a partial branch starts inside that branch."""
    ids = {e.id for e in path}
    if plan.compaction is not None:
        return plan.compaction.first_kept_id in ids
    if plan.reset is not None:
        return plan.reset.first_kept_id is None or plan.reset.first_kept_id in ids
    return False


def segment_within(path: Sequence[Entry], rooted: bool, before: str | None) -> bool:
    """Whether the wanted segment starts within ``path`` (so reading more cannot add)."""
    if rooted:
        return True
    end = next((i for i, e in enumerate(path) if e.id == before), len(path)) \
        if before is not None else len(path)
    if before is not None and end == len(path):
        return False  # the closing reset is not even in the window
    return any(e.kind == "reset" for e in path[:end])
