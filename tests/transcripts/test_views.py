"""Pure parts: entry parsing, branches, boundaries, rendering, catalog windows and indexes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, timedelta, timezone
from typing import Any

import pytest

from proxy.transcripts import view
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.entries import (
    Entry,
    EntryError,
    parse_entry,
    parse_header,
    user_text_key,
)
from proxy.transcripts.records import SessionInfo, Window
from proxy.transcripts.render import RenderOptions, Source, render
from proxy.wire.openclaw import normalise_user_text
from proxy.wire.openclaw import render_prefix as openclaw_prefix


class MemStore:
    """A transcript held in memory (objects by position) standing in for a file."""

    def __init__(self, objs: Sequence[dict[str, Any]], v1: bool = False) -> None:
        self.objs = list(objs)
        self.reads = 0
        self.v1 = v1

    def entries(self) -> list[Entry]:
        out: list[Entry] = []
        last: str | None = None
        for i, obj in enumerate(self.objs):
            e = parse_entry(obj, i, v1_index=i + 1 if self.v1 else None, v1_parent=last)
            last = e.id
            out.append(e)
        return out

    def load(self, entries: Sequence[Entry]) -> list[Mapping[str, Any] | None]:
        return [self.objs[e.pos] for e in entries]

    def read_window(self, min_messages: int | None) -> Window:
        self.reads += 1
        return Window(self.entries(), True)


def msg(eid: str, parent: str | None, role: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent,
            "timestamp": "2026-11-30T02:00:00.000Z",
            "message": {"role": role, "content": content, **extra}}


def user(eid: str, parent: str | None, text: str) -> dict[str, Any]:
    return msg(eid, parent, "user", text, timestamp=1796004000000)


def reply(eid: str, parent: str | None, text: str, stop: str = "stop") -> dict[str, Any]:
    return msg(eid, parent, "assistant", [{"type": "text", "text": text}], stopReason=stop)


def conversation(n: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    parent = None
    for i in range(n):
        objs.append(user(f"u{i}", parent, f"question {i}"))
        objs.append(reply(f"a{i}", f"u{i}", f"answer {i}"))
        parent = f"a{i}"
    return objs


def test_headers_and_bad_entries() -> None:
    assert parse_header({"type": "session", "id": "x"}).version == 1
    with pytest.raises(EntryError) as err:
        parse_header({"type": "session", "id": "x", "version": 7})
    assert err.value.kind == "bad_version"
    for obj, kind in (([], "malformed"), ({"type": "nope", "id": "a"}, "unknown_type"),
                      ({"type": "message", "id": "a", "message": {}}, "malformed"),
                      ({"type": "session", "id": "a"}, "misplaced_header")):
        with pytest.raises(EntryError) as err:
            parse_entry(obj, 0)
        assert err.value.kind == kind


def test_v1_migration_ids_and_first_kept_index() -> None:
    objs = [{"type": "message", "message": {"role": "user", "content": "old"}},
            {"type": "message", "message": {"role": "assistant", "content": [
                {"type": "text", "text": "old reply"}]}},
            {"type": "message", "message": {"role": "user", "content": "kept"}},
            {"type": "compaction", "summary": "S", "firstKeptEntryIndex": 3},
            {"type": "message", "message": {"role": "user", "content": "new"}}]
    entries = MemStore(objs, v1=True).entries()
    assert [e.id for e in entries] == ["v1-1", "v1-2", "v1-3", "v1-4", "v1-5"]
    assert entries[3].first_kept_id == "v1-3" and entries[4].parent_id == "v1-4"
    plan = view.context_plan(view.active_branch(entries).entries)
    assert plan.compaction is entries[3]
    assert [e.id for e in plan.entries] == ["v1-3", "v1-5"]


def test_branch_follows_the_leaf_and_stops_at_a_missing_parent() -> None:
    objs = [*conversation(2), user("side", "a0", "went back to the first answer")]
    entries = MemStore(objs).entries()
    branch = view.active_branch(entries)
    assert [e.id for e in branch.entries] == ["u0", "a0", "side"]
    orphan = MemStore([user("x", "ghost", "lost")]).entries()
    assert view.active_branch(orphan).missing_parent == "ghost"


def test_reset_boundaries_and_tail_segments() -> None:
    objs = [*conversation(3), {"type": "reset", "id": "r1", "parentId": "a2", "reason": "new"},
            user("n0", "r1", "fresh start")]
    path = view.active_branch(MemStore(objs).entries()).entries
    plan = view.context_plan(path)
    assert [e.id for e in plan.entries] == ["n0"] and plan.reset is not None
    assert [e.id for e in view.tail_of(path, 10)] == ["n0"]
    assert [e.id for e in view.tail_of(path, 3, before="r1")] == ["a1", "u2", "a2"]
    kept = [*conversation(3), {"type": "reset", "id": "r1", "parentId": "a2",
                               "firstKeptEntryId": "u2"}, user("n0", "r1", "again")]
    plan = view.context_plan(view.active_branch(MemStore(kept).entries()).entries)
    assert [e.id for e in plan.entries] == ["u2", "a2", "n0"]


def test_compaction_before_a_reset_is_ignored() -> None:
    objs = [*conversation(2), {"type": "compaction", "id": "c1", "parentId": "a1",
                               "summary": "old", "firstKeptEntryId": "u1"},
            {"type": "reset", "id": "r1", "parentId": "c1"}, user("n0", "r1", "hi")]
    plan = view.context_plan(view.active_branch(MemStore(objs).entries()).entries)
    assert plan.compaction is None and [e.id for e in plan.entries] == ["n0"]


def test_rendering_pi_and_openclaw() -> None:
    call = {"type": "toolCall", "id": "call_ab|fc_1", "name": "bash",
            "arguments": {"command": "ls", "n": 1}}
    objs = [user("u0", None, "go"),
            msg("a0", "u0", "assistant", [{"type": "thinking", "thinking": "hmm",
                                            "thinkingSignature": "reasoning_content"},
                                           {"type": "text", "text": "ok "}, call],
                stopReason="toolUse"),
            user("u1", "a0", "interrupting before the result"),
            msg("a1", "u1", "assistant", [], stopReason="error", errorMessage="boom"),
            msg("b0", "a1", "bashExecution", None, command="pwd", output="/w", exitCode=2)]
    items = [Source("message", o, 1796004000.0) for o in objs]
    pi = render(items)
    assert pi[1] == {"role": "assistant", "content": "ok ", "reasoning_content": "hmm",
                     "tool_calls": [{"id": "call_ab|fc_1", "type": "function", "function": {
                         "name": "bash", "arguments": '{"command":"ls","n":1}'}}]}
    assert pi[2] == {"role": "tool", "content": "No result provided",
                     "tool_call_id": "call_ab|fc_1"}
    assert pi[3] == {"role": "user", "content": "interrupting before the result"}
    assert pi[4]["content"][0]["text"] == "Ran `pwd`\n```\n/w\n```\n\nCommand exited with code 2"
    assert len(pi) == 5  # the failed turn is dropped
    oc = render(items, RenderOptions(flavor="openclaw", tz=timezone(timedelta(hours=1), "CET")))
    assert oc[0]["content"] == "[Mon 2026-11-30 03:00 CET] go"
    # OpenClaw replays a ``<call_id>|<item id>`` id by its call id alone (its completions
    # transport's normalizeToolCallId), then letters and digits only.
    assert oc[1]["tool_calls"][0]["id"] == "callab"
    assert openclaw_prefix(0.0, UTC) == "[Thu 1970-01-01 00:00 UTC] "


def test_user_text_and_tool_call_keys() -> None:
    assert normalise_user_text("[Mon 2026-11-30 02:27 UTC] Hello\n\nRuntime: agent=main | x") \
        == "Hello"
    assert user_text_key("  hello   world ") == user_text_key("hello world")
    assert user_text_key("   ") is None


def _catalog(objs: list[dict[str, Any]], window: int | None = None, tail_limit: int = 10
             ) -> tuple[Catalog, MemStore]:
    store = MemStore(objs)
    entries = store.entries()
    part = entries if window is None else entries[-window:]
    cat = Catalog(tail_limit=tail_limit)
    cat.put(SessionInfo("s", "pi", "pi", "mem", agent_id="pi"), store,
            Window(part, window is None))
    return cat, store


def test_catalog_trims_window_and_index_but_rereads_on_demand() -> None:
    cat, store = _catalog(conversation(40), tail_limit=10)
    assert cat.find_user_text("question 39") == {"s"}
    assert cat.find_user_text("question 0") == frozenset()  # outside the kept tail
    record = cat.get("s")  # the count stays exact although only the tail is kept
    assert record is not None and record.message_count == 80 and record.count_complete
    tail = cat.tail("s", 30)  # more than kept: read again from the store
    assert store.reads == 1 and [t.entry_id for t in tail][-1] == "a39" and len(tail) == 30
    ctx = cat.context("s")
    assert ctx is not None and len(ctx) == 80 and store.reads == 2


def test_catalog_append_updates_index_and_compaction() -> None:
    cat, _store = _catalog(conversation(2))
    extra = [{"type": "compaction", "id": "c1", "parentId": "a1", "summary": "S",
              "firstKeptEntryId": "u1"},
             msg("t0", "c1", "assistant", [{"type": "toolCall", "id": "call_x1", "name": "r",
                                            "arguments": {}}], stopReason="toolUse")]
    store = MemStore([*conversation(2), *extra])
    cat.put(SessionInfo("s", "pi", "pi", "mem"), store, Window(store.entries()[:4], True))
    cat.append("s", store.entries()[4:])
    record = cat.get("s")
    assert record is not None and record.compaction is not None
    assert record.compaction.first_kept_id == "u1"
    assert cat.find_tool_call("callx1") == {"s"} and cat.find_tool_call("call_x1") == {"s"}
    ctx = cat.context("s")
    assert ctx is not None and ctx[0]["content"][0]["text"].endswith("S\n</summary>")
    cat.remove("s")
    assert cat.find_tool_call("call_x1") == frozenset() and cat.get("s") is None


def test_pi_directory_predecessor() -> None:
    cat = Catalog()
    for sid, created in (("old", 1.0), ("new", 2.0), ("other", 3.0)):
        store = MemStore(conversation(1))
        group = "dirB" if sid == "other" else "dirA"
        cat.put(SessionInfo(sid, "pi", "pi", "mem", created=created, group=group), store,
                Window(store.entries(), True))
    cat.relink()
    new = cat.get("new")
    assert new is not None and new.predecessor == "old" and new.link == "pi_directory"
    other = cat.get("other")
    assert other is not None and other.predecessor is None


def _edited_session() -> list[dict[str, Any]]:
    return [user("u1", None, "first"),
            msg("a1", "u1", "assistant", [{"type": "toolCall", "id": "call_1", "name": "bash",
                                           "arguments": {}}], stopReason="toolUse"),
            msg("t1", "a1", "toolResult", [{"type": "text", "text": "long output"}],
                toolCallId="call_1"),
            msg("a2", "t1", "assistant", [{"type": "text", "text": "done"}], stopReason="stop"),
            user("u2", "a2", "second"),
            {"type": "usage", "id": "w1", "parentId": "u2", "kind": "cache_warm"},
            {"type": "context_edit", "id": "e1", "parentId": "w1", "targetId": "t1",
             "replacement": {"content": "pruned"}},
            {"type": "context_edit", "id": "e2", "parentId": "e1", "targetId": "a2",
             "replacement": None},
            # Pi could not have written these: they stay nodes that change nothing.
            {"type": "context_edit", "id": "e3", "parentId": "e2", "targetId": "u1",
             "replacement": {"text": "no content field"}},
            {"type": "context_edit", "id": "e4", "parentId": "e3", "replacement": None},
            msg("a3", "e4", "assistant", [{"type": "text", "text": "third"}],
                stopReason="stop")]


def test_context_edits_shape_the_view_and_the_tail() -> None:
    cat, _store = _catalog(_edited_session())
    context = cat.context("s")
    assert context == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "content": "pruned", "tool_call_id": "call_1"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "third"}]
    tail = cat.tail("s", 3)
    assert [t.entry_id for t in tail] == ["t1", "u2", "a3"]  # a2 left the context
    assert tail[0].messages[0]["content"] == "pruned"


def test_edits_outside_the_kept_range_do_not_apply() -> None:
    objs = _edited_session()
    # A compaction after everything, keeping from u2: the edits are kept (after u2), their
    # targets t1 and a2 are not, so nothing they say shows.
    objs.append({"type": "compaction", "id": "c1", "parentId": "a3", "summary": "S",
                 "firstKeptEntryId": "u2"})
    plan = view.context_plan(view.active_branch(MemStore(objs).entries()).entries)
    assert [e.id for e in plan.entries] == ["u2", "a3"]
    assert dict(plan.edits) == {}


def test_an_openclaw_prefix_skips_a_text_block_whose_text_is_not_a_string() -> None:
    obj = user("u0", None, "unused")
    obj["message"]["content"] = [{"type": "text", "text": 7}, {"type": "text", "text": "go"}]
    out = render([Source("message", obj, 1796004000.0)],
                 RenderOptions(flavor="openclaw", tz=timezone(timedelta(hours=1), "CET")))
    assert out[0]["content"] == [{"type": "text", "text": 7},
                                 {"type": "text", "text": "[Mon 2026-11-30 03:00 CET] go"}]
