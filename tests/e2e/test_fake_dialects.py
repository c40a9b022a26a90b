"""The fake upstream's Responses and Anthropic Messages dialects, checked against the official
SDKs directly (no proxy): what the SDKs parse is what the proxy-side tests can trust."""

from __future__ import annotations

import json

import anthropic
import openai
import orjson
import pytest

from tests.fake_behaviour import AgentBehaviour
from tests.fake_dialects import MESSAGES, RESPONSES
from tests.fake_upstream import FakeUpstream, Reply

KEY = "sk-test-secret-0123456789"
TOOL = {"name": "bash", "description": "run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}


def oai(fake: FakeUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


def claude(fake: FakeUpstream) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fake.url, api_key=KEY, max_retries=0, timeout=10)


def sse_types(body: bytes) -> list[str]:
    return [line.removeprefix(b"event: ").decode() for line in body.split(b"\n")
            if line.startswith(b"event: ")]


# -- OpenAI Responses ---------------------------------------------------------------------------

def test_responses_text_and_usage(clean_fake: FakeUpstream) -> None:
    result = oai(clean_fake).responses.create(model="fake-model", input="hi",
                                              instructions="be brief")
    assert result.output_text == "Hello from the fake upstream."
    assert result.status == "completed"
    assert result.usage is not None
    assert (result.usage.input_tokens, result.usage.output_tokens) == (11, 7)
    assert result.usage.input_tokens_details.cached_tokens == 3
    assert result.usage.output_tokens_details.reasoning_tokens == 2
    assert result.usage.total_tokens == 18
    received = clean_fake.dialect_requests(RESPONSES)[-1]
    assert received.path == "/v1/responses"
    assert received.headers["Authorization"] == f"Bearer {KEY}"
    assert received.json()["instructions"] == "be brief"


def test_responses_stream_events_in_order(clean_fake: FakeUpstream) -> None:
    with oai(clean_fake).responses.create(model="fake-model", input="hi", stream=True) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello from the fake upstream."
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == text
    assert completed.response.usage is not None and completed.response.usage.output_tokens == 7


def test_responses_stream_helper_final_response(clean_fake: FakeUpstream) -> None:
    clean_fake.script.append(Reply(text="streamed answer", reasoning="thinking it over"))
    with oai(clean_fake).responses.stream(model="fake-model", input="hi") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == "streamed answer"
    assert [item.type for item in final.output] == ["reasoning", "message"]
    reasoning = final.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.encrypted_content and reasoning.summary[0].text == "thinking it over"


def test_responses_tool_round_trip(clean_fake: FakeUpstream) -> None:
    clean_fake.behaviour = AgentBehaviour()
    client = oai(clean_fake)
    tools: list[dict[str, object]] = [{"type": "function", **TOOL}]
    first = client.responses.create(model="fake-model", input="USE_TOOL:bash please",
                                    tools=tools)  # type: ignore[arg-type]
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function_call" and call.name == "bash"
    assert call.call_id.startswith("call_fake_1_") and call.id and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"command": "echo hello-from-tool"}
    with client.responses.stream(model="fake-model", tools=tools, input=[  # type: ignore[arg-type]
            {"role": "user", "content": "USE_TOOL:bash please"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id,
             "output": "hello-from-tool"}]) as stream:
        final = stream.get_final_response()
    assert final.output_text == "The tool returned: hello-from-tool"


def test_responses_streamed_tool_call(clean_fake: FakeUpstream) -> None:
    clean_fake.script.append(Reply(text="", tool_call={"id": "call_x1", "name": "bash",
                                                       "arguments": '{"command":"ls"}'}))
    with oai(clean_fake).responses.stream(model="fake-model", input="go") as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == '{"command":"ls"}'
    call = final.output[0]
    assert call.type == "function_call" and call.call_id == "call_x1"


def test_responses_incomplete_and_errors(clean_fake: FakeUpstream) -> None:
    client = oai(clean_fake)
    clean_fake.script.append(Reply(text="cut", finish="length"))
    with client.responses.stream(model="fake-model", input="hi") as stream:
        kinds = [e.type for e in stream]
    assert kinds[-1] == "response.incomplete"
    clean_fake.script.append(Reply(text="cut", finish="length"))
    result = client.responses.create(model="fake-model", input="hi")
    assert result.status == "incomplete"
    assert result.incomplete_details is not None
    assert result.incomplete_details.reason == "max_output_tokens"
    clean_fake.script.append(Reply(status=400, error={
        "message": "bad thing", "type": "invalid_request_error", "code": "bad_code"}))
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="fake-model", input="hi")
    assert caught.value.code == "bad_code" and caught.value.body == {
        "message": "bad thing", "type": "invalid_request_error", "param": None,
        "code": "bad_code"}
    clean_fake.script.append(Reply(status=400, error={
        "message": "This model's maximum context length is 8192 tokens. However, your messages "
                   "resulted in 9000 tokens.", "type": "invalid_request_error",
        "code": "context_length_exceeded"}))
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="fake-model", input="hi")
    assert caught.value.code == "context_length_exceeded"
    assert "exceeds the context window" in caught.value.message


