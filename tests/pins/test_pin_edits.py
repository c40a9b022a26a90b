"""A Pi 1.x ``context_edit`` of a pinned message changes the pin: removed (``replacement:
null``) or rewritten to text no pin pattern matches, the pin ends; rewritten to text that
still pins, the pin holds the new text. Both when the edit is in the transcript on the first
read and when it is appended after the pin was read; an edit of another message changes
nothing.

The transcripts are written here in Pi's format (``context_edit`` with ``targetId`` and
``replacement``, as in tests/fixtures/transcripts/captures/pi16-02-overflow); the oracle is
the text of the messages that go upstream, compared with what the user wrote: from the
floor's decision body, and, through a real in-process tailfloor, the fake upstream's record.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.transcripts.catalog import Catalog
from proxy.wire.content import message_text
from tests.fake_upstream import FakeUpstream
from tests.floor.synthetic import (
    Transcript,
    chat,
    conversation,
    put,
    request_for,
    write_jsonl,
)
from tests.inprocess import InProcessProxy
from tests.pins.test_pins import NOTE, PIN, floor_of, pinned_session

NEW_PIN = "!pin Leave the database and the migrations alone; docs only today."
UNPINNED = "Leave the database alone, please."  # no marker: it pins no more


def edit(t: Transcript, target: str, replacement: str | None) -> str:
    """Append what Pi 1.x writes when it edits the context (after the current leaf)."""
    return t._add("context_edit", targetId=target,
                  replacement=None if replacement is None else {"content": replacement})


def pin_id(t: Transcript) -> str:
    return next(o["id"] for o in t.objs if o["type"] == "message"
                and o["message"]["content"][0].get("text") == PIN)


def compacted(t: Transcript) -> None:
    t.compaction("## Goal\nedit the docs", t.message_ids()[-5])
    t.user("after compaction")


def pins_sent(body: bytes) -> list[str]:
    """The texts after tailfloor's pin note in what goes upstream (empty: no pin message)."""
    for message in orjson.loads(body)["messages"]:
        text = message_text(message)
        if text.startswith(NOTE):
            return text[len(NOTE):].strip().split("\n\n")
    return []


# (what the edit writes, the pins the next request must carry)
CASES = [(None, []), (UNPINNED, []), (NEW_PIN, [NEW_PIN])]


@pytest.mark.parametrize(("replacement", "expected"), CASES)
def test_an_edit_on_the_first_read_is_applied(replacement: str | None,
                                              expected: list[str]) -> None:
    catalog = Catalog()
    t = pinned_session()
    edit(t, pin_id(t), replacement)
    compacted(t)
    put(catalog, t)
    decision = floor_of(catalog).decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(decision.body) == expected, decision.verdict
    assert PIN.encode() not in decision.body


@pytest.mark.parametrize(("replacement", "expected"), CASES)
def test_an_edit_appended_after_the_pin_was_read_is_applied(replacement: str | None,
                                                            expected: list[str]) -> None:
    catalog = Catalog()
    t = pinned_session()
    compacted(t)
    put(catalog, t)
    floor = floor_of(catalog)
    first = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(first.body) == [PIN], first.verdict  # read, and in force
    edit(t, pin_id(t), replacement)
    put(catalog, t)  # the reader saw the appended edit; no raw message was added
    again = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(again.body) == expected, again.verdict
    assert PIN.encode() not in again.body
    t.user("and one more turn")  # the incremental read after the edit keeps to it
    put(catalog, t)
    later = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(later.body) == expected, later.verdict


def test_a_removed_pin_still_raw_is_not_put_back() -> None:
    """The agent removed the pinned message from its context while it was still raw: the
    request lacks it, and tailfloor must not bring it back."""
    catalog = Catalog()
    t = pinned_session()
    put(catalog, t)
    floor = floor_of(catalog)
    held = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert "pinned" not in held.verdict and PIN.encode() in held.body  # raw, not added
    edit(t, pin_id(t), None)
    t.user("go on")
    put(catalog, t)
    body = request_for(catalog, t.session_id)
    assert PIN.encode() not in orjson.dumps(body)  # the agent no longer sends it
    decision = floor.decide(chat(body), {})
    assert PIN.encode() not in decision.body, decision.verdict


@pytest.mark.parametrize("appended", [False, True])
def test_an_edit_of_another_message_leaves_the_pin(appended: bool) -> None:
    catalog = Catalog()
    t = pinned_session()
    other = t.message_ids()[1]  # the assistant's "hi" before the pin
    if not appended:
        edit(t, other, None)
        edit(t, t.message_ids()[0], "Hello again.")
    compacted(t)
    put(catalog, t)
    floor = floor_of(catalog)
    first = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(first.body) == [PIN], first.verdict
    if appended:
        edit(t, other, None)
        edit(t, t.message_ids()[0], "Hello again.")
        put(catalog, t)
    again = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(again.body) == [PIN], again.verdict


