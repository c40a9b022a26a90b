from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.identity.identify import (
    RequestSignals,
    identify,
    is_summarization,
    split_agent_path,
)
from proxy.policy.records import Identification
from proxy.wire.content import message_text
from proxy.wire.openclaw import strip_user_prefix

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "floor"
PI_SESSION = "01a22a43-927b-7210-a94c-d5b0cd90c50a"
OC96_SESSION = "dc99badc-cc56-4bbc-911e-08925dee1509"
OC735_SESSION = "bf293310-d774-4c44-8f8d-8c01da5175da"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def signals(name: str, path_agent: str | None = None) -> RequestSignals:
    fixture = load(name)
    return identify(path_agent, fixture["headers"], fixture["body"])


@pytest.mark.parametrize("name", ["pi-02-r09-summarize", "pi-04-r05-summarize",
                                  "oc96-r13-summarize", "oc735-r16-summarize"])
def test_summarization_calls_are_recognised(name: str) -> None:
    found = signals(name)
    assert found.is_summarization
    assert found.summary_index is None and found.session_id is None
    assert is_summarization(load(name)["body"])


@pytest.mark.parametrize("name", ["pi-02-r03-tool", "pi-02-r11-post-compaction",
                                  "oc96-r03-tool", "oc96-r17-post-compaction",
                                  "oc735-r14-post-compaction"])
def test_agent_requests_are_not_summarization(name: str) -> None:
    assert not signals(name).is_summarization


def test_summarization_needs_all_three_marks() -> None:
    body = load("pi-02-r09-summarize")["body"]
    assert not is_summarization({**body, "tools": [{"type": "function"}]})
    assert not is_summarization({**body, "messages": [*body["messages"], body["messages"][1]]})
    user = {"role": "user", "content": "please summarize <conversation>"}
    assert not is_summarization({**body, "messages": [body["messages"][0], user]})


def test_pi_plain_request_has_no_identity_but_content_signals() -> None:
    found = signals("pi-02-r03-tool")
    assert (found.agent_id, found.session_id, found.runtime) == (None, None, None)
    assert found.summary_index is None and found.first_raw_index == 1
    assert found.raw_after_summary == 5  # u a u a t
    assert found.tool_call_ids == ("call_0efe83d3d93349ad",)
    assert found.latest_user_text == (
        "Turn two: USE_TOOL:bash please run a shell command and report.")
    assert found.style.user_prefix is False
    assert found.style.user_parts is True
    assert found.style.tool_ids_without_underscore is False
    assert found.style.internal_context is False


def test_pi_affinity_headers_and_prompt_cache_key() -> None:
    found = signals("pi-04-r02-affinity")
    assert found.session_id == PI_SESSION
    assert found.session_source == "header:session_id"
    assert found.header_session_id == found.prompt_cache_key == PI_SESSION
    after = signals("pi-04-r07-post-compaction")
    assert after.session_id == PI_SESSION and after.summary_index == 1
    assert after.raw_after_summary == 4  # a u a u
    new = signals("pi-04-r08-new-session")
    assert new.session_id == "01a22a43-de35-7298-8b89-32551d893fd3"


def test_pi_post_compaction_request() -> None:
    found = signals("pi-02-r11-post-compaction")
    assert found.summary_index == 1 and found.first_raw_index == 2
    assert found.raw_after_summary == 6  # a u a u a u (the first kept message is an assistant)
    assert found.latest_user_text == "Turn eight: short question after the manual compaction."


def test_openclaw_96_runtime_in_first_user_message() -> None:
    found = signals("oc96-r03-tool")
    assert found.runtime is not None and found.runtime.location == "first_user"
    assert (found.agent_id, found.agent_source) == ("main", "runtime")
    assert (found.session_id, found.session_source) == (OC96_SESSION, "runtime")
    assert found.session_key == "agent:main:main"
    assert found.raw_after_summary == 5  # u a u a t; the internal-context message excluded
    assert found.style.internal_context and found.style.user_prefix
    assert found.style.user_parts is False
    assert found.style.tool_ids_without_underscore is True
    assert found.tool_call_ids == ("callee6852ba1db54570",)
    assert found.latest_user_text == "Gateway turn two: USE_TOOL:exec please run a shell command"


def test_openclaw_96_after_compaction_runtime_is_a_summary_part() -> None:
    found = signals("oc96-r17-post-compaction")
    assert found.summary_index == 1
    assert found.runtime is not None and found.runtime.location == "summary"
    assert found.session_id == OC96_SESSION
    assert found.raw_after_summary == 6  # a u a u a t
    assert found.latest_user_text == "Gateway turn thirteen: USE_TOOL:read read AGENTS.md please"


