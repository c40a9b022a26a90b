"""Responses and Anthropic Messages requests through the chat translation and back.

The oracle is the client's own body: what the stages leave alone must come back as the very
items the client sent (same objects, in place: ids, signatures, encrypted reasoning and cache
breakpoints untouched), and what they insert must be rendered in the dialect's own shape.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from proxy.chat import ChatRequest
from proxy.wire.anthropic import MESSAGES
from proxy.wire.responses import RESPONSES
from proxy.wire.usage import UsageAdjustment

SUMMARY = {"role": "user", "content": "The conversation history before this point was "
           "compacted into the following summary:\n<summary>\nWe fixed the parser.\n</summary>"}


def responses_body() -> dict[str, Any]:
    return {
        "model": "gpt-5", "stream": True, "store": False, "prompt_cache_key": "sess-1",
        "instructions": "You are a coding agent.", "max_output_tokens": 4000,
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "read a.txt"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "encrypted_content": "gAAAA-opaque"},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Reading it.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read",
             "arguments": "{\"path\":\"a.txt\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "hello"},
            {"type": "message", "role": "assistant", "id": "msg_2", "status": "completed",
             "content": [{"type": "output_text", "text": "It says hello.", "annotations": []}]},
            {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ],
    }


def anthropic_body() -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5", "max_tokens": 8192, "stream": True,
        "system": [{"type": "text", "text": "You are a coding agent.",
                    "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "read", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "read a.txt"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should read it.", "signature": "sig-1"},
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_1", "name": "read",
                 "input": {"path": "a.txt"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"},
                {"type": "text", "text": "and now?", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xyz"},
                                              {"type": "text", "text": "It says hello."}]},
            {"role": "user", "content": "thanks"},
        ],
    }


@pytest.mark.parametrize(("dialect", "make", "field"), [
    (RESPONSES, responses_body, "input"), (MESSAGES, anthropic_body, "messages")])
def test_untouched_request_renders_back_to_the_same_items(dialect: Any, make: Any,
                                                          field: str) -> None:
    body = make()
    sent = copy.deepcopy(body)
    translation = dialect.translate(body)
    assert translation.pass_reason is None
    rendered = dialect.render(translation, orjson.loads(orjson.dumps(translation.chat)))
    assert rendered == sent
    assert all(a is b for a, b in zip(rendered[field], body[field], strict=True))


def test_untouched_request_goes_upstream_as_the_client_sent_its_bytes() -> None:
    raw = b'{"model": "m",  "input": [ {"role": "user", "content": "hi"} ]}'
    chat = ChatRequest.translated(raw, orjson.loads(raw), None, RESPONSES)
    assert chat.outgoing(chat.raw) == raw


def test_responses_translation_reads_calls_results_and_the_system_prompt() -> None:
    chat = RESPONSES.translate(responses_body()).chat
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    call = chat["messages"][2]
    assert call["content"] == [{"type": "text", "text": "Reading it."}]
    # Pi's transcripts name the call "<call_id>|<item id>": so does the translation.
    assert call["tool_calls"][0]["id"] == "call_1|fc_1"
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "call_1|fc_1",
                                   "content": "hello"}
    rendered = RESPONSES.render(RESPONSES.translate(responses_body()),
                                {**chat, "messages": [chat["messages"][0], SUMMARY,
                                                      *chat["messages"][3:4]]})
    assert rendered["input"][1] == {"type": "function_call_output", "call_id": "call_1",
                                    "output": "hello"}
    assert chat["max_completion_tokens"] == 4000
    assert chat["prompt_cache_key"] == "sess-1"


def test_responses_floor_insert_keeps_reasoning_in_place_and_renders_the_new() -> None:
    body = responses_body()
    translation = RESPONSES.translate(body)
    messages = translation.chat["messages"]
    restored = [{"role": "user", "content": "earlier question"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_0", "type": "function",
                     "function": {"name": "read", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_0", "content": "old"}]
    out = RESPONSES.render(translation, {**translation.chat,
                                         "messages": [messages[0], SUMMARY, *restored,
                                                      *messages[1:]]})
    assert out["instructions"] == body["instructions"]
    assert out["input"][:5] == [
        {"role": "user", "content": [{"type": "input_text", "text": SUMMARY["content"]}]},
        {"role": "user", "content": [{"type": "input_text", "text": "earlier question"}]},
        {"type": "function_call", "call_id": "call_0", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_0", "output": "old"},
        body["input"][0]]
    assert out["input"][5:] == body["input"][1:]
    assert out["input"][5]["encrypted_content"] == "gAAAA-opaque"


def test_responses_insert_takes_openclaws_typed_user_items_from_the_request() -> None:
    """OpenClaw sends user items with ``"type": "message"`` (Pi without): what tailfloor
    inserts follows the request's own user items."""
    body = responses_body()
    body["input"] = [{"type": "message", **i} if i.get("role") == "user" else i
                     for i in body["input"]]
    translation = RESPONSES.translate(body)
    messages = translation.chat["messages"]
    out = RESPONSES.render(translation, {**translation.chat,
                                         "messages": [messages[0], SUMMARY, *messages[1:]]})
    assert out["input"][0] == {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": SUMMARY["content"]}]}
    assert out["input"][1:] == body["input"]


def test_responses_compaction_drops_whole_items_and_keeps_the_rest() -> None:
    body = responses_body()
    translation = RESPONSES.translate(body)
    messages = translation.chat["messages"]
    out = RESPONSES.render(translation, {**translation.chat,
                                         "messages": [messages[0], SUMMARY, messages[-1]]})
    assert out["input"][1] is body["input"][-1]
    assert len(out["input"]) == 2


def test_responses_output_clamp_goes_back_to_max_output_tokens() -> None:
    translation = RESPONSES.translate(responses_body())
    out = RESPONSES.render(translation, {**translation.chat, "max_completion_tokens": 1500})
    assert out["max_output_tokens"] == 1500
    assert "max_completion_tokens" not in out


@pytest.mark.parametrize("state", [{"previous_response_id": "resp_1"},
                                   {"conversation": "conv_1"}])
def test_responses_server_state_passes_through(state: dict[str, Any]) -> None:
    assert RESPONSES.translate({**responses_body(), **state}).pass_reason == "server_state"


def test_responses_item_reference_passes_through() -> None:
    body = responses_body()
    body["input"].append({"type": "item_reference", "id": "msg_9"})
    assert RESPONSES.translate(body).pass_reason == "server_state"


def test_anthropic_translation_splits_tool_results_and_keeps_signatures() -> None:
    body = anthropic_body()
    translation = MESSAGES.translate(body)
    roles = [m["role"] for m in translation.chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "user"]
    assert translation.chat["messages"][2]["tool_calls"][0]["function"]["arguments"] == \
        '{"path":"a.txt"}'
    # A compaction that keeps only the tool result of a user turn renders that turn anew.
    messages = translation.chat["messages"]
    out = MESSAGES.render(translation, {**translation.chat,
                                        "messages": [messages[0], SUMMARY, *messages[4:]]})
    assert out["system"] is body["system"]
    # Two user messages in a row, as Pi sends its summary before the kept messages; the
    # rest of the cut turn keeps its breakpoint.
    assert out["messages"][:2] == [
        {"role": "user", "content": [{"type": "text", "text": SUMMARY["content"]}]},
        {"role": "user", "content": [{"type": "text", "text": "and now?",
                                      "cache_control": {"type": "ephemeral"}}]}]
    assert out["messages"][2] is body["messages"][3]  # redacted thinking untouched
    assert out["messages"][2]["content"][0] == {"type": "redacted_thinking", "data": "xyz"}


def test_anthropic_insert_keeps_breakpoints_and_alternates_roles() -> None:
    body = anthropic_body()
    translation = MESSAGES.translate(body)
    messages = translation.chat["messages"]
    restored = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "toolu_0", "type": "function", "function": {"name": "read",
                                                           "arguments": "{\"path\":\"b\"}"}}]},
        {"role": "tool", "tool_call_id": "toolu_0", "content": "old"}]
    out = MESSAGES.render(translation, {**translation.chat,
                                        "messages": [messages[0], SUMMARY, *restored,
                                                     *messages[1:]]})
    assert out["messages"][:3] == [
        {"role": "user", "content": [{"type": "text", "text": SUMMARY["content"]}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0",
                                           "name": "read", "input": {"path": "b"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0",
                                      "content": "old"}]}]
    assert out["messages"][3:] == body["messages"]
    # Rendering twice gives the same bytes: the cached prefix stays cached.
    again = MESSAGES.render(translation, {**translation.chat,
                                          "messages": [messages[0], SUMMARY, *restored,
                                                       *messages[1:]]})
    assert orjson.dumps(again) == orjson.dumps(out)


