"""The user-text prefix is learned from the request, not assumed from the proxy's timezone."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from proxy.floor.style import Prefix, learn_prefix, restyle
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import Holder, Transcript, chat, conversation, put, request_for, rules

TS = datetime(2026, 11, 30, 2, 27, 40, tzinfo=UTC).timestamp()
PREFIX = re.compile(r"^\[(\w{3} \d{4}-\d{2}-\d{2} \d{2}:\d{2})(?: ([^\]]+))?\] ")


def test_offset_and_label_are_learned() -> None:
    shown = {"role": "user", "content": "[Mon 2026-11-30 03:27 GMT+1] hi"}
    rule = learn_prefix([shown], [TS])
    assert rule == Prefix(60, "GMT+1")
    assert rule.render(TS) == "[Mon 2026-11-30 03:27 GMT+1] "
    assert learn_prefix([{"role": "user", "content": "hi"}], [TS]) == Prefix(None)
    bare = restyle([{"role": "user", "content": "[Mon 2026-11-30 02:27 UTC] hi"}], [TS],
                   Prefix(None))
    assert bare == [{"role": "user", "content": "hi"}]


def shift(message: dict[str, Any], hours: int, label: str) -> dict[str, Any]:
    text = message["content"][0]["text"]
    found = PREFIX.match(text)
    if found is None:
        return message
    when = datetime.strptime(found.group(1)[4:], "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    moved = datetime.fromtimestamp(when.timestamp() + hours * 3600, UTC)
    new = moved.strftime(f"[%a %Y-%m-%d %H:%M {label}] ") + text[found.end():]
    return {**message, "content": [{"type": "text", "text": new}]}


def compacted_east(session_id: str, kept: int, **turns: Any) -> tuple[Catalog, Transcript,
                                                                    dict[str, Any]]:
    """An OpenClaw session compacted before its last ``kept`` messages, and the request its
    agent sends from two hours east of the proxy."""
    catalog = Catalog()
    t = Transcript(session_id)
    conversation(t, 12, **turns)
    t.compaction("## Goal\nsummary", t.message_ids()[-kept])
    t.user("now")
    put(catalog, t, source="openclaw-sqlite", agent_id="main", session_key="agent:main:main")
    body = request_for(catalog, t.session_id)
    body["messages"] = [body["messages"][0], body["messages"][1]] + [
        shift(m, 2, "EET") if m["role"] == "user" else m for m in body["messages"][2:]]
    return catalog, t, body


def test_restored_messages_take_the_request_timezone() -> None:
    catalog, t, body = compacted_east("tz-session-1", 4)
    rewriter = FloorHarness(Holder(rules(n=10)), TokenCounter(), catalog)
    decision = rewriter.decide(chat(body), {})
    assert decision.kind == "floor"
    users = [m["content"][0]["text"] for m in decision.added if m["role"] == "user"]
    assert users and all(PREFIX.match(u) and " EET] " in u for u in users)
    # Same instants as the catalog's UTC rendering, two hours later on the clock.
    plain = FloorHarness(Holder(rules(n=10)), TokenCounter(), catalog).decide(
        chat(request_for(catalog, t.session_id)), {})
    utc = [m["content"][0]["text"] for m in plain.added if m["role"] == "user"]
    assert [shift({"content": [{"text": u}]}, 2, "EET")["content"][0]["text"] for u in utc] \
        == users


class RecordingCatalog:
    """The catalog, with what each of its tails returned."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self.tails: list[tuple[int, list[str]]] = []

    def tail(self, session_id: str, k: int, *args: Any, **kwargs: Any) -> Any:
        found = self._catalog.tail(session_id, k, *args, **kwargs)
        self.tails.append((k, [m.role for m in found]))
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._catalog, name)


def test_the_prefix_is_learned_from_the_user_side_of_the_newest_messages_alone() -> None:
    # the newest messages: mostly tools'
    catalog, _t, body = compacted_east("tz-session-2", 6, tools_every=1, parallel=2)
    recording = RecordingCatalog(catalog)
    decision = FloorHarness(Holder(rules(n=10)), TokenCounter(), recording).decide(  # type: ignore[arg-type]
        chat(body), {})
    assert decision.kind == "floor"
    users = [m["content"][0]["text"] for m in decision.added if m["role"] == "user"]
    assert users and all(" EET] " in u for u in users)  # learned as before
    probes = [roles for k, roles in recording.tails if k == 6]
    assert probes and all(r == "user" for roles in probes for r in roles)
    assert all(roles for roles in probes)  # it did find the user messages among them