def test_openclaw_96_overflow_retry_skips_the_synthetic_continue_turn() -> None:
    found = signals("oc96-r29-overflow-retry")
    assert found.summary_index == 1 and found.raw_after_summary == 2
    assert found.latest_user_text is not None
    assert found.latest_user_text.startswith("Gateway turn twenty (should overflow)")


def test_openclaw_96_idle_reset_gives_a_new_session_id() -> None:
    found = signals("oc96-r32-after-idle-reset")
    assert found.session_id == "5d1615c5-7597-45d9-ad20-61f5f30b2e0b"
    assert found.summary_index is None and found.raw_after_summary == 3
    assert found.latest_user_text == (
        "Gateway turn twenty-three: second turn in the idle-rolled session")


def test_openclaw_735_runtime_in_system_prompt() -> None:
    found = signals("oc735-r03-tool")
    assert found.runtime is not None and found.runtime.location == "system"
    assert found.session_id == OC735_SESSION and found.agent_id == "main"
    assert found.style.user_prefix and not found.style.internal_context
    assert found.style.tool_ids_without_underscore is True
    post = signals("oc735-r14-post-compaction")
    assert post.summary_index == 1 and post.raw_after_summary == 8
    assert post.session_id == OC735_SESSION
    assert post.latest_user_text == "v7 turn 08: USE_TOOL:exec run another command"
    reset = signals("oc735-r19-after-reset")
    assert reset.session_id == "fb627afb-3e64-41f1-8338-19d7854437a0"
    assert reset.latest_user_text == "v7 turn 11: first turn after sessions.reset"


def test_signal_precedence_path_then_header_then_runtime() -> None:
    fixture = load("oc96-r03-tool")
    body = fixture["body"]
    headers = {**fixture["headers"], "X-TailFloor-Agent": "from-header",
               "X-Session-Affinity": "affinity-id:3"}
    found = identify("from-path", headers, body)
    assert (found.agent_id, found.agent_source) == ("from-path", "path")
    assert (found.session_id, found.session_source) == ("affinity-id", "header:x-session-affinity")
    assert found.runtime is not None and found.runtime.session_id == OC96_SESSION
    found = identify(None, headers, body)
    assert (found.agent_id, found.agent_source) == ("from-header", "header")
    custom = Identification(session_headers=("x-conv",), agent_header=None)
    found = identify(None, {**headers, "X-Conv": "conv-1"}, {**body, "prompt_cache_key": "k:12"},
                     custom)
    assert (found.agent_id, found.session_id) == ("main", "conv-1")
    assert found.prompt_cache_key == "k"
    found = identify(None, {}, {**body, "prompt_cache_key": "sess-9:2"})
    assert (found.session_id, found.session_source) == ("sess-9", "prompt_cache_key")


def test_user_prefix_and_runtime_suffix_are_stripped() -> None:
    assert strip_user_prefix("[Mon 2026-11-30 02:27 UTC] hello") == "hello"
    assert strip_user_prefix("[Tue 2026-12-01 14:05:09 GMT+1] hi") == "hi"
    assert strip_user_prefix("[Sun 2026-11-29 23:59 America/New_York] x") == "x"
    assert strip_user_prefix("[note] kept") == "[note] kept"
    assert strip_user_prefix(
        "[Mon 2026-11-30 02:27 UTC] hi\n\nRuntime: agent=main | session=s") == "hi"
    assert strip_user_prefix("text mentions Runtime: agent=x inline") == (
        "text mentions Runtime: agent=x inline")


def test_agent_path_prefix() -> None:
    assert split_agent_path("/agents/main/v1/chat/completions") == ("main", "/v1/chat/completions")
    assert split_agent_path("/agents/ops%2Deu/chat/completions") == ("ops-eu", "/chat/completions")
    assert split_agent_path("/agents/x") == ("x", "/")
    assert split_agent_path("/v1/chat/completions") == (None, "/v1/chat/completions")
    assert split_agent_path("/agents/..%2Fetc/v1") == (None, "/agents/..%2Fetc/v1")


@pytest.mark.parametrize("body", [
    {}, {"messages": "x"}, {"messages": [None, 3, "s"]}, {"messages": [{"role": "user"}]},
    {"messages": [{"role": "system", "content": [{"text": 5}]}, {"role": "user", "content": 7}]},
    {"messages": [{"role": "assistant", "tool_calls": "no"}], "prompt_cache_key": 5},
])
def test_odd_bodies_never_crash(body: dict[str, Any]) -> None:
    odd_headers: Any = {"session_id": "", "x-tailfloor-agent": 5, "x-session-affinity": None}
    found = identify(None, odd_headers, body)
    assert found.session_id is None and not found.is_summarization
    assert found.agent_id is None


