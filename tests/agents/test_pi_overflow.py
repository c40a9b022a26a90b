"""The real Pi agent behind tailfloor, with a fake upstream that enforces a small window."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agents.pi_agent import PI_VERSION, PiAgent
from tests.agents.sizing import PiPrompts
from tests.conftest import ProxyProcess
from tests.fake_behaviour import AgentBehaviour, is_summarization, size_usage, total_chars
from tests.fake_upstream import FakeUpstream
from tests.recovery.conversation import rules_dir

# Room above Pi's own fixed prompt (measured per release), in the fake's measures: two turns
# with long replies fit under ROOM_CHARS of text, a third does not; ROOM_TOKENS above the
# fixed prompt is a window Pi does not compact in before the large paste.
ROOM_CHARS = 7600
ROOM_TOKENS = 6800
PASTE_ROOM_CHARS = 25600


@pytest.fixture
def tailfloor(clean_fake: FakeUpstream, tmp_path: Path) -> Iterator[ProxyProcess]:
    process = ProxyProcess(clean_fake.url, "--rules", str(rules_dir(tmp_path)),
                           "--state", str(tmp_path / "state"))
    yield process
    process.stop()


def upstream_log(fake: FakeUpstream, max_chars: int) -> list[str]:
    """Each chat request the fake saw: summary (a summarization call), over (answered with the
    overflow error) or ok."""
    out = []
    for received in fake.chat_requests():
        messages = orjson.loads(received.body)["messages"]
        if is_summarization(messages):
            out.append("summary")
        else:
            out.append("over" if total_chars(messages) > max_chars else "ok")
    return out


def errors_in(pi: PiAgent) -> list[dict[str, Any]]:
    return [e for e in pi.entries() if e.get("type") == "message"
            and isinstance(e.get("message"), dict)
            and e["message"].get("stopReason") == "error"]  # type: ignore[union-attr]


def assistant_texts(pi: PiAgent) -> list[str]:
    texts = []
    for entry in pi.entries():
        message = entry.get("message")
        if entry.get("type") == "message" and isinstance(message, dict) \
                and message.get("role") == "assistant":
            texts.append("".join(p.get("text", "") for p in message.get("content") or []
                                 if isinstance(p, dict)))
    return texts


def test_pi_never_sees_the_overflow(tailfloor: ProxyProcess, clean_fake: FakeUpstream,
                                    tmp_path: Path, pi_prompt: PiPrompts) -> None:
    max_chars = pi_prompt(PI_VERSION).chars + ROOM_CHARS
    clean_fake.behaviour = AgentBehaviour(max_chars=max_chars)
    pi = PiAgent(tmp_path / "pi", tailfloor.url + "/v1", context_window=100000)
    pi.turn("Turn one: LONG_REPLY please")
    pi.turn("Turn two: LONG_REPLY again")
    assert upstream_log(clean_fake, max_chars) == ["ok", "ok"]
    assert "Fake reply" in pi.turn("Turn three: hello")  # the full history no longer fits
    assert upstream_log(clean_fake, max_chars)[2:] == ["over", "summary", "ok"]
    assert not errors_in(pi)
    assert tailfloor.sample("tailfloor_overflow_total", outcome="recovered") == 1

    # the following turns reuse the stored summary: no summarizer call, nothing over the window
    pi.turn("Turn four: still there?")
    assert "hello-from-tool" in pi.turn("Turn five: USE_TOOL:bash")
    assert upstream_log(clean_fake, max_chars)[5:] == ["ok", "ok", "ok"]
    assert tailfloor.sample("tailfloor_compactions_total", trigger="reused") == 3

    # the history grows again: the summary is updated (previous summary + new messages)
    pi.turn("Turn six: LONG_REPLY once more")
    pi.turn("Turn seven: and now?")
    assert upstream_log(clean_fake, max_chars)[8:] == ["ok", "over", "summary", "ok"]
    update = [r for r in clean_fake.chat_requests() if b"<previous-summary>" in r.body]
    assert update, "the second summary should update the first"
    assert not errors_in(pi)
    assert assistant_texts(pi)[-1].startswith("Fake reply")


def test_pi_keeps_a_good_answer_when_its_window_equals_the_upstreams(
        tailfloor: ProxyProcess, clean_fake: FakeUpstream, tmp_path: Path,
        pi_prompt: PiPrompts) -> None:
    """Pi's window = the upstream's (the window the fake's error names). The recovered
    answer's usage is that of Pi's full history, above the window; capped one below it Pi
    takes it as a normal answer and compacts on its threshold instead of discarding it as a
    silent overflow."""
    prompt = pi_prompt(PI_VERSION)
    window = prompt.tokens + ROOM_TOKENS
    max_chars = prompt.chars + PASTE_ROOM_CHARS
    clean_fake.behaviour = AgentBehaviour(max_chars=max_chars, window_tokens=window)
    pi = PiAgent(tmp_path / "pi", tailfloor.url + "/v1", context_window=window)
    pi.turn("Turn one: LONG_REPLY please")
    pi.turn("Turn two: LONG_REPLY again")
    big = "Turn three, a large paste: " + "The quick brown fox jumps over the lazy dog. " * 500
    answer = pi.turn(big)
    assert answer.startswith("Fake reply")
    # the fake's own measure of the request Pi sent is above the window
    over = next(r for r in clean_fake.chat_requests() if b"a large paste" in r.body)
    assert size_usage(orjson.loads(over.body), "")["prompt_tokens"] > window
    # Pi got the answer with prompt tokens one below the window, kept it, and compacted on its
    # threshold (its own summarization call) without sending the turn again
    assert upstream_log(clean_fake, max_chars) == ["ok", "ok", "over", "summary", "ok",
                                                   "summary"]
    last = [e["message"] for e in pi.entries() if e.get("type") == "message"][-1]
    assert isinstance(last, dict) and last["role"] == "assistant"
    assert last["stopReason"] == "stop"
    assert last["usage"]["input"] + last["usage"]["cacheRead"] == window - 1
    assert assistant_texts(pi)[-1] == answer.strip()
    assert [e["type"] for e in pi.entries()][-1] == "compaction"
    assert not errors_in(pi)
