"""What the floor inserts into a Responses or Anthropic Messages request, beside the client's
own items (tests/transcripts/test_dialect_replay.py checks the rendering against Pi's).

- A restored copy of a message the client also sent (an agent gives the same answer twice)
  leaves the client its own item, with its reasoning item or thinking signature, in place.
- A Pi thinking signature is a chat field name only for chat completions.
- Tool ids from another API (a Responses ``call_...|fc_...`` in a session that switched
  models) are made valid for Anthropic.
"""

from __future__ import annotations

from typing import Any

from proxy.transcripts.render import Source, render
from proxy.wire.anthropic import MESSAGES, render_messages
from proxy.wire.responses import RESPONSES, render_items


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
