"""What the floor restores, rendered in each dialect, against what Pi itself sent.

The floor renders transcript messages as chat messages (``proxy.transcripts.render``, per
entry as ``tail_records`` does) and the dialect renders those (``render_items``,
``render_messages``). The oracle is Pi's own request in the recorded captures
(``tests/fixtures/dialects``): the last request before the compaction holds the whole
transcript, and what tailfloor renders from that transcript must be what Pi sent, item for
item, but for what the chat shape cannot carry and the API does not need on an earlier turn:
reasoning items and thinking blocks, the assistant message's ``id``, the ``fc_`` item id,
Anthropic's ``cache_control`` and ``is_error``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.transcripts.render import Source, render
from proxy.wire.anthropic import MESSAGES, render_messages
from proxy.wire.responses import RESPONSES, render_items

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
BEFORE_COMPACTION = 7  # request 8 is Pi's summarizer call (README of the captures)


def pi_requests(api: str, version: str) -> list[dict[str, Any]]:
    """The captured request bodies with their message lists in full."""
    field = "input" if api == "openai-responses" else "messages"
    out: list[dict[str, Any]] = []
    previous: list[Any] = []
    for request in json.loads((CAPTURES / api / version / "requests.json").read_text()):
        body = request["body"]
        listed = body[field]
        if isinstance(listed, dict):
            listed = previous[:listed["same_as_previous"]] + listed["then"]
        previous = listed
        out.append({**body, field: listed})
    return out


def restored(api: str, version: str) -> list[Any]:
    """The first session's messages as the floor renders them, in the dialect."""
    first = sorted((CAPTURES / api / version / "sessions").glob("*.jsonl"))[0]
    chat = [m for line in first.read_text().splitlines()
            for m in render([Source("message", json.loads(line))], replay=False)
            if json.loads(line).get("type") == "message"]
    return render_items(chat) if api == "openai-responses" else render_messages(chat)


def essentials_responses(items: list[Any]) -> list[Any]:
    out = []
    for item in items:
        if item.get("type") == "reasoning" or item.get("role") in ("developer", "system"):
            continue
        drop = ("id", "phase") if item.get("type") in ("message", "function_call") else ()
        out.append({k: v for k, v in item.items() if k not in drop})
    return out


def essentials_anthropic(messages: list[Any]) -> list[Any]:
    out = []
    for message in messages:
        blocks = [{k: v for k, v in block.items() if k not in ("cache_control", "is_error")}
                  for block in message["content"]
                  if block.get("type") not in ("thinking", "redacted_thinking")]
        out.append({**message, "content": blocks})
    return out


@pytest.mark.parametrize("version", ["0.73.1", "1.6.0"])
def test_restored_responses_items_are_what_pi_sends(version: str) -> None:
    pi = pi_requests("openai-responses", version)[BEFORE_COMPACTION]["input"]
    expected = essentials_responses(pi)
    ours = restored("openai-responses", version)[:len(expected)]  # the session went on after
    assert ours == expected
    calls = [item for item in ours if item.get("type") == "function_call"]
    assert calls and all("|" not in item["call_id"] for item in calls)


@pytest.mark.parametrize("version", ["0.73.1", "1.6.0"])
def test_restored_anthropic_messages_are_what_pi_sends(version: str) -> None:
    pi = pi_requests("anthropic-messages", version)[BEFORE_COMPACTION]["messages"]
    expected = essentials_anthropic(pi)
    ours = restored("anthropic-messages", version)[:len(expected)]
    assert ours == expected
    assert any(b["type"] == "tool_use" for m in ours for b in m["content"])


