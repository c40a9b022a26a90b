"""The real Pi agent, configured with a context window larger than the real server's, through a
real ``tailfloor serve`` to llama.cpp (SmolLM2-135M, n_ctx 1024):

    Pi -> front relay -> tailfloor -> back relay -> llama.cpp

The server's own ``exceed_context_size_error`` is the overflow. The oracles are the relays
(what Pi received, headers included; what the server was sent and answered, the server's usage
counts) and Pi's own session file (what Pi kept as the answer), never tailfloor's logs alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agents.pi_agent import PiAgent
from tests.conftest import ProxyProcess
from tests.model.conftest import ModelServer
from tests.model.relay import Exchange, RecordingRelay

# Pi's window is far past the server's: Pi never compacts on its own, the server refuses.
PI_WINDOW = 32000
N_CTX = 1024
OUTPUT = 8  # Pi's maxTokens: generation is the slow part on a loaded machine
# A short system prompt and no tools, so a 1024-token window holds a few turns of text.
PI_ARGS = ("--no-tools", "--no-context-files", "--no-extensions", "--no-skills",
           "--system-prompt", "You are a terse assistant for the data team.")
# The rules' row names a window as large as Pi's (a table written for the model, not for this
# server's n_ctx): only the server's refusal teaches tailfloor the real one. The small reserve
# and margin leave a 1024-token window room for the reused summary and the raw tail.
RULES = """[defaults]
min_tail_messages = 2
summary_max_tokens = 32
summarizer_timeout = 300
reserve_tokens = 64

[[models]]
pattern = "fake-model"
context_window = 32000
encoding = "o200k_base"
margin = 0.05
"""
PROSE = ("The nightly export reads the orders table, writes parquet files to the shared bucket "
         "and posts a short report to the team channel. When the warehouse is busy the export "
         "waits for a lock and sometimes gives up. ")


def paste(turn: int, repeats: int) -> str:
    return f"Turn {turn}. Notes on the export job: " + PROSE * repeats + " Reply in one line."


@pytest.fixture(scope="module")
def model_server() -> Iterator[ModelServer]:
    """A smaller window than the other modules': less for the model to read, a faster test."""
    server = ModelServer(n_ctx=N_CTX)
    yield server
    server.stop()


@pytest.fixture
def front(relay: RecordingRelay, tmp_path: Path) -> Iterator[tuple[ProxyProcess,
                                                                    RecordingRelay]]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "00.toml").write_text(RULES)
    proxy = ProxyProcess(relay.url, "--rules", str(rules), "--state", str(tmp_path / "state"))
    recording = RecordingRelay(proxy.url)
    relay.exchanges.clear()
    yield proxy, recording
    recording.stop()
    proxy.stop()


def pi_answers(pi: PiAgent) -> list[dict[str, Any]]:
    return [e["message"] for e in pi.entries()  # type: ignore[misc]
            if e.get("type") == "message" and isinstance(e.get("message"), dict)
            and e["message"].get("role") == "assistant"]  # type: ignore[union-attr]


def text_of(message: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in message.get("content") or []
                   if isinstance(p, dict))


def shape(chats: list[Exchange]) -> list[str]:
    return [("summary" if e.is_summary else "chat") + f":{e.status}" for e in chats]


def streamed_text(exchange: Exchange) -> str:
    """The content the server streamed in one answer (its SSE deltas joined)."""
    out = []
    for line in exchange.answer.splitlines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            for choice in orjson.loads(line[6:]).get("choices") or []:
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def usage_of(exchange: Exchange) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in exchange.answer.splitlines():
        if line.startswith(b"data: {"):
            found = orjson.loads(line[6:]).get("usage") or found
    return found


def test_pi_gets_a_real_answer_when_the_real_server_refuses_its_history(
        model_server: ModelServer, relay: RecordingRelay,
        front: tuple[ProxyProcess, RecordingRelay], tmp_path: Path) -> None:
    proxy, pi_side = front
    pi = PiAgent(tmp_path / "pi", pi_side.url + "/v1", context_window=PI_WINDOW,
                 max_tokens=OUTPUT, args=PI_ARGS)
    # two short turns, then a paste that takes Pi's history past the server's window
    for turn, repeats in enumerate((3, 3, 14), 1):
        pi.turn(paste(turn, repeats), timeout=180)
    assert shape(relay.chats()) == ["chat:200", "chat:200", "chat:400", "summary:200",
                                    "chat:200"], proxy.logs()
    refused, summary, retry = relay.chats()[2:]
    error = orjson.loads(refused.answer)["error"]  # the server's own words
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == model_server.n_ctx
    pi_request = pi_side.chats()[2]
    assert refused.json()["messages"] == pi_request.json()["messages"]  # sent as Pi sent it
    assert pi_request.headers["x-tailfloor"] == "compacted:overflow"
    # the real model wrote the summary the retry opens with, and the retry fits by the
    # server's own count (its usage), the output Pi asked for included
    written = orjson.loads(summary.answer)["choices"][0]["message"]["content"].strip()
    assert written and written in orjson.dumps(retry.json()["messages"][:3]).decode()
    assert retry.json()["messages"][-1] == pi_request.json()["messages"][-1]
    assert usage_of(retry)["prompt_tokens"] + OUTPUT <= model_server.n_ctx
    assert f"learned the context window of fake-model: {model_server.n_ctx}" in proxy.logs()

    # the next turn: Pi's whole history again, over the window by the server's count; the
    # learned window (not the rules' 32000) has tailfloor reuse the stored summary at once:
    # no refusal, no summarizer call
    pi.turn(paste(4, 1), timeout=180)
    follow, = relay.chats()[5:]
    assert pi_side.chats()[3].headers["x-tailfloor"] == "reused"
    assert model_server.prompt_tokens(pi_side.chats()[3].json()["messages"]) \
        > model_server.n_ctx
    assert follow.status == 200 and not follow.is_summary
    assert follow.json()["messages"][:2] == retry.json()["messages"][:2]
    assert usage_of(follow)["prompt_tokens"] + OUTPUT <= model_server.n_ctx

    # Pi kept a real answer every turn: what the server streamed, never an error
    answers = pi_answers(pi)
    assert len(answers) == 4
    assert all(a["stopReason"] in ("stop", "length") for a in answers), answers
    sent_back = [e for e in relay.chats() if not e.is_summary and e.status == 200]
    assert [text_of(a).strip() for a in answers] == [streamed_text(e).strip()
                                                     for e in sent_back]
    assert all(text_of(a).strip() for a in answers)
    assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 1
    assert proxy.sample("tailfloor_compactions_total", trigger="reused") == 1
