"""Summarization request building, conversation serialization and the summary wrapper."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from proxy.recovery.summarize.prompt import (
    SYSTEM_PROMPT,
    build_request,
    readable_text,
    serialize_messages,
)
from proxy.wire.summary import COMPACTION_PREFIX as SUMMARY_PREFIX
from proxy.wire.summary import summary_message, unwrap_summary

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compaction"
CAPTURED: dict[str, Any] = json.loads((FIXTURES / "captured_requests.json").read_text())
SECTIONS = ["## Goal", "## Constraints & Preferences", "## Progress", "### Done",
            "### In Progress", "### Blocked", "## Key Decisions", "## Next Steps",
            "## Critical Context"]


def _user_text(body: dict[str, Any]) -> str:
    parts = body["messages"][1]["content"]
    assert isinstance(parts, list)
    return str(parts[0]["text"])


def test_new_summary_request_shape() -> None:
    body = build_request("[User]: hi", "qwen3-32b", 2048)
    assert body["model"] == "qwen3-32b"
    assert body["stream"] is False
    assert body["max_completion_tokens"] == 2048
    assert "tools" not in body and "tool_choice" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"].startswith("You are a context summarization assistant")
    text = _user_text(body)
    assert text.startswith("<conversation>\n[User]: hi\n</conversation>")
    positions = [text.index(s) for s in SECTIONS]
    assert positions == sorted(positions)  # every section, in the fixed order
    for kept in ("identifiers", "file paths", "numbers", "error messages", "exactly"):
        assert kept in text
    assert "<previous-summary>" not in text
    # same top-level keys as Pi's own summarization call, minus streaming-only options
    assert set(body) <= set(CAPTURED["pi_summarization_request_keys"]) | {"stream"}


def test_update_variant_carries_the_previous_summary() -> None:
    body = build_request("[User]: next", "m", 512, previous_summary="## Goal\nship v2",
                         token_field="max_tokens")
    assert body["max_tokens"] == 512 and "max_completion_tokens" not in body
    text = _user_text(body)
    assert "<previous-summary>\n## Goal\nship v2\n</previous-summary>" in text
    assert text.index("</previous-summary>") < text.index("<conversation>")
    assert "updated summary" in text
    assert all(s in text for s in SECTIONS)


def test_serializes_a_real_pi_request() -> None:
    messages = CAPTURED["pi_request8_messages"][1:]
    text = serialize_messages(messages)
    assert text.startswith("[User]: ")
    # the tool call reads as name(args) with the exact command, the result follows it
    call = ('[Assistant tool calls]: bash(command="echo hello-from-tool && uname -s")')
    assert call in text
    assert "[Tool result bash]: hello-from-tool\nLinux\n" in text
    assert text.index(call) < text.index("[Tool result bash]")
    assert text.count("[User]: ") == sum(1 for m in messages if m["role"] == "user")


def test_serializes_a_real_openclaw_request() -> None:
    messages = CAPTURED["oc_request18_messages"][1:]
    text = serialize_messages(messages)
    assert 'read(path="README.md")' in text
    assert "[Tool result read]: " in text
    assert "File not found: /home/agent/oc-work/README.md." in text
    assert "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>" in text


def test_tool_results_are_clipped_head_and_tail() -> None:
    output = "START " + "x" * 10_000 + " Traceback: KeyError: 'model'"
    messages: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash",
                                                          "arguments": '{"command":"make"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]
    text = serialize_messages(messages, tool_result_chars=300)
    assert "START" in text and "KeyError: 'model'" in text
    assert "characters omitted" in text
    assert len(text) < 600


def test_content_shapes() -> None:
    assert readable_text("plain") == "plain"
    assert readable_text(None) == ""
    assert readable_text([{"type": "text", "text": "a"}, {"type": "image_url",
                                                        "image_url": {"url": "data:..."}},
                         {"type": "input_audio"}, 7]) == "a\n[image]\n[input_audio]"
    odd = serialize_messages([
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "function": {"name": "f", "arguments": "not json"}},
            {"id": "y", "function": {"name": "g", "arguments": "[1, 2]"}},
            {"id": "z", "function": "broken"}]},
        {"role": "critic", "content": "hmm"},
        {"role": "system", "content": "be brief"},
    ])
    assert "f(not json); g([1, 2]); ?()" in odd
    assert "[critic]: hmm" in odd and "[System]: be brief" in odd


def test_summary_message_is_recognised_like_the_agents_own() -> None:
    message = summary_message("## Goal\nfix `proxy/app.py` (error E1234)\n")
    text = message["content"][0]["text"]
    assert text.startswith(SUMMARY_PREFIX)
    assert "<summary>" in text and "was compacted into the following summary" in text
    assert "take precedence" in text.split("</summary>")[1]
    assert unwrap_summary(message) == "## Goal\nfix `proxy/app.py` (error E1234)"


def test_unwrap_the_real_agent_summaries() -> None:
    pi = unwrap_summary(CAPTURED["pi_request11_summary_message"])
    assert pi is not None and pi.startswith("## Goal")
    assert "FAKE-SUMMARY-MARKER-7f3a" in pi and "</summary>" not in pi
    oc = unwrap_summary(CAPTURED["oc_request29_summary_message"])  # with the Runtime part after
    assert oc is not None and oc.startswith("## Latest unresolved user request")
    assert "Runtime:" not in oc


def test_unwrap_rejects_other_messages() -> None:
    assert unwrap_summary({"role": "user", "content": "<summary>x</summary>"}) is None
    assert unwrap_summary({"role": "assistant", "content": summary_message("x")["content"]}) is None
    branch = ("The following is a summary of a branch that this conversation came back from:"
              "\n\n<summary>\nx</summary>")
    assert unwrap_summary({"role": "user", "content": branch}) is None
    assert unwrap_summary({"role": "user", "content": SUMMARY_PREFIX + "\n</summary>"}) is None


def test_system_prompt_asks_for_a_summary_only() -> None:
    assert "Output only the summary" in SYSTEM_PROMPT
    assert orjson.dumps(build_request("", "m", 1))  # serializable as is
