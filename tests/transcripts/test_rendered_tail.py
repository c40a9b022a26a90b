"""Renderings of tail messages kept between requests: the same messages as a fresh read,
never a stale one (a replaced store, a later context edit, other render options), within
their byte budget, and (but for the few decoded last) out of the garbage collector's walks."""

from __future__ import annotations

import dataclasses
import functools
import gc
import random
import threading
import tracemalloc
import weakref
from collections.abc import Mapping, Sequence
from datetime import UTC, timedelta, timezone
from typing import Any

import orjson
import pytest

from proxy.transcripts import render_cache
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.entries import Entry
from proxy.transcripts.records import SessionInfo, TailMessage, Window
from proxy.transcripts.render import RenderOptions
from proxy.transcripts.render_cache import HOT, RenderedTail
from proxy.transcripts.tracker import Tracker
from tests.transcripts.conftest import CAPTURES
from tests.transcripts.test_views import MemStore, conversation, msg, user


class CountingStore(MemStore):
    def __init__(self, objs: Sequence[dict[str, Any]]) -> None:
        super().__init__(objs)
        self.loaded = 0

    def load(self, entries: Sequence[Entry]) -> list[Mapping[str, Any] | None]:
        self.loaded += len(entries)
        return super().load(entries)


def _put(cat: Catalog, store: MemStore, sid: str = "s") -> None:
    cat.put(SessionInfo(sid, "pi", "pi", "mem"), store, Window(store.entries(), True))


def _wire(tail: list[TailMessage]) -> list[tuple[str, tuple[dict[str, Any], ...]]]:
    return [(t.entry_id, t.messages) for t in tail]


def test_a_second_tail_is_served_without_reading_the_store_again() -> None:
    cat, store = Catalog(), CountingStore(conversation(20))
    _put(cat, store)
    first = cat.tail("s", 12)
    assert store.loaded == 12
    again = cat.tail("s", 12)
    assert store.loaded == 12 and _wire(again) == _wire(first)
    # A fresh catalog over the same transcript (nothing kept) renders the very same.
    fresh = Catalog()
    _put(fresh, MemStore(conversation(20)))
    assert _wire(fresh.tail("s", 12)) == _wire(first)
    cat.tail("s", 14)  # two older entries more: only they are read
    assert store.loaded == 14


def test_a_replaced_store_is_read_again() -> None:
    cat = Catalog()
    _put(cat, CountingStore(conversation(4)))
    before = cat.tail("s", 2)
    rewritten = conversation(4)
    rewritten[-1]["message"]["content"] = [{"type": "text", "text": "rewritten answer"}]
    replacement = CountingStore(rewritten)  # same ids and positions, another object
    _put(cat, replacement)
    after = cat.tail("s", 2)
    assert replacement.loaded == 2
    assert before[-1].messages[0]["content"] == "answer 3"
    assert after[-1].messages[0]["content"] == "rewritten answer"


def test_a_later_context_edit_changes_the_kept_rendering() -> None:
    objs = [user("u1", None, "first"),
            msg("a1", "u1", "assistant", [{"type": "toolCall", "id": "call_1", "name": "bash",
                                           "arguments": {}}], stopReason="toolUse"),
            msg("t1", "a1", "toolResult", [{"type": "text", "text": "long output"}],
                toolCallId="call_1"),
            user("u2", "t1", "second")]
    cat, store = Catalog(), CountingStore(objs)
    _put(cat, store)
    assert cat.tail("s", 2)[0].messages[0]["content"] == "long output"
    edit = {"type": "context_edit", "id": "e1", "parentId": "u2", "targetId": "t1",
            "replacement": {"content": "pruned"}}
    grown = CountingStore([*objs, edit])
    cat.append("s", grown.entries()[len(objs):])
    # The catalog's store is still the first object: it reads the edit from there.
    store.objs.append(edit)
    tail = cat.tail("s", 2)
    assert [t.entry_id for t in tail] == ["t1", "u2"]
    assert tail[0].messages[0]["content"] == "pruned"


