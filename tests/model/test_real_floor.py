"""The floor's restore counted against the real window: after Pi compacted, the floor puts back
raw messages from Pi's transcript, and the rewritten request goes to a real llama.cpp server
(SmolLM2-135M, n_ctx from conftest) whose window is far smaller than the rules' table says.

The oracle is the server: it answers 200 only to a prompt that fits, its usage is its own count
of what it read, and ``/apply-template`` + ``/tokenize`` count the restore the floor would have
made without trimming. The restored messages are checked against the transcript written here.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.floor.synthetic import Transcript, write_jsonl
from tests.model.conftest import ModelServer
from tests.model.relay import RecordingRelay

SID = "01a22a55-0000-7000-8000-0000000f100f"
MODEL = "fake-model"
OUTPUT = 8
ASKED = 12  # raw messages the floor restores before the kept ones (not only the shortfall)
PROSE = ("The nightly export reads the orders table, writes parquet files to the shared bucket "
         "and posts a short report to the team channel. When the warehouse is busy the export "
         "waits for a lock and sometimes gives up. ")
SUMMARY = "## Goal\nFix the flaky nightly export.\n\n## Next Steps\n- read the last logs"
PREFIX = ("The conversation history before this point was compacted into the following "
          "summary:\n\n<summary>\n")
# A tiny reserve, so what decides whether the request fits is the count of its messages,
# nothing the operator kept in hand; short summaries, so a regression (a refusal, then
# recovery) fails fast instead of waiting on the model.
RULES = """[defaults]
min_tail_messages = {asked}
reserve_tokens = 16
summary_max_tokens = 32

[[models]]
pattern = "fake*"
context_window = {window}
encoding = "o200k_base"
margin = {margin}
"""


def turns() -> list[tuple[str, str]]:
    return [(f"Turn {i}: " + PROSE * 4, f"Reply {i}: noted.") for i in range(10)]


def write_session(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Pi's transcript (ten turns, then a compaction keeping the last two), and the request
    Pi sends next: its system prompt, the summary, the kept turns and a new question."""
    t = Transcript(SID)
    ids = []
    for user, reply in turns():
        ids.append(t.user(user))
        t.assistant(reply)
    t.compaction(SUMMARY, ids[8])
    question = "What should I look at first?"
    t.user(question)
    write_jsonl(tmp_path / "sessions", t)
    kept = [m for user, reply in turns()[8:] for m in (
        {"role": "user", "content": user}, {"role": "assistant", "content": reply})]
    messages = [{"role": "system", "content": "You are a terse assistant for the data team."},
                {"role": "user", "content": PREFIX + SUMMARY + "\n</summary>"},
                *kept, {"role": "user", "content": question}]
    return tmp_path / "sessions", messages


def swallowed() -> list[dict[str, str]]:
    """The raw messages the compaction replaced, oldest first, as the transcript holds them."""
    return [m for user, reply in turns()[:8] for m in (
        {"role": "user", "content": user}, {"role": "assistant", "content": reply})]


def text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


@pytest.mark.parametrize("known", ["learned", "rules"])
def test_the_restore_is_trimmed_to_the_real_window(
        model_server: ModelServer, relay: RecordingRelay, tmp_path: Path, known: str) -> None:
    sessions, messages = write_session(tmp_path)
    rules = tmp_path / "rules"
    rules.mkdir()
    # learned: the table says 32000 (what the model could hold) and an earlier refusal by the
    # server teaches the real window; rules: the table names the server's n_ctx, with the
    # margin the README asks for a tokenizer tailfloor does not have
    window, margin = (32000, 0.0) if known == "learned" else (model_server.n_ctx, 0.2)
    (rules / "00.toml").write_text(RULES.format(asked=ASKED, window=window, margin=margin))
    proxy = ProxyProcess(relay.url, "--sessions", str(sessions), "--rules", str(rules),
                         "--state", str(tmp_path / "state"))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-local", max_retries=0,
                           timeout=600)
    try:
        if known == "learned":
            # another conversation of the model, over the window and with nothing to
            # compact: refused by the server, passed on, the window learned from its n_ctx
            with pytest.raises(openai.BadRequestError):
                client.chat.completions.create(
                    model=MODEL, max_tokens=1,
                    messages=[{"role": "user", "content": PROSE * 60}])
            assert "exceed_context_size_error" in relay.chats()[-1].answer.decode()
        relay.exchanges.clear()
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=OUTPUT)  # type: ignore[arg-type]
        raw.parse()
        verdict = raw.headers["x-tailfloor"]
        (sent,) = relay.chats()  # no refusal, no retry, no summarizer call
        assert sent.status == 200, (sent.answer, proxy.logs())
        usage = orjson.loads(sent.answer)["usage"]  # the server's own count
        assert usage["prompt_tokens"] + OUTPUT <= model_server.n_ctx
        out = sent.json()["messages"]
        restored = out[2:len(out) - (len(messages) - 2)]
        assert verdict.startswith("floor; restored=") and verdict.endswith("; capped"), verdict
        assert verdict == f"floor; restored={len(restored)}; capped"
        # the newest raw messages before the kept ones, as the transcript holds them
        assert 0 < len(restored) < ASKED
        assert [(m["role"], text(m)) for m in restored] == [
            (m["role"], m["content"]) for m in swallowed()[-len(restored):]]
        assert out[-(len(messages) - 2):] == messages[2:] and out[0] == messages[0]
        # what trimming avoided: the whole restore asked for would not fit by the server's
        # count
        whole = [*out[:2], *swallowed()[-ASKED:], *messages[2:]]
        assert model_server.prompt_tokens(whole) + OUTPUT > model_server.n_ctx
        assert proxy.sample("tailfloor_floor_capped_total") == 1
        assert proxy.sample("tailfloor_overflow_total") == (1 if known == "learned" else 0)
    finally:
        proxy.stop()


def test_apply_template_counts_what_usage_counts(model_server: ModelServer) -> None:
    """The oracle above is the server's own: its template-and-tokenize count of a request
    equals the prompt_tokens it reports when it serves that request."""
    messages = [{"role": "user", "content": "Say OK."}]
    body = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 1})
    request = urllib.request.Request(model_server.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        usage = orjson.loads(response.read())["usage"]
    assert usage["prompt_tokens"] == model_server.prompt_tokens(messages)
