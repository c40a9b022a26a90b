"""Requests with a long history, and a tailfloor process set up for overflow tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from tests.conftest import ProxyProcess
from tests.fake_behaviour import SUMMARY_MARKER, is_summarization
from tests.fake_upstream import FakeUpstream
from tests.inprocess import InProcessProxy

AUTH = "Bearer sk-overflow-test-0123456789"
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "


def text(tag: str, chars: int) -> str:
    """English-like filler (about 4.5 characters per token) that starts with ``tag``."""
    return (f"[{tag}] " + SENTENCE * (chars // len(SENTENCE) + 1))[:chars]


def history(tag: str, turns: int, chars: int = 1000) -> list[dict[str, Any]]:
    """A system prompt and ``turns`` user/assistant pairs of about ``chars`` characters each,
    with one tool exchange in the middle."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are agent {tag}."}]
    for n in range(turns):
        messages.append({"role": "user", "content": [
            {"type": "text", "text": f"turn {n}: " + text(f"{tag}u{n}", chars)}]})
        if n == turns // 2:
            call = f"call_{tag}_{n}"
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call, "type": "function",
                 "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]})
            messages.append({"role": "tool", "tool_call_id": call, "content": "README.md"})
        messages.append({"role": "assistant", "content": f"answer {n}: "
                         + text(f"{tag}a{n}", chars)})
    return messages


def rules_dir(tmp_path: Path, defaults: str = "", models: str = "", min_tail: int = 2) -> Path:
    directory = tmp_path / "rules"
    directory.mkdir(exist_ok=True)
    text = f"[defaults]\nmin_tail_messages = {min_tail}\n{defaults}\n{models}"
    path = directory / "00.toml"
    # Replicas sharing the directory are watching it: an identical rewrite would still
    # show them a truncated file for a moment.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return directory


def start(fake: FakeUpstream, tmp_path: Path, defaults: str = "", models: str = "", *,
          min_tail: int = 2) -> InProcessProxy:
    """tailfloor built in-process in front of ``fake`` (tests/inprocess.py)."""
    return InProcessProxy(fake, "--rules", str(rules_dir(tmp_path, defaults, models, min_tail)),
                          "--state", str(tmp_path / "state"), )


def post(proxy: ProxyProcess, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": AUTH})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, orjson.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = {"raw": raw.decode("utf-8", "replace")}
        return exc.code, parsed, dict(exc.headers)


def kinds(fake: FakeUpstream) -> list[str]:
    """What the fake saw, in order: summary (a summarization call) or chat."""
    out = []
    for received in fake.chat_requests():
        messages = orjson.loads(received.body)["messages"]
        out.append("summary" if is_summarization(messages) else "chat")
    return out


def carries_summary(received_body: bytes) -> bool:
    messages = orjson.loads(received_body)["messages"]
    return any(SUMMARY_MARKER in json.dumps(m) for m in messages[1:2])