def test_render_options_are_part_of_what_is_kept() -> None:
    kept = RenderedTail()
    store = MemStore(conversation(1))
    entry = store.entries()[0]
    message = TailMessage(entry.id, entry.timestamp, "user", store.objs[0],
                          ({"role": "user", "content": "question 0"},))
    kept.put(store, entry, None, RenderOptions(flavor="pi"), message)
    assert kept.get(store, entry, None, RenderOptions(flavor="pi")) == message
    assert kept.get(store, entry, None, RenderOptions(flavor="openclaw")) is None
    assert kept.get(MemStore(conversation(1)), entry, None, RenderOptions()) is None
    # Every field of the options counts (an OpenClaw user text is stamped in its zone).
    fields = {f.name for f in dataclasses.fields(RenderOptions)}
    assert fields == {"flavor", "tz"}, "a new render option must be part of the cache key"
    east = RenderOptions(flavor="pi", tz=timezone(timedelta(hours=9)))
    assert kept.get(store, entry, None, east) is None
    assert kept.get(store, entry, None, RenderOptions(flavor="pi", tz=UTC)) == message


def test_the_byte_budget_holds_and_the_least_recent_goes_first() -> None:
    kept = RenderedTail(max_bytes=16 * 1024)
    store = MemStore([user(f"u{i}", None, "x" * 700) for i in range(40)])
    entries = store.entries()

    def put(i: int) -> None:
        message = TailMessage(entries[i].id, None, "user", store.objs[i], ())
        kept.put(store, entries[i], None, RenderOptions(), message)

    for i in range(40):
        put(i)
        put(i)  # again: replaced in place
        assert kept.bytes <= kept.max_bytes
        # what was added and taken off for rows put, replaced and dropped is what is kept
        assert kept.bytes == sum(render_cache._cost(row[3], key)
                                 for key, row in kept._kept.items())
    assert kept.get(store, entries[39], None, RenderOptions()) is not None
    assert kept.get(store, entries[0], None, RenderOptions()) is None
    survivors = [i for i in range(40) if kept.get(store, entries[i], None, RenderOptions())]
    assert survivors == list(range(40 - len(survivors), 40)) and 4 < len(survivors) < 40
    huge = MemStore([user("big", None, "y" * 4096)])
    before = kept.bytes
    kept.put(huge, huge.entries()[0], None, RenderOptions(),
             TailMessage("big", None, "user", huge.objs[0], ()))
    assert kept.get(huge, huge.entries()[0], None, RenderOptions()) is None
    assert kept.bytes == before


def test_worker_threads_share_it_safely() -> None:
    cat, store = Catalog(), CountingStore(conversation(60))
    _put(cat, store)
    expected = _wire(Catalog.tail(cat, "s", 40))
    results: list[Any] = []

    def worker() -> None:
        for k in (10, 40, 25, 40):
            results.append((k, _wire(cat.tail("s", k))))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got == expected[-k:] for k, got in results)


def test_a_row_nested_too_deep_to_measure_is_served_but_not_kept() -> None:
    deep: Any = "leaf"
    for _ in range(300):
        deep = {"d": deep}
    cat, store = Catalog(), CountingStore([user("u1", None, "first"),
                                           msg("a1", "u1", "assistant",
                                               [{"type": "text", "text": "ok"}],
                                               stopReason="stop", model=deep)])
    _put(cat, store)
    assert [t.entry_id for t in cat.tail("s", 2)] == ["u1", "a1"]
    cat.tail("s", 2)
    assert store.loaded == 3  # u1 kept, a1 read again