def test_a_pi_anthropic_signature_is_not_taken_for_a_chat_field() -> None:
    """Pi's chat-completions thinking names its field (``reasoning_content``); an Anthropic
    signature or a Responses reasoning item in ``thinkingSignature`` is no field name."""
    def assistant(api: str | None, signature: str) -> dict[str, Any]:
        message = {"role": "assistant", "stopReason": "stop", "content": [
            {"type": "thinking", "thinking": "hmm", "thinkingSignature": signature},
            {"type": "text", "text": "ok"}]}
        if api is not None:
            message["api"] = api
        return {"type": "message", "message": message}

    named: tuple[str | None, ...] = (None, "openai-completions")
    for api, signature in (("anthropic-messages", "EqQBCkgIARABGAIiQL2s"),
                           ("openai-responses", '{"type":"reasoning","id":"rs_1"}')):
        assert render([Source("message", assistant(api, signature))]) == [
            {"role": "assistant", "content": "ok"}]
    for named_api in named:
        assert render([Source("message", assistant(named_api, "reasoning_content"))]) == [
            {"role": "assistant", "content": "ok", "reasoning_content": "hmm"}]


def test_ids_from_another_api_are_made_valid_for_the_dialect() -> None:
    """A Responses call kept by Pi as ``call_...|fc_...`` (the floor restoring turns made
    before a model switch): the Responses ``call_id`` is the part before the bar, an Anthropic
    id keeps only the characters Anthropic allows."""
    chat: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1|fc_1+/=", "type": "function",
         "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1|fc_1+/=", "content": "hello"}]
    assert [i["call_id"] for i in render_items(chat)] == ["call_1", "call_1"]
    rendered = render_messages(chat)
    assert rendered[0]["content"][0]["id"] == "call_1_fc_1___"
    assert rendered[1]["content"][0]["tool_use_id"] == "call_1_fc_1___"


SUMMARY_TEXT = "The conversation history before this point was compacted into the following " \
    "summary:\n\n<summary>\nWe talked.\n</summary>"
# Restored before the agent's kept answer, and saying the same (an agent answers "Done." often).
RESTORED: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "earlier"}]},
    {"role": "assistant", "content": "Done."}]


def test_a_restored_copy_of_a_kept_answer_leaves_the_agent_its_own_anthropic_item() -> None:
    body: dict[str, Any] = {"model": "claude", "max_tokens": 1024, "system": "You code.",
                            "messages": [
        {"role": "user", "content": [{"type": "text", "text": SUMMARY_TEXT}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "so", "signature": "sig-kept"},
            {"type": "text", "text": "Done."}]},
        {"role": "user", "content": [{"type": "text", "text": "next",
                                      "cache_control": {"type": "ephemeral"}}]}]}
    translation = MESSAGES.translate(body)
    system, summary, *own = translation.chat["messages"]
    out = MESSAGES.render(translation, {**translation.chat,
                                        "messages": [system, summary, *RESTORED, *own]})
    assert out["messages"] == [body["messages"][0], RESTORED[0],
                               {"role": "assistant",
                                "content": [{"type": "text", "text": "Done."}]},
                               *body["messages"][1:]]
    assert out["messages"][3] is body["messages"][1]  # its thinking and signature, in place


def test_a_restored_copy_of_a_kept_answer_leaves_the_agent_its_own_responses_items() -> None:
    body: dict[str, Any] = {"model": "gpt-5", "input": [
        {"role": "developer", "content": "You code."},
        {"role": "user", "content": [{"type": "input_text", "text": SUMMARY_TEXT}]},
        {"type": "reasoning", "id": "rs_kept", "summary": [], "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "id": "msg_kept", "status": "completed",
         "content": [{"type": "output_text", "text": "Done.", "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "next"}]}]}
    translation = RESPONSES.translate(body)
    system, summary, *own = translation.chat["messages"]
    # A Responses assistant translates to parts, a rendered one to a string: here the user
    # asked the same before.
    restored: list[dict[str, Any]] = [{"role": "user",
                                       "content": [{"type": "text", "text": "next"}]},
                RESTORED[1]]
    out = RESPONSES.render(translation, {**translation.chat,
                                         "messages": [system, summary, *restored, *own]})
    assert out["input"][:2] == body["input"][:2]
    assert out["input"][2:4] == render_items(restored)
    assert out["input"][4:] == body["input"][2:]
    assert out["input"][4] is body["input"][2]  # the reasoning item with its answer