def test_an_edited_unpin_is_read_again() -> None:
    """Pins are what the transcript shows the model: an ``!unpin`` the agent removed from
    its context unpins no more, whether the edit was read first or appended later."""
    catalog = Catalog()
    t = pinned_session()
    unpin = t.user("!unpin database")
    t.assistant("ok")
    compacted(t)
    put(catalog, t)
    floor = floor_of(catalog)
    assert pins_sent(floor.decide(chat(request_for(catalog, t.session_id)), {}).body) == []
    edit(t, unpin, None)
    put(catalog, t)
    decision = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(decision.body) == [PIN], decision.verdict


# ------------------------------------------------------- through tailfloor, the upstream's record
RULES = """[defaults]
mode = "enforce"
min_tail_messages = 6

[[models]]
pattern = "fake*"
context_window = 200000
encoding = "estimate"
margin = 0.0
"""


def _post(proxy: InProcessProxy, body: dict[str, Any]) -> None:
    raw = orjson.dumps({**body, "stream": False})
    request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=raw,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def _updated(proxy: InProcessProxy, session_id: str) -> float:
    with urllib.request.urlopen(proxy.admin_url + "/tailfloor/sessions", timeout=5) as r:
        listed = orjson.loads(r.read())["sessions"]
    return next((s.get("updated") or 0.0 for s in listed if s.get("session_id") == session_id),
                0.0)


def _append(path: Path, t: Transcript, since: int) -> None:
    with path.open("ab") as out:
        out.write(b"".join(orjson.dumps(o) + b"\n" for o in t.objs[since:]))


@contextmanager
def tailfloor_over(fake: FakeUpstream, tmp_path: Path, t: Transcript
                   ) -> Iterator[tuple[InProcessProxy, Path]]:
    """A real in-process tailfloor following ``t``, written as Pi's session file."""
    fake.reset()
    path = write_jsonl(tmp_path / "sessions", t)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "floor.toml").write_text(RULES)
    proxy = InProcessProxy(fake, "--sessions", str(tmp_path / "sessions"),
                           "--rules", str(tmp_path / "rules"))
    try:
        yield proxy, path
    finally:
        proxy.stop()


def append_and_wait(proxy: InProcessProxy, path: Path, t: Transcript, written: int,
                    seen: float) -> None:
    """Append what ``t`` holds past ``written`` and wait for tailfloor's watcher to read it."""
    _append(path, t, written)
    deadline = time.monotonic() + 10
    while _updated(proxy, t.session_id) <= seen:
        assert time.monotonic() < deadline, "the watcher never read what was appended"
        time.sleep(0.02)


def test_the_upstream_no_longer_gets_a_pin_removed_after_it_was_read(
        fake: FakeUpstream, tmp_path: Path) -> None:
    t = pinned_session("01a22a55-0000-7000-8000-0000000e0d17")
    compacted(t)
    mirror = Catalog()  # what the agent sends: its own context of the same transcript
    with tailfloor_over(fake, tmp_path, t) as (proxy, path):
        put(mirror, t)
        _post(proxy, request_for(mirror, t.session_id))
        assert pins_sent(fake.chat_requests()[-1].body) == [PIN]
        seen, written = _updated(proxy, t.session_id), len(t.objs)
        edit(t, pin_id(t), None)
        append_and_wait(proxy, path, t, written, seen)
        put(mirror, t)
        _post(proxy, request_for(mirror, t.session_id))
        sent = fake.chat_requests()[-1].body
        assert pins_sent(sent) == [] and PIN.encode() not in sent


@pytest.mark.parametrize("appended", [False, True])
def test_a_pinned_assistant_message_removed_ends_its_pin(appended: bool) -> None:
    """``!pin ^`` names the assistant message right before it; once an edit removed that
    message, the pin ends, and does not move to an older assistant message."""
    catalog = Catalog()
    t = Transcript("bbbb2222-pa")
    t.user("Plan the release.")
    t.assistant("An older answer that nobody pinned.")
    t.user("And the order?")
    plan = t.assistant("Plan: docs first, then the tag, then the announcement.")
    t.user("!pin ^")
    t.assistant("pinned")
    conversation(t, 20)
    if not appended:
        edit(t, plan, None)
    compacted(t)
    put(catalog, t)
    floor = floor_of(catalog, pin_assistant=True)
    first = floor.decide(chat(request_for(catalog, t.session_id)), {})
    if appended:
        assert pins_sent(first.body) == [
            "Plan: docs first, then the tag, then the announcement."], first.verdict
        edit(t, plan, None)
        put(catalog, t)
        first = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(first.body) == [], first.verdict


