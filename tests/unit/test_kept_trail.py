"""What the inspector keeps of a finished request (``KeptTrail``): no parsed message, yet the
same report as the request's own trail gives (``report_of``, the oracle), made when a page
asks."""

from __future__ import annotations

import gc
from typing import Any

import orjson

from proxy.chat import ChatRequest
from proxy.floor.decision import Decision, pass_through
from proxy.recovery.outcome import Compaction
from proxy.report import AGENT, Origin
from proxy.server.inspector_sink import KeptTrail
from proxy.server.outgoing import Outgoing
from proxy.server.reports import report_of
from proxy.server.trail import Trail
from proxy.wire.anthropic import MESSAGES

RESTORED_FROM = Origin("restored", session="s0")
CLIENT: list[dict[str, Any]] = [{"role": "system", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "what did we say?"}]}]
RESTORED: list[dict[str, Any]] = [{"role": "user", "content": "the plan: ship on friday"},
            {"role": "assistant", "content": "noted", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "note", "arguments": "{\"a\": 1.5}"}}]}]


def _chat(messages: list[dict[str, Any]]) -> ChatRequest:
    raw = orjson.dumps({"model": "m", "stream": True, "messages": messages})
    return ChatRequest.parse(raw, orjson.loads(raw), "main")


def _reachable(root: object) -> set[int]:
    """The ids of every container reachable from ``root``."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (str, bytes, int, float, type)):
            continue
        seen.add(id(item))
        todo.extend(gc.get_referents(item))
    return seen


def _containers(*values: object) -> list[object]:
    """Every dict and list inside ``values``."""
    found: list[object] = []
    todo = list(values)
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            found.append(item)
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            if isinstance(item, list):
                found.append(item)
            todo.extend(item)
    return found


def _floor_trail() -> tuple[Trail, list[object]]:
    chat = _chat(CLIENT)
    restored = [dict(m) for m in RESTORED]
    sent = [chat.body["messages"][0], *restored, chat.body["messages"][1]]
    decision = Decision("floor", "floor; restored=2", orjson.dumps({**chat.body,
                                                                     "messages": sent}),
                        session_id="s1", messages=tuple(sent),
                        origins=(AGENT, RESTORED_FROM, RESTORED_FROM, AGENT),
                        added=tuple(restored), added_raw=2, added_tokens=40,
                        details={"dropped_units": [1, 2]})
    trail = Trail("r-1", chat, 10.0)
    trail.decision, trail.outgoing, trail.status = decision, Outgoing(decision), 200
    return trail, _containers(chat.body, sent, decision.details)


def test_a_floor_rewrite_keeps_no_parsed_message_and_reports_the_same() -> None:
    trail, parsed = _floor_trail()
    kept = KeptTrail(trail, 0.25)
    reachable = _reachable(kept)
    assert parsed and not [c for c in parsed if id(c) in reachable]
    report = kept()
    assert report == report_of(trail, 0.25)
    assert report.messages == (CLIENT[0], *RESTORED, CLIENT[1])
    assert report.origins == (AGENT, RESTORED_FROM, RESTORED_FROM, AGENT)
    assert (report.floor_kind, report.restored, report.session_id) == ("floor", 2, "s1")


def test_a_compacted_rewrite_and_a_shadow_decision_report_the_same() -> None:
    trail, _parsed = _floor_trail()
    decision = trail.decision
    assert decision is not None
    summary = {"role": "user", "content": "summary of the start"}
    compacted = (summary, *RESTORED[1:], CLIENT[1])
    compaction = Compaction(
        orjson.dumps({**trail.chat.body, "messages": compacted}), compacted, "preflight",
        "compacted:preflight", "over the window", "s1", replaced=2, kept=2,
        tokens_removed=900, window=64_000)
    trail.outgoing = Outgoing(decision, compaction=compaction)
    kept = KeptTrail(trail, 0.3)
    report = kept()
    assert report == report_of(trail, 0.3)
    assert report.messages == compacted and report.compaction == "compacted:preflight"

    shadow_chat = _chat(CLIENT)
    shadow = Decision("shadow", "shadow; floor; restored=2", shadow_chat.raw,
                      session_id="s1", added=tuple(dict(m) for m in RESTORED), added_raw=2,
                      would="floor; restored=2", details={"budget": 1000})
    watched = Trail("r-6", shadow_chat, 10.0)
    watched.decision, watched.outgoing, watched.status = shadow, Outgoing(shadow), 200
    kept = KeptTrail(watched, 0.2)
    reachable = _reachable(kept)
    assert not [c for c in _containers(shadow.added, shadow.details, shadow_chat.body)
                if id(c) in reachable]
    assert kept() == report_of(watched, 0.2)


def test_a_pass_through_reports_the_clients_messages_parsed_again() -> None:
    chat = _chat(CLIENT)
    trail = Trail("r-2", chat, 10.0)
    decision = pass_through(chat, "floor_holds", "content", "s2")
    trail.decision, trail.outgoing, trail.status = decision, Outgoing(decision), 200
    kept = KeptTrail(trail, 0.1)
    reachable = _reachable(kept)
    assert not [c for c in _containers(chat.body) if id(c) in reachable]
    report = kept()
    assert report == report_of(trail, 0.1)
    assert report.messages is not None and list(report.messages) == CLIENT
    assert report.body == chat.raw


def test_a_dialect_request_keeps_neither_form_parsed() -> None:
    client = orjson.dumps({"model": "claude", "max_tokens": 64, "stream": True,
                           "system": "be brief",
                           "messages": [{"role": "user", "content": "what did we say?"}]})
    chat = ChatRequest.translated(client, orjson.loads(client), "main", MESSAGES)
    assert chat.translation is not None
    trail = Trail("r-3", chat, 10.0)
    decision = pass_through(chat, "floor_holds", "content", "s3")
    trail.decision, trail.outgoing, trail.status = decision, Outgoing(decision), 200
    kept = KeptTrail(trail, 0.1)
    reachable = _reachable(kept)
    assert not [c for c in _containers(chat.body, chat.translation.chat)
                if id(c) in reachable]
    assert kept() == report_of(trail, 0.1)
    assert kept().route == "messages"


def test_a_request_left_unread_and_one_that_failed_before_the_floor() -> None:
    unread = ChatRequest.unread(b'{"model": "m", "messages": [' + b'"a",' * 10 + b'"a"]}',
                                "main")
    trail = Trail("r-4", unread, 10.0)
    trail.status = 200
    assert KeptTrail(trail, 0.1)() == report_of(trail, 0.1)
    failed = Trail("r-5", _chat(CLIENT), 10.0)
    failed.status = 502
    assert KeptTrail(failed, 0.1)() == report_of(failed, 0.1)