def test_anthropic_usage_adds_the_three_input_figures_and_adjusts_uncached_first() -> None:
    usage = {"input_tokens": 100, "cache_read_input_tokens": 800,
             "cache_creation_input_tokens": 50, "output_tokens": 20}
    read = MESSAGES.usage(usage)
    assert (read.prompt_tokens, read.cached_tokens, read.completion_tokens) == (950, 800, 20)
    adjusted = MESSAGES.adjusted_usage(usage, UsageAdjustment(added=300))
    assert sum(adjusted[k] for k in ("input_tokens", "cache_read_input_tokens",
                                     "cache_creation_input_tokens")) == 650
    assert min(adjusted.values()) >= 0


def test_responses_usage_and_finish_from_the_completed_event() -> None:
    event = {"type": "response.completed", "response": {
        "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
        "usage": {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 100},
                  "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 10},
                  "total_tokens": 950}}}
    facts = RESPONSES.event_facts(event)
    assert facts.finish_reason == "length"
    assert facts.usage is not None
    usage = RESPONSES.usage(facts.usage)
    assert (usage.prompt_tokens, usage.cached_tokens, usage.reasoning_tokens) == (900, 100, 10)
    changed = RESPONSES.adjusted_event(event, UsageAdjustment(added=200))
    assert changed is not None
    assert changed["response"]["usage"]["input_tokens"] == 700
    assert changed["response"]["usage"]["total_tokens"] == 750