def test_what_is_kept_is_not_walked_by_the_garbage_collector(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A full collection walks every tracked object; a thousand agents' kept renderings as
    # dicts and lists made it hold the interpreter for half a second.
    monkeypatch.setattr(render_cache, "HOT", 0)  # none held decoded
    store = MemStore([user(f"u{i}", None, f"question {i}") for i in range(2000)])
    entries = store.entries()
    kept = RenderedTail(max_bytes=64 * 1024 * 1024, max_entries=10_000)
    messages = [TailMessage(e.id, 1.0, "user", store.objs[i],
                            ({"role": "user", "content": [{"type": "text", "text": "q"}]},))
                for i, e in enumerate(entries)]
    gc.collect()
    before = len(gc.get_objects())
    for entry, message in zip(entries, messages, strict=True):
        kept.put(store, entry, None, RenderOptions(), message)
    del messages
    gc.collect()
    assert len(gc.get_objects()) - before < 50  # 2,000 kept, none of them tracked
    assert kept.get(store, entries[7], None, RenderOptions()) == TailMessage(
        "u7", 1.0, "user", store.objs[7],
        ({"role": "user", "content": [{"type": "text", "text": "q"}]},))


def test_renderings_decoded_again_are_held_as_objects_only_a_few_at_a_time() -> None:
    store = MemStore([user(f"u{i}", None, f"question {i}") for i in range(3 * HOT)])
    entries = store.entries()
    kept = RenderedTail(max_bytes=64 * 1024 * 1024, max_entries=10 * HOT)
    for i, e in enumerate(entries):
        kept.put(store, e, None, RenderOptions(),
                 TailMessage(e.id, 1.0, "user", store.objs[i],
                             ({"role": "user", "content": [{"type": "text", "text": "q"}]},)))
    gc.collect()
    before = len(gc.get_objects())
    got = kept.get_many(store, entries, {}, RenderOptions())
    assert [m.entry_id for m in got if m is not None] == [e.id for e in entries]
    del got
    gc.collect()
    # A message decoded is a handful of objects: the last HOT of them stay, no more.
    assert len(gc.get_objects()) - before < 8 * HOT


@pytest.mark.parametrize("depth", [6, 30])
def test_the_recorded_transcripts_come_back_as_read(monkeypatch: pytest.MonkeyPatch,
                                                    depth: int) -> None:
    # Kept as JSON and decoded on a hit: every real message must come back equal to a fresh
    # read and rendering of it (no tuple made a list, no value changed on the way).
    monkeypatch.setattr(render_cache, "HOT", 0)  # every hit decoded
    def scanned() -> Catalog:
        catalog = Catalog()
        Tracker([CAPTURES], catalog, lambda *_p: None, scan_workers="0").scan()
        return catalog

    warm = scanned()
    sessions = [r.info.session_id for r in warm.sessions()]
    assert len(sessions) >= 5
    for sid in sessions:
        warm.tail(sid, depth)
    cold = scanned()
    for sid in sessions:
        # By repr: equal values of other types (1 and 1.0, True and 1, a tuple and a list)
        # would compare equal.
        assert repr(warm.tail(sid, depth)) == repr(cold.tail(sid, depth))


def test_a_store_is_let_go_with_its_last_kept_rendering() -> None:
    kept = RenderedTail(max_entries=4)
    first = MemStore(conversation(2))
    gone = weakref.ref(first)
    for entry, obj in zip(first.entries(), first.objs, strict=True):
        kept.put(first, entry, None, RenderOptions(), TailMessage(entry.id, None, "user", obj, ()))
    del first, entry, obj
    others = [MemStore(conversation(1)) for _ in range(4)]
    for store in others:
        entry = store.entries()[0]
        kept.put(store, entry, None, RenderOptions(),
                 TailMessage(entry.id, None, "user", store.objs[0], ()))
    gc.collect()
    assert gone() is None
    assert all(kept.get(s, s.entries()[0], None, RenderOptions()) is not None for s in others)


def test_a_kept_rendering_costs_about_its_json_and_no_more() -> None:
    # orjson's answer keeps the room it was written in (4 KB and more for a short message):
    # kept as it came, 2,000 renderings of ~300 bytes took some 8 MB instead of 1.
    store = MemStore([user(f"u{i}", None, f"question {i} " + "w" * 200) for i in range(2000)])
    entries = store.entries()
    messages = [TailMessage(e.id, 1.0, "user", store.objs[i],
                            ({"role": "user", "content": store.objs[i]["message"]["content"]},))
                for i, e in enumerate(entries)]
    json_bytes = sum(len(orjson.dumps([m.framing, m.messages])) for m in messages)
    kept = RenderedTail(max_bytes=64 * 1024 * 1024, max_entries=10_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for entry, message in zip(entries, messages, strict=True):
            kept.put(store, entry, None, RenderOptions(), message)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < json_bytes + 2000 * 400  # the JSON, and a key and a row for each


@pytest.mark.parametrize(("texts", "edited"), [
    ([2] * 5000, False), ([400] * 3000, False), ([3000] * 1000, False),
    ([1, 30, 200, 900, 2500] * 800, False), ([2, 400, 3000] * 1000, True)])
def test_the_bytes_counted_are_the_memory_the_renderings_hold(texts: list[int],
                                                              edited: bool) -> None:
    # Counted in their transcript lines' bytes, an agent's short lines held 1.4 to 2.9 times
    # what the budget said. The oracle: what the process gets back when the cache goes.
    rng = random.Random(len(texts) + texts[0])

    def fresh_id() -> str:
        return f"{rng.getrandbits(128):032x}"[:rng.choice((8, 32))]

    # A full collection first: it empties the interpreter's free lists of tuples, floats
    # and dicts, whose blocks, made before the trace, would be reused untraced (an earlier
    # test that freed its rows made this one read 20% low). The later ones give the rows
    # freed with the cache back for the same reason.
    gc.collect()
    tracemalloc.start()
    try:
        store = MemStore([user(fresh_id(), None, "x" * n) for n in texts])
        kept = RenderedTail(max_bytes=1 << 30, max_entries=1 << 20)
        for i, parsed in enumerate(store.entries()):
            line = len(orjson.dumps(store.objs[i])) + 1
            # The id a fresh object, as an unpacked window's entry has: the cache keeps it.
            entry = dataclasses.replace(parsed, id=parsed.id.encode().decode(), size=line)
            edit = (dataclasses.replace(entry, id=fresh_id(), pos=10**6 + i, size=line)
                    if edited else None)
            kept.put(store, entry, edit, RenderOptions(), TailMessage(
                entry.id, 1.5 + i, "user", {"message": {"role": "user"}},
                ({"role": "user", "content": store.objs[i]["message"]["content"]},)))
        del entry, parsed, edit
        gc.collect()
        with_cache = tracemalloc.get_traced_memory()[0]
        counted, rows = kept.bytes, len(kept)
        del kept
        gc.collect()
        held = with_cache - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert rows == len(texts)
    # within what the map's table (a power of two) adds or spares at one count or another
    assert 0.85 * counted <= held <= 1.1 * counted


def test_a_long_tail_read_again_is_served_decoded_until_its_row_changes() -> None:
    n = render_cache.HEAT_FROM + 6
    store = MemStore([user(f"u{i}", None, f"question {i}") for i in range(n)])
    entries = store.entries()
    kept = RenderedTail()

    def message(i: int, text: str) -> TailMessage:
        return TailMessage(entries[i].id, None, "user", store.objs[i],
                           ({"role": "user", "content": text},))

    for i in range(n):
        kept.put(store, entries[i], None, RenderOptions(), message(i, f"question {i}"))
    first = kept.get_many(store, entries, {}, RenderOptions())
    again = kept.get_many(store, entries, {}, RenderOptions())
    assert all(a is b for a, b in zip(first, again, strict=True))  # not decoded again
    kept.put(store, entries[3], None, RenderOptions(), message(3, "rewritten"))
    after = kept.get_many(store, entries, {}, RenderOptions())
    assert after[3] is not None and after[3].messages[0]["content"] == "rewritten"
    assert after[4] is again[4]


def test_a_line_too_large_to_keep_is_not_written_as_json(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Such a line is read again every request: writing its JSON first, only to refuse it,
    # cost 24 ms a request for an 8 MB message.
    written: list[object] = []
    dumps = orjson.dumps
    monkeypatch.setattr(orjson, "dumps", lambda value, *a, **k: (written.append(value),
                                                                  dumps(value, *a, **k))[1])
    kept = RenderedTail(max_bytes=64 * 1024)
    store = MemStore([user("big", None, "y" * 100)])
    entry = dataclasses.replace(store.entries()[0], size=9 * 1024)
    kept.put(store, entry, None, RenderOptions(),
             TailMessage("big", None, "user", store.objs[0], ()))
    assert written == [] and kept.get(store, entry, None, RenderOptions()) is None
    small = store.entries()[0]
    kept.put(store, small, None, RenderOptions(),
             TailMessage("big", None, "user", store.objs[0], ()))
    assert len(written) == 1 and kept.get(store, small, None, RenderOptions()) is not None


def test_a_kept_rendering_holds_the_framing_of_its_object_not_its_content() -> None:
    objs = conversation(6)
    for obj in objs:  # what a transcript's object has besides what renders: usage, content
        obj["message"].update(usage={"input": 1234, "output": 56}, provider="anthropic",
                              model="claude-x", api="messages")
    cat, store = Catalog(), CountingStore(objs)
    _put(cat, store)
    first = cat.tail("s", 6)
    again = cat.tail("s", 6)  # kept: not read from the store again
    assert store.loaded == 6 and again == first
    by_id = {obj["id"]: obj for obj in objs}
    for tail in first:
        inner = by_id[tail.entry_id]["message"]
        assert tail.framing == {"message": {k: inner[k] for k in
                                            ("role", "timestamp", "provider", "model")
                                            if k in inner}}
    kept = sum(len(row[3]) for row in cat.rendered._kept.values())
    assert kept < sum(len(orjson.dumps(t.messages)) for t in first) + 6 * 120


def _parts(n: int) -> list[dict[str, str]]:
    return [{"type": "text", "text": "a"} for _ in range(n)]


# Shapes a transcript can hold, the real ones and hostile ones that decode to many times
# their JSON: thousands of tiny parts, of empty lists, of floats, of short non-ASCII strings.
SHAPES: dict[str, list[Any]] = {
    "tiny parts": [{}, [{"role": "user", "content": _parts(2000)}]],
    "empty lists": [{}, [{"role": "user", "content": "x", "x": [[] for _ in range(5000)]}]],
    "floats": [{}, [{"role": "user", "content": "x", "n": [i + 0.5 for i in range(5000)]}]],
    "short strings": [{}, [{"role": "user", "content": "x", "s": [chr(233 + i % 50)
                                                                  for i in range(5000)]}]],
    "long text": [{}, [{"role": "user", "content": "y" * 100_000}]],
    # one character makes the whole string 2 or 4 bytes a character
    "long text, one past U+00FF": [{}, [{"role": "user", "content": "y" * 100_000 + "Ā"}]],
    "long text, one emoji": [{}, [{"role": "user", "content": "y" * 100_000 + "\U0001f600"}]],
    "CJK text": [{}, [{"role": "user", "content": "文字" * 30_000}]],
    # a key past 64 bytes is not shared between dicts
    "long keys": [{}, [{"role": "user", "content": "x", "d": [{"k" * 65: 1.5}] * 2000}]],
    "nested long keys": [{}, [functools.reduce(lambda inner, _i: {"k" * 65: inner},
                                               range(200), 1.5)]],
}


def _memory_of(make: Any) -> tuple[int, Any]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        made = make()
        return tracemalloc.get_traced_memory()[0] - before, made
    finally:
        tracemalloc.stop()


def test_the_decoded_memory_is_reckoned_from_above() -> None:
    blobs = {name: orjson.dumps(value) for name, value in SHAPES.items()}
    catalog = Catalog()
    Tracker([CAPTURES], catalog, lambda *_p: None, scan_workers="0").scan()
    blobs["recorded transcripts"] = b"".join(  # measured one by one, summed below
        orjson.dumps([t.framing, t.messages]) + b"\n"
        for r in catalog.sessions() for t in catalog.tail(r.info.session_id, 400))
    for name, blob in blobs.items():
        pieces = blob.splitlines() if name == "recorded transcripts" else [blob]
        held, _decoded = _memory_of(lambda p=pieces: [orjson.loads(b) for b in p])
        reckoned = sum(render_cache._decoded_cost(b) for b in pieces)
        # from above, and not so far above that the real ones get little room
        assert held <= reckoned <= 3.2 * held, (name, held, reckoned)


def test_renderings_held_decoded_stay_within_their_memory_bound() -> None:
    n = 200
    store = MemStore([user(f"u{i}", None, f"question {i}") for i in range(n)])
    entries = store.entries()
    bound = 1024 * 1024
    kept = RenderedTail(max_bytes=64 * 1024 * 1024, max_entries=10 * n,
                        max_decoded_bytes=bound)
    for i, entry in enumerate(entries):
        # ~5 KB of JSON that decodes to ~60 KB: all 200 held decoded would be ~12 MB
        kept.put(store, entry, None, RenderOptions(), TailMessage(
            entry.id, None, "user", store.objs[i], ({"role": "user", "content": _parts(200)},)))
    # what stays decoded once the request is done with its tail
    held, _ = _memory_of(lambda: kept.get_many(store, entries, {}, RenderOptions()).clear())
    assert 0 < kept.decoded_bytes <= bound
    assert held <= bound
    def twice(entry: Entry) -> tuple[TailMessage | None, TailMessage | None]:
        return (kept.get(store, entry, None, RenderOptions()),
                kept.get(store, entry, None, RenderOptions()))

    newest, oldest = twice(entries[-1]), twice(entries[0])
    assert newest[0] is not None and newest[0] is newest[1]  # held decoded
    assert oldest[0] is not None and oldest[0] is not oldest[1]  # let go: decoded each time