def test_responses_mid_stream_errors(clean_fake: FakeUpstream) -> None:
    client = oai(clean_fake)
    clean_fake.script.append(Reply(stream_error={"message": "boom", "code": "server_error"}))
    with client.responses.create(model="fake-model", input="hi", stream=True) as stream:
        events = list(stream)
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.error is not None and failed.response.error.message == "boom"
    assert "response.completed" not in [e.type for e in events]
    clean_fake.script.append(Reply(stream_error={"message": "boom", "code": "server_error"},
                                   stream_error_event="error"))
    with client.responses.create(model="fake-model", input="hi", stream=True) as stream:
        last = list(stream)[-1]
    assert last.type == "error" and last.message == "boom" and last.code == "server_error"


# -- Anthropic Messages -------------------------------------------------------------------------

def test_messages_text_and_usage(clean_fake: FakeUpstream) -> None:
    message = claude(clean_fake).messages.create(
        model="fake-model", max_tokens=100, system="be brief",
        messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello from the fake upstream."
    assert message.stop_reason == "end_turn" and message.id.startswith("msg_")
    assert message.usage.input_tokens == 8 and message.usage.cache_read_input_tokens == 3
    assert message.usage.cache_creation_input_tokens == 0 and message.usage.output_tokens == 7
    received = clean_fake.dialect_requests(MESSAGES)[-1]
    assert received.path == "/v1/messages"
    headers = {k.lower(): v for k, v in received.headers.items()}
    # anthropic 2.x sends the API key as a bearer token (Pi's Node SDK: x-api-key)
    assert headers["authorization"] == f"Bearer {KEY}" and headers["anthropic-version"]
    assert received.json()["system"] == "be brief"


def test_messages_stream_events_and_final_message(clean_fake: FakeUpstream) -> None:
    clean_fake.script.append(Reply(text="streamed answer", reasoning="thinking it over"))
    with claude(clean_fake).messages.stream(
            model="fake-model", max_tokens=100,
            messages=[{"role": "user", "content": "hi"}]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in final.content] == ["thinking", "text"]
    thinking = final.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "thinking it over"
    assert thinking.signature.startswith("sig_")
    assert final.content[1].type == "text" and final.content[1].text == "streamed answer"
    assert final.usage.output_tokens == 7 and final.usage.input_tokens == 8
    assert final.stop_reason == "end_turn"
    raw = claude(clean_fake).messages.with_raw_response.create(
        model="fake-model", max_tokens=100, stream=True,
        messages=[{"role": "user", "content": "hi"}])
    assert sse_types(raw.http_response.read()) == [
        "message_start", "content_block_start", "ping", "content_block_delta",
        "content_block_delta", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"]


def test_messages_tool_use_round_trip(clean_fake: FakeUpstream) -> None:
    clean_fake.behaviour = AgentBehaviour()
    client = claude(clean_fake)
    tools: list[anthropic.types.ToolParam] = [{
        "name": TOOL["name"], "description": "run a command",  # type: ignore[typeddict-item]
        "input_schema": TOOL["parameters"]}]  # type: ignore[typeddict-item]
    question: anthropic.types.MessageParam = {"role": "user", "content": "USE_TOOL:bash please"}
    with client.messages.stream(model="fake-model", max_tokens=100, tools=tools,
                                messages=[question]) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    use = first.content[-1]
    assert use.type == "tool_use" and use.name == "bash"
    assert use.id.startswith("toolu_fake_1_")
    assert use.input == {"command": "echo hello-from-tool"}
    second = client.messages.create(model="fake-model", max_tokens=100, tools=tools, messages=[
        question, {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "hello-from-tool"}]}])
    assert second.content[0].type == "text"
    assert second.content[0].text == "The tool returned: hello-from-tool"
    sent = clean_fake.dialect_requests(MESSAGES)[-1].json()
    assert sent["messages"][1]["content"][-1]["id"] == use.id


def test_messages_max_tokens_and_errors(clean_fake: FakeUpstream) -> None:
    client = claude(clean_fake)
    user: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
    clean_fake.script.append(Reply(text="cut", finish="length"))
    assert client.messages.create(model="fake-model", max_tokens=5,
                                  messages=user).stop_reason == "max_tokens"
    clean_fake.script.append(Reply(status=400, error={
        "message": "This model's maximum context length is 8192 tokens. However, your messages "
                   "resulted in 9000 tokens.", "code": "context_length_exceeded"}))
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="fake-model", max_tokens=5, messages=user)
    assert caught.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 9000 tokens > 8192 maximum"}}
    clean_fake.script.append(Reply(status=413, error={"message": "too big"}))
    with pytest.raises(anthropic.APIStatusError) as status:
        client.messages.create(model="fake-model", max_tokens=5, messages=user)
    assert status.value.status_code == 413
    assert orjson.loads(status.value.response.content)["error"]["type"] == "request_too_large"
    clean_fake.script.append(Reply(stream_error={"type": "overloaded_error",
                                                 "message": "Overloaded"}))
    with pytest.raises(anthropic.APIStatusError) as mid, client.messages.stream(
            model="fake-model", max_tokens=5, messages=user) as stream:
        list(stream)
    assert "overloaded_error" in str(mid.value)


@pytest.mark.parametrize("path", ["/responses", "/messages"])
def test_dialects_answer_without_the_v1_prefix(clean_fake: FakeUpstream, path: str) -> None:
    import urllib.request
    body = ({"model": "m", "input": "hi"} if path == "/responses"
            else {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(clean_fake.url + path, data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = orjson.loads(response.read())
    assert answer["object" if path == "/responses" else "type"] in ("response", "message")