def test_anthropic_overflow_reply_uses_anthropic_wording() -> None:
    from proxy.recovery.detect import context_length_exceeded_body
    body = orjson.loads(MESSAGES.error_body(context_length_exceeded_body(200000, 250000)))
    assert body["type"] == "error"
    assert body["error"]["message"] == "prompt is too long: 250000 tokens > 200000 maximum"


def test_anthropic_message_thread_continuation_passes_through() -> None:
    body = {"model": "claude", "max_tokens": 100, "messages": [
        {"role": "user", "content": "next"}],
        "thread": {"type": "continue", "previous_message_id": "msg_01"}}
    assert MESSAGES.translate(body).pass_reason == "message_thread"
    created = {**anthropic_body(), "thread": {"type": "create"}}
    assert MESSAGES.translate(created).pass_reason is None


def test_a_cut_through_an_anthropic_user_turn_keeps_its_images_and_breakpoints() -> None:
    """A compaction may start its tail inside a user turn (after its tool results): the rest
    of that turn is the client's, images and cache breakpoints as they came."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBOR"}}
    asked = {"type": "text", "text": "what is in this screenshot?",
             "cache_control": {"type": "ephemeral"}}
    body = {"model": "c", "max_tokens": 100, "system": "S", "messages": [
        {"role": "user", "content": "start"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "x"}, image, asked]}]}
    translation = MESSAGES.translate(copy.deepcopy(body))
    messages = translation.chat["messages"]
    out = MESSAGES.render(translation, {**translation.chat,
                                        "messages": [messages[0], SUMMARY, messages[-1]]})
    assert out["messages"][1] == {"role": "user", "content": [image, asked]}


def test_restored_chat_images_become_anthropic_image_blocks() -> None:
    from proxy.wire.anthropic import render_messages
    rendered = render_messages([{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert rendered == [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AAAA"}}]}]


def test_many_restored_tool_results_are_gathered_in_linear_time() -> None:
    from proxy.wire.anthropic import render_messages
    results = [{"role": "tool", "tool_call_id": f"toolu_{i}", "content": "ok"}
               for i in range(20000)]
    (turn,) = render_messages(results)  # quadratic would take minutes here
    assert len(turn["content"]) == 20000


def test_anthropic_error_types_are_anthropic_s_own() -> None:
    from proxy.errors import BodyTooLarge, UpstreamTimeout, to_response_parts
    timeout = orjson.loads(MESSAGES.error_body(to_response_parts(UpstreamTimeout("slow"))[1]))
    assert timeout == {"type": "error", "error": {"type": "api_error", "message": "slow"}}
    big = orjson.loads(MESSAGES.error_body(to_response_parts(BodyTooLarge("big"))[1]))
    assert big["error"]["type"] == "request_too_large"


def test_responses_instructions_as_items_stay_as_the_client_sent_them() -> None:
    instructions = [{"role": "developer", "content": [{"type": "input_text",
                                                       "text": "Be brief."}]}]
    body = {**responses_body(), "instructions": instructions}
    translation = RESPONSES.translate(copy.deepcopy(body))
    assert translation.chat["messages"][0] == {"role": "system", "content": "Be brief."}
    messages = translation.chat["messages"]
    out = RESPONSES.render(translation, {**translation.chat,
                                         "messages": [messages[0], SUMMARY, messages[-1]]})
    assert out["instructions"] == instructions


def test_restored_chat_images_become_responses_input_images() -> None:
    from proxy.wire.responses import render_items
    rendered = render_items([{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert rendered == [{"role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]