def test_runtime_line_must_start_a_line() -> None:
    body = {"messages": [{"role": "system", "content": "see Runtime: agent=evil | sessionId=x"},
                         {"role": "user", "content": "hi"}]}
    assert identify(None, {}, body).runtime is None


def test_tool_ids_are_the_newest_in_request_order() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for i in range(30):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}a", "type": "function", "function": {"name": "f"}},
            {"id": f"call_{i}b", "type": "function", "function": {"name": "f"}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}a", "content": "r"})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}b", "content": "r"})
    found = identify(None, {}, {"messages": messages})
    assert found.tool_call_ids == tuple(f"call_{i}{s}" for i in range(22, 30) for s in "ab")
    assert found.raw_after_summary == 90 and found.latest_user_text is None


def test_message_text_joins_text_parts() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "a"},
                                           {"type": "image_url", "image_url": {"url": "x"}},
                                           {"type": "text", "text": "b"}]}
    assert message_text(message) == "a\nb"
    assert message_text(None) == ""


def test_the_last_runtime_line_wins_over_text_quoting_one() -> None:
    body = load("oc96-r17-post-compaction")["body"]
    summary = body["messages"][1]
    quoted = "\nRuntime: agent=evil | session=agent:evil:main | sessionId=not-it\n"
    spoofed = {**summary, "content": [
        {**summary["content"][0], "text": summary["content"][0]["text"] + quoted},
        summary["content"][1]]}
    found = identify(None, {}, {**body, "messages": [body["messages"][0], spoofed,
                                                     *body["messages"][2:]]})
    assert found.runtime is not None
    assert (found.agent_id, found.session_id) == ("main", OC96_SESSION)


SUMMARY = {"role": "user", "content": [{"type": "text", "text": (
    "The conversation history before this point was compacted into the following summary:"
    "\n\n<summary>\n## Goal\nx\n</summary>")}]}
INTERNAL = {"role": "user", "content": [{"type": "text", "text": (
    "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nnone\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")}]}


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bool]:
    head: list[dict[str, Any]] = [{"role": "system", "content": "sys"}] * draw(st.integers(0, 2))
    with_summary = draw(st.booleans())
    if with_summary:
        head.append(SUMMARY)
    body: list[dict[str, Any]] = draw(st.lists(st.one_of(
        st.builds(lambda t: {"role": "user", "content": t}, st.text(max_size=8)),
        st.builds(lambda t: {"role": "user", "content": [{"type": "text", "text": t}]},
                  st.text(max_size=8)),
        st.builds(lambda t: {"role": "assistant", "content": t}, st.text(max_size=8)),
        st.just({"role": "tool", "tool_call_id": "c1", "content": "r"}),
        st.just(INTERNAL)), max_size=30))
    return head + body, with_summary


@settings(max_examples=300, deadline=None)
@given(requests())
def test_raw_tail_count_and_latest_user_text(case: tuple[list[dict[str, Any]], bool]) -> None:
    messages, with_summary = case
    found = identify(None, {}, {"messages": messages, "tools": [{"type": "function"}]})
    systems = sum(1 for m in messages if m["role"] == "system")
    after = messages[systems + (1 if with_summary else 0):]
    assert found.summary_index == (systems if with_summary else None)
    assert found.raw_after_summary == sum(1 for m in after if m is not INTERNAL)
    users = [m for m in after if m["role"] == "user" and m is not INTERNAL]
    expected = strip_user_prefix(message_text(users[-1])) if users else None
    assert found.latest_user_text == expected
    assert found.style.internal_context == any(m is INTERNAL for m in after)


def test_the_affinity_headers_of_pi_1_and_openclaw_name_the_session() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    # Pi 1.x: x-session-affinity and x-client-request-id, both its session id.
    pi = identify(None, {"x-client-request-id": "01a2-pi", "x-session-affinity": "01a2-pi"},
                  body)
    assert (pi.session_id, pi.session_source) == ("01a2-pi", "header:x-session-affinity")
    # x-client-request-id alone is enough; OpenClaw's "<id>:<count>" loses its count.
    alone = identify(None, {"X-Client-Request-Id": "01a2-oc:4"}, body)
    assert (alone.session_id, alone.session_source) == ("01a2-oc",
                                                         "header:x-client-request-id")