class EditDuringRead:
    """The catalog, appending an edit that removes ``target()`` (as the watcher would) to
    the transcript right after the first tail read that ``when(k, kwargs)`` picks."""

    def __init__(self, catalog: Catalog, t: Transcript, store: Any,
                 when: Callable[[int, dict[str, Any]], bool],
                 target: Callable[[], str]) -> None:
        self.catalog, self.t, self.store = catalog, t, store
        self.when, self.target = when, target
        self.appended: list[str] = []

    def tail(self, session_id: str, k: int, *args: Any, **kwargs: Any) -> Any:
        found = self.catalog.tail(session_id, k, *args, **kwargs)
        if not self.appended and self.when(k, kwargs):
            written = len(self.t.objs)
            self.appended.append(edit(self.t, self.target(), None))
            self.catalog.append(self.t.session_id, self.store.entries()[written:])
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.catalog, name)


def test_an_edit_appended_while_the_pins_are_first_read_is_applied_next() -> None:
    """The watcher appends an edit removing the pin while its session's first read is under
    way (a long transcript's takes a while): the next request reads the pins again and the
    pin is gone, rather than the read's result being kept as if it had seen the edit."""
    from proxy.floor.pin_index import PinIndex
    from proxy.policy.records import Policy
    from tests.floor.synthetic import MemoryStore

    catalog = Catalog()
    t = pinned_session()
    store: MemoryStore = put(catalog, t)
    # the read of every message, not a probe (of the newest, of the window's rewrites)
    during = EditDuringRead(catalog, t, store,
                            lambda k, kwargs: k > 1 and not kwargs.get("window_only"),
                            lambda: pin_id(t))
    index = PinIndex(during)  # type: ignore[arg-type]
    assert [p.text for p in index.own(t.session_id, Policy()).pins] == [PIN]  # read before
    assert during.appended and index.own(t.session_id, Policy()).pins == ()


@pytest.mark.parametrize("which", ["new", "old"])
def test_an_edit_appended_while_new_messages_are_read_is_applied_next(which: str) -> None:
    """After the first read, the user pins again; while the index reads the new messages
    the watcher appends an edit removing a pin (the new one, or the one read before): the
    next request no longer carries it."""
    from proxy.floor.pin_index import PinIndex
    from proxy.policy.records import Policy
    from tests.floor.synthetic import MemoryStore

    catalog = Catalog()
    t = pinned_session()
    store: MemoryStore = put(catalog, t)
    during = EditDuringRead(catalog, t, store,
                            lambda _k, kwargs: armed and bool(kwargs.get("window_only")),
                            lambda: new_pin if which == "new" else pin_id(t))
    index, armed = PinIndex(during), False  # type: ignore[arg-type]
    assert [p.text for p in index.own(t.session_id, Policy()).pins] == [PIN]
    written = len(t.objs)
    new_pin = t.user("!pin and the changelog too")
    t.assistant("ok")
    catalog.append(t.session_id, store.entries()[written:])
    armed = True
    assert [p.text for p in index.own(t.session_id, Policy()).pins] == [
        PIN, "!pin and the changelog too"]  # read before the edit came
    assert during.appended
    left = [PIN] if which == "new" else ["!pin and the changelog too"]
    assert [p.text for p in index.own(t.session_id, Policy()).pins] == left


@pytest.mark.parametrize("appended", [False, True])
def test_an_edit_that_makes_an_older_message_a_pin_is_applied(appended: bool) -> None:
    """The edit rewrites a plain user message read long before: the pin it makes holds, in
    transcript order, whether the edit was there on the first read or came after it."""
    catalog = Catalog()
    t = pinned_session()
    plain = t.message_ids()[0]  # "Hello, a first turn."
    if not appended:
        edit(t, plain, NEW_PIN)
    compacted(t)
    put(catalog, t)
    floor = floor_of(catalog)
    first = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(first.body) == ([PIN] if appended else [NEW_PIN, PIN]), first.verdict
    if appended:
        edit(t, plain, NEW_PIN)
        put(catalog, t)
    again = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(again.body) == [NEW_PIN, PIN], again.verdict  # as a first read has it
    t.user("and one more turn")
    put(catalog, t)
    later = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(later.body) == [NEW_PIN, PIN], later.verdict
