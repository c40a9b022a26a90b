"""The real openai SDK, sync and async, through a real tailfloor process to the fake upstream."""

from __future__ import annotations

import urllib.request

import openai
import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.fake_upstream import FakeUpstream, Reply

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def client(proxy: ProxyProcess, prefix: str = "/v1") -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + prefix, api_key="sk-test-secret-0123456789",
                         max_retries=0, timeout=10)


def test_non_streaming_answer_and_usage_reach_the_client(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    before = proxy.sample("tailfloor_tokens_total", model="fake-model", type="output")
    result = client(proxy).chat.completions.create(model="fake-model", messages=MESSAGES)
    assert result.choices[0].message.content == "Hello from the fake upstream."
    assert result.usage is not None and result.usage.prompt_tokens == 11
    received = clean_fake.chat_requests()[-1]
    assert received.path == "/v1/chat/completions"
    assert received.headers["Authorization"] == "Bearer sk-test-secret-0123456789"
    assert orjson.loads(received.body)["messages"] == MESSAGES
    assert proxy.sample("tailfloor_tokens_total", model="fake-model", type="output") == before + 7


def test_request_body_reaches_upstream_byte_for_byte(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    raw = b'{ "model" : "fake-model",\n  "messages":[{"role":"user","content":"caf\\u00e9"}] }'
    request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=raw,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert response.headers["x-tailfloor"].startswith("none")
        assert response.headers["x-tailfloor-request-id"]
    assert clean_fake.chat_requests()[-1].body == raw


def test_streaming_with_usage_is_relayed_event_for_event(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    stream = client(proxy).chat.completions.create(
        model="fake-model", messages=MESSAGES, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from the fake upstream."
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 7


def test_streaming_without_usage_hides_the_injected_usage_chunk(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    before = proxy.sample("tailfloor_tokens_total", model="fake-model", type="input")
    body = orjson.dumps({"model": "fake-model", "messages": MESSAGES, "stream": True})
    request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        received_bytes = response.read()
    sent_upstream = orjson.loads(clean_fake.chat_requests()[-1].body)
    assert sent_upstream["stream_options"] == {"include_usage": True}
    events = [e for e in received_bytes.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert received_bytes.count(b"[DONE]") == 1
    assert b'"usage"' not in received_bytes
    payloads = [orjson.loads(e[6:]) for e in events[:-1]]
    assert all(p["choices"] for p in payloads)
    # What the client would have got had it not been asked: the upstream's events, minus usage.
    from tests.fake_upstream import _sse_chunks
    expected = b"".join(_sse_chunks("fake-model", Reply(), include_usage=False))
    assert received_bytes == expected
    assert proxy.sample("tailfloor_tokens_total", model="fake-model", type="input") == before + 8


async def test_async_client_streams_and_answers(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    async_client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x",
                                      max_retries=0, timeout=10)
    result = await async_client.chat.completions.create(model="fake-model", messages=MESSAGES)
    assert result.choices[0].message.content == "Hello from the fake upstream."
    stream = await async_client.chat.completions.create(
        model="fake-model", messages=MESSAGES, stream=True)
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(pieces) == "Hello from the fake upstream."
    await async_client.close()


def test_tool_call_round_trip(proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    tools = [{"type": "function", "function": {
        "name": "bash", "description": "run", "parameters": {
            "type": "object", "properties": {"command": {"type": "string"}}}}}]
    sdk = client(proxy)
    messages: list[dict[str, object]] = [{"role": "user", "content": "USE_TOOL please"}]
    stream = sdk.chat.completions.create(model="fake-model", messages=messages,  # type: ignore[arg-type]
                                         tools=tools, stream=True)  # type: ignore[arg-type]
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] = delta.id or entry["id"]
            if delta.function:
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
    call = calls[0]
    assert call["id"].startswith("call_fake_1_")  # the fake's first call (ids are salted)
    assert {**call, "id": ""} == {"id": "", "name": "bash",
                                  "arguments": '{"command":"echo hello-from-tool"}'}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "hi"},
    ]
    result = sdk.chat.completions.create(model="fake-model", messages=messages,  # type: ignore[arg-type]
                                         tools=tools)  # type: ignore[arg-type]
    assert result.choices[0].message.content == "The tool returned: hi"
    assert orjson.loads(clean_fake.chat_requests()[-1].body)["messages"][-1]["tool_call_id"] == (
        call["id"])


def test_models_and_other_routes_pass_through(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    models = client(proxy).models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    embeddings_body = b'{"model":"e","input":"x"}'
    request = urllib.request.Request(proxy.url + "/v1/embeddings?dims=3", data=embeddings_body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        echoed = orjson.loads(response.read())
    assert echoed == {"path": "/v1/embeddings", "echo": embeddings_body.decode()}
    assert clean_fake.received[-1].query == "dims=3"
    assert proxy.sample("tailfloor_requests_total", route="models", code="200") >= 1


@pytest.mark.parametrize("prefix", ["/agents/main/v1", "/agents/main"])
def test_agent_prefix_is_stripped(proxy: ProxyProcess, clean_fake: FakeUpstream,
                                  prefix: str) -> None:
    before = proxy.sample("tailfloor_tokens_total", agent="main", type="output")
    result = client(proxy, prefix).chat.completions.create(model="fake-model", messages=MESSAGES)
    assert result.choices[0].message.content
    assert clean_fake.chat_requests()[-1].path == "/v1/chat/completions"
    assert proxy.sample("tailfloor_tokens_total", agent="main", type="output") == before + 7
    models = client(proxy, prefix).models.list()
    assert models.data[0].id == "fake-model"
    assert clean_fake.received[-1].path == "/v1/models"
