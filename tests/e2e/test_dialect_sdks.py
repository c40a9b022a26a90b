"""The official openai ``responses`` API and the official anthropic SDK through a real
``tailfloor serve`` to the fake upstream taught both dialects.

Oracles: what the SDKs parse, what the fake recorded (paths, headers, bodies), each request's
own recount of what was sent, and the proxy's metrics read from its admin listener.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.fake_behaviour import AgentBehaviour, is_summarization, total_chars
from tests.fake_dialects import MESSAGES, RESPONSES, chat_view
from tests.fake_upstream import FakeUpstream, Reply
from tests.inprocess import InProcessProxy
from tests.recovery.conversation import history, rules_dir

KEY = "sk-test-secret-0123456789"
TOOL = {"name": "bash", "description": "run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}


@pytest.fixture(scope="module")
def dialect_proxy(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[ProxyProcess]:
    tmp = tmp_path_factory.mktemp("dialects")
    process = InProcessProxy(fake, "--rules", str(rules_dir(tmp)), "--state", str(tmp / "s"))
    yield process
    process.stop()


def oai(proxy: ProxyProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0, timeout=30)


def claude(proxy: ProxyProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=30)


def as_responses_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for m in messages:
        text = m["content"] if isinstance(m["content"], str) else "".join(
            p["text"] for p in m["content"] or [])
        if m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                          "output": text})
        elif m.get("tool_calls"):
            items.extend({"type": "function_call", "call_id": c["id"],
                          "name": c["function"]["name"],
                          "arguments": c["function"]["arguments"]} for c in m["tool_calls"])
        elif m["role"] == "assistant":
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": text}]})
        else:
            items.append({"role": m["role"], "content": [{"type": "input_text", "text": text}]})
    return items


def as_anthropic(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    system = ""
    out: list[dict[str, Any]] = []
    for m in messages:
        text = m["content"] if isinstance(m["content"], str) else "".join(
            p["text"] for p in m["content"] or [])
        if m["role"] == "system":
            system = text
            continue
        if m["role"] == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m["tool_call_id"],
                                     "content": text}
        elif m.get("tool_calls"):
            call = m["tool_calls"][0]
            block = {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                     "input": json.loads(call["function"]["arguments"])}
        else:
            block = {"type": "text", "text": text}
        role = "assistant" if m["role"] == "assistant" else "user"
        if out and out[-1]["role"] == role:
            out[-1]["content"].append(block)
        else:
            out.append({"role": role, "content": [block]})
    return system, out


# -- OpenAI Responses ---------------------------------------------------------------------------

def test_responses_answer_usage_and_metrics(dialect_proxy: ProxyProcess,
                                            clean_fake: FakeUpstream) -> None:
    before = dialect_proxy.sample("tailfloor_tokens_total", route="responses", type="output")
    raw = oai(dialect_proxy).responses.with_raw_response.create(
        model="fake-model", input="hi", instructions="be brief")
    result = raw.parse()
    assert result.output_text == "Hello from the fake upstream."
    assert result.usage is not None and result.usage.input_tokens == 11
    assert raw.headers["x-tailfloor"].startswith("none")
    received = clean_fake.dialect_requests(RESPONSES)[-1]
    assert received.path == "/v1/responses"
    assert received.headers["Authorization"] == f"Bearer {KEY}"
    assert received.json()["instructions"] == "be brief"
    assert dialect_proxy.sample("tailfloor_tokens_total", route="responses",
                                type="output") == before + 7


def test_responses_untouched_body_reaches_upstream_byte_for_byte(
        dialect_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    raw = b'{ "model":"fake-model",  "input" : [{"role":"user","content":"caf\\u00e9"}] }'
    request = urllib.request.Request(dialect_proxy.url + "/v1/responses", data=raw,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert clean_fake.dialect_requests(RESPONSES)[-1].body == raw


def test_responses_stream_and_tool_round_trip(dialect_proxy: ProxyProcess,
                                              clean_fake: FakeUpstream) -> None:
    client = oai(dialect_proxy)
    tool = {"type": "function", **TOOL}
    with client.responses.stream(model="fake-model", input="USE_TOOL:bash ls",
                                 tools=[tool]) as stream:  # type: ignore[list-item]
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and calls[0].name == "bash"
    assert final.usage is not None and final.usage.output_tokens == 7
    follow = client.responses.create(model="fake-model", tools=[tool],  # type: ignore[list-item]
                                     input=[{"role": "user", "content": "USE_TOOL:bash ls"},
                                            {"type": "function_call",
                                             "call_id": calls[0].call_id, "name": "bash",
                                             "arguments": calls[0].arguments},
                                            {"type": "function_call_output",
                                             "call_id": calls[0].call_id, "output": "a.txt"}])
    assert follow.output_text
    sent = clean_fake.dialect_requests(RESPONSES)[-1].json()
    assert sent["input"][2] == {"type": "function_call_output", "call_id": calls[0].call_id,
                                "output": "a.txt"}


def test_responses_server_state_passes_through_counted(dialect_proxy: ProxyProcess,
                                                       clean_fake: FakeUpstream) -> None:
    before = dialect_proxy.sample("tailfloor_dialect_passthrough_total", route="responses",
                                  reason="server_state")
    raw = oai(dialect_proxy).responses.with_raw_response.create(
        model="fake-model", input="and then?", previous_response_id="resp_earlier")
    assert raw.headers["x-tailfloor"] == "none; reason=server_state"
    assert dialect_proxy.sample("tailfloor_dialect_passthrough_total", route="responses",
                                reason="server_state") == before + 1


# -- Anthropic Messages -------------------------------------------------------------------------

def test_anthropic_answer_headers_and_usage(dialect_proxy: ProxyProcess,
                                            clean_fake: FakeUpstream) -> None:
    before = dialect_proxy.sample("tailfloor_tokens_total", route="messages", type="input")
    raw = claude(dialect_proxy).messages.with_raw_response.create(
        model="fake-model", max_tokens=100, system="be brief",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14", "x-api-key": KEY})
    message = raw.parse()
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello from the fake upstream."
    received = clean_fake.dialect_requests(MESSAGES)[-1]
    assert received.path == "/v1/messages"
    assert received.headers["x-api-key"] == KEY
    assert received.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert "anthropic-version" in received.headers
    after = dialect_proxy.sample("tailfloor_tokens_total", route="messages", type="input")
    usage = message.usage
    assert after - before == usage.input_tokens + (usage.cache_creation_input_tokens or 0)
    assert KEY not in dialect_proxy.logs()


def test_anthropic_stream_tool_use_round_trip(dialect_proxy: ProxyProcess,
                                              clean_fake: FakeUpstream) -> None:
    client = claude(dialect_proxy)
    tool = {"name": "bash", "description": "run", "input_schema": TOOL["parameters"]}
    with client.messages.stream(model="fake-model", max_tokens=100, tools=[tool],
                                messages=[{"role": "user",
                                           "content": "USE_TOOL:bash ls"}]) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and uses[0].name == "bash" and final.stop_reason == "tool_use"
    follow = client.messages.create(model="fake-model", max_tokens=100, tools=[tool], messages=[
        {"role": "user", "content": "USE_TOOL:bash ls"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id,
                                           "name": "bash", "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "a.txt"}]}])
    assert follow.content


def test_anthropic_errors_of_tailfloor_are_in_anthropic_shape(
        dialect_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    request = urllib.request.Request(dialect_proxy.url + "/v1/messages", data=b"{not json",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    body = orjson.loads(caught.value.read())
    assert caught.value.code == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert not clean_fake.dialect_requests(MESSAGES)


# -- overflow recovery in each dialect ----------------------------------------------------------

def summarizer_paths(fake: FakeUpstream) -> list[str]:
    out = []
    for received in fake.received:
        dialect = RESPONSES if received.path.endswith("/responses") else (
            MESSAGES if received.path.endswith("/messages") else None)
        payload = received.json()
        view = chat_view(payload, dialect) if dialect else payload
        if is_summarization(view["messages"]):
            out.append(received.path)
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("dialect", [RESPONSES, MESSAGES])
def test_overflow_is_compacted_with_a_summary_made_in_the_dialect(
        dialect_proxy: ProxyProcess, clean_fake: FakeUpstream, dialect: str,
        stream: bool, tmp_path: Path) -> None:
    messages = [*history(f"o{dialect[:3]}{int(stream)}", 8, 700),
                {"role": "user", "content": "what now?"}]
    clean_fake.behaviour = AgentBehaviour(max_chars=total_chars(messages) - 500)
    if dialect == RESPONSES:
        raw = oai(dialect_proxy).responses.with_raw_response.create(
            model="fake-model", input=as_responses_input(messages),  # type: ignore[arg-type]
            max_output_tokens=256, stream=stream)
        answer = raw.parse()
        text = "".join(e.delta for e in answer if e.type == "response.output_text.delta") \
            if stream else answer.output_text  # type: ignore[union-attr]
        if not stream:  # the agent is told the size of what it sent, not of the compaction
            assert answer.usage.input_tokens > 11  # type: ignore[union-attr]
    else:
        system, turns = as_anthropic(messages)
        araw = claude(dialect_proxy).messages.with_raw_response.create(
            model="fake-model", max_tokens=256, system=system,
            messages=turns, stream=stream)  # type: ignore[arg-type]
        parsed = araw.parse()
        text = "".join(e.delta.text for e in parsed if e.type == "content_block_delta"
                       and e.delta.type == "text_delta") if stream else \
            parsed.content[0].text  # type: ignore[union-attr]
        if not stream:
            assert parsed.usage.input_tokens > 11  # type: ignore[union-attr]
        raw = araw  # type: ignore[assignment]
    assert raw.headers["x-tailfloor"] == "compacted:overflow"
    assert text
    path = "/v1/responses" if dialect == RESPONSES else "/v1/messages"
    assert [r.path for r in clean_fake.received] == [path] * 3
    assert summarizer_paths(clean_fake) == [path]
    retry = chat_view(clean_fake.received[-1].json(), dialect)
    assert total_chars(retry["messages"]) < total_chars(messages) - 500
    assert "what now?" in json.dumps(retry["messages"][-1])


# -- the output-limit clamp in each dialect ----------------------------------------------------

WINDOW_8K = ('[[models]]\npattern = "fake-model"\ncontext_window = 8192\n'
             'encoding = "o200k_base"\nmargin = 0.2\n')


@pytest.mark.parametrize("dialect", [RESPONSES, MESSAGES])
def test_an_output_limit_past_a_known_window_is_lowered_in_the_dialect_field(
        clean_fake: FakeUpstream, tmp_path: Path, dialect: str) -> None:
    proxy = InProcessProxy(clean_fake, "--rules",
                         str(rules_dir(tmp_path, models=WINDOW_8K)),
                         "--state", str(tmp_path / "state"))
    try:
        messages = history(f"c{dialect[:3]}", 3, 400)
        if dialect == RESPONSES:
            raw = oai(proxy).responses.with_raw_response.create(
                model="fake-model", input=as_responses_input(messages),  # type: ignore[arg-type]
                max_output_tokens=7900)
            field = "max_output_tokens"
        else:
            system, turns = as_anthropic(messages)
            raw = claude(proxy).messages.with_raw_response.create(  # type: ignore[assignment]
                model="fake-model", max_tokens=7900, system=system,
                messages=turns)  # type: ignore[arg-type]
            field = "max_tokens"
        raw.parse()
        assert raw.headers["x-tailfloor"] == "clamped:preflight"
        (sent,) = clean_fake.received
        body = sent.json()
        assert 1024 <= body[field] < 7900
        assert "max_completion_tokens" not in body
        # everything else as the client sent it
        items = "input" if dialect == RESPONSES else "messages"
        expected = as_responses_input(messages) if dialect == RESPONSES else \
            as_anthropic(messages)[1]
        assert body[items] == expected
        assert proxy.sample("tailfloor_output_lowered_total", trigger="preflight") == 1
    finally:
        proxy.stop()


def test_anthropic_request_too_large_is_compacted(dialect_proxy: ProxyProcess,
                                                  clean_fake: FakeUpstream) -> None:
    """Anthropic's 413 ``request_too_large`` (the request's bytes, no token counts in it) is
    an overflow: compacted with a summary on /v1/messages and retried once."""
    messages = [*history("big413", 8, 700), {"role": "user", "content": "what now?"}]
    clean_fake.script.append(Reply(status=413, error={
        "type": "request_too_large", "message": "Request exceeds the maximum size"}))
    system, turns = as_anthropic(messages)
    raw = claude(dialect_proxy).messages.with_raw_response.create(
        model="fake-model", max_tokens=256, system=system, messages=turns)  # type: ignore[arg-type]
    assert raw.parse().content
    assert raw.headers["x-tailfloor"] == "compacted:overflow"
    assert [r.path for r in clean_fake.received] == ["/v1/messages"] * 3
    assert summarizer_paths(clean_fake) == ["/v1/messages"]
    retry = chat_view(clean_fake.received[-1].json(), MESSAGES)
    assert total_chars(retry["messages"]) < total_chars(messages)


@pytest.mark.parametrize("dialect", [RESPONSES, MESSAGES])
def test_a_silent_overflow_in_the_dialect_compacts_the_next_request(
        clean_fake: FakeUpstream, tmp_path: Path, dialect: str) -> None:
    """An answer whose usage says the prompt was over the known window (the server cut it
    without saying so), read from the dialect's stream events: the session's next request
    is compacted before it is sent."""
    proxy = InProcessProxy(clean_fake, "--rules",
                         str(rules_dir(tmp_path, models=WINDOW_8K)),
                         "--state", str(tmp_path / "state"))
    clean_fake.script.append(Reply(usage={"prompt_tokens": 9000, "completion_tokens": 5,
                                          "total_tokens": 9005}))
    try:
        messages = history(f"s{dialect[:3]}", 6)
        for turn in range(2):
            if dialect == RESPONSES:
                with oai(proxy).responses.stream(
                        model="fake-model",
                        input=as_responses_input(messages)) as stream:  # type: ignore[arg-type]
                    stream.get_final_response()
            else:
                system, turns = as_anthropic(messages)
                with claude(proxy).messages.stream(model="fake-model", max_tokens=256,
                                                   system=system,
                                                   messages=turns) as astream:  # type: ignore[arg-type]
                    astream.get_final_message()
            if turn == 0:
                assert proxy.sample("tailfloor_overflow_total", outcome="silent") == 1
                messages += [{"role": "assistant", "content": "ok"},
                             {"role": "user", "content": "go"}]
        assert summarizer_paths(clean_fake) == [clean_fake.received[0].path]
        assert len(clean_fake.received) == 3
        assert proxy.sample("tailfloor_compactions_total", trigger="preflight") == 1
    finally:
        proxy.stop()
