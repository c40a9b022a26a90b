"""Tool-call ids over 40 characters: Pi sends them cut to 40 when it replays history for
another model, the transcript keeps them whole. Identification used to find the session
while the restore's anchor, without the same cut, never matched (``no_anchor``)."""

from __future__ import annotations

import copy
from typing import Any

from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from proxy.wire.tool_ids import pi_form
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import Holder, Transcript, chat, put, request_for, rules

LONG = "fc_68f0e5b0c2d48190a1b2c3d4e5f60718293a4b5c6d7e8f90"  # 51 characters, Responses-like


def long_id_session() -> tuple[Catalog, str]:
    t = Transcript("1d5e5510-0000-7000-8000-00000000a001")
    for i in range(12):
        t.user(f"turn {i}")
        call = f"{LONG[:-2]}{i:02d}"
        t.objs.append({"type": "message", "id": f"call-entry-{i}",
                       "parentId": t.objs[-1]["id"], "timestamp": (t.clock + 0.5) * 1000,
                       "message": {"role": "assistant", "stopReason": "toolUse", "content": [
                           {"type": "toolCall", "id": call, "name": "bash",
                            "arguments": {"command": "ls"}}]}})
        t.tool_result(call, f"output {i}")
        t.assistant(f"done {i}")
    users = [o["id"] for o in t.objs if o["type"] == "message"
             and o["message"]["role"] == "user"]
    t.compaction("## Goal\nlong ids", users[-3])
    catalog = Catalog()
    put(catalog, t)
    return catalog, t.session_id


def as_pi_replays(body: dict[str, Any]) -> dict[str, Any]:
    """The request with every tool-call id in Pi's replay form (cut to 40)."""
    out = copy.deepcopy(body)
    for m in out["messages"]:
        for call in m.get("tool_calls") or []:
            call["id"] = pi_form(call["id"])
        if m.get("tool_call_id"):
            m["tool_call_id"] = pi_form(m["tool_call_id"])
    return out


def test_restore_anchors_on_ids_cut_to_40() -> None:
    catalog, sid = long_id_session()
    body = as_pi_replays(request_for(catalog, sid))
    # A summary the catalog does not know word for word (the agent's rendering of it may
    # differ): the session is found by its tool-call ids, the anchor by content.
    summary = body["messages"][1]["content"][0]
    summary["text"] = summary["text"].replace("## Goal\nlong ids",
                                              "## Goal (as the agent put it)\nlong ids")
    assert any(len(c["id"]) == 40 for m in body["messages"] for c in m.get("tool_calls") or [])
    decision = FloorHarness(Holder(rules(n=30)), TokenCounter(), catalog).decide(chat(body), {})
    assert decision.kind == "floor", decision.verdict
    assert decision.session_id == sid and decision.added_raw >= 1
