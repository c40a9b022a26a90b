"""A session's pins as its first read finds them: the user messages alone are rendered
unless one of them points back (``!pin ^`` with ``pin_assistant``), and the pins are always
those of every message of every segment, read in full (the oracle, ``pins_in`` over the whole
tail as the catalog renders it)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from proxy.floor.pin_index import PinIndex
from proxy.floor.pins import pins_in
from proxy.policy.records import Policy
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.entries import Entry
from proxy.transcripts.records import SessionInfo
from proxy.wire.content import message_text
from tests.floor.synthetic import MemoryStore, Transcript

USER_TEXTS = ["!pin keep the API stable", "📌 no new dependencies", "!pin ^", "  !PIN ^ ",
              "!unpin", "!unpin keep the API", "what next?", "[Mon 2026-11-30 02:27 UTC] !pin ^",
              "!pin ^ and more", "thanks"]


class CountingStore(MemoryStore):
    def __init__(self, objs: list[dict[str, Any]]) -> None:
        super().__init__(objs)
        self.loaded: list[Entry] = []

    def load(self, entries: Sequence[Entry]) -> list[Mapping[str, Any] | None]:
        self.loaded += entries
        return super().load(entries)


def _session(rng: random.Random, sid: str) -> Transcript:
    t = Transcript(sid)
    for turn in range(rng.randint(1, 25)):
        t.user(rng.choice(USER_TEXTS) if rng.random() < 0.5 else f"turn {turn}")
        if rng.random() < 0.3:
            _entry, ids = t.tool_calls(["bash"])
            t.tool_result(ids[0], "ok")
        t.assistant(f"answer {turn}" if rng.random() < 0.8 else "📌 an assistant's marker")
        if rng.random() < 0.05:
            t.reset()
    return t


def _catalog(t: Transcript) -> tuple[Catalog, CountingStore]:
    catalog = Catalog()
    store = CountingStore(t.objs)
    info = SessionInfo(session_id=t.session_id, source="pi", era="pi", location="mem",
                       agent_id="pi", group="dir")
    catalog.put(info, store, store.read_window(None))
    return catalog, store


def _oracle(catalog: Catalog, sid: str, policy: Policy) -> Any:
    record = catalog.full(sid)
    assert record is not None
    k = record.message_count + 8
    tails = [catalog.tail(sid, k, before=r.entry_id) for r in record.resets]
    tails.append(catalog.tail(sid, k))
    texts = [(m.entry_id, m.role, message_text(m.messages[0])) for tail in tails for m in tail
             if m.role in ("user", "assistant") and m.messages]
    return pins_in(texts, policy.pin_patterns, pin_assistant=policy.pin_assistant,
                   max_pinned=policy.max_pinned)


@pytest.mark.parametrize("pin_assistant", [False, True])
def test_the_first_read_finds_what_a_full_read_finds(pin_assistant: bool) -> None:
    rng = random.Random(11 if pin_assistant else 12)
    policy = replace(Policy(), pin_assistant=pin_assistant)
    for n in range(150):
        t = _session(rng, f"s{n}")
        catalog, store = _catalog(t)
        found = PinIndex(catalog).own(t.session_id, policy)
        read = {e.role for e in store.loaded}
        assert found == _oracle(_catalog(t)[0], t.session_id, policy), n
        users = [o["message"]["content"][0]["text"] for o in t.objs
                 if o["type"] == "message" and o["message"]["role"] == "user"]
        pointing = pin_assistant and any("^" in u for u in users)
        if not pointing:
            assert read <= {"user"}, n  # nothing but user messages was rendered


def test_a_pin_pointing_back_pins_the_assistant_message_before_it() -> None:
    t = Transcript("back")
    t.user("first")
    t.assistant("use tabs, never spaces")
    t.user("!pin ^")
    t.assistant("noted")
    catalog, store = _catalog(t)
    policy = replace(Policy(), pin_assistant=True)
    found = PinIndex(catalog).own(t.session_id, policy)
    assert [p.text for p in found.pins] == ["use tabs, never spaces"]
    assert "assistant" in {e.role for e in store.loaded}
