"""Overflow recovery through a real tailfloor process and the fake upstream."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import orjson
import pytest

from proxy.recovery.summarize.transport import summarizer_headers
from tests.conftest import ProxyProcess
from tests.fake_behaviour import (
    SUMMARY_MARKER,
    SUMMARY_TEXT,
    AgentBehaviour,
    is_summarization,
    overflow_error,
    total_chars,
)
from tests.fake_upstream import FakeUpstream, Reply
from tests.recovery.conversation import (
    AUTH,
    carries_summary,
    history,
    kinds,
    post,
    rules_dir,
    start,
)

MAX_CHARS = 9000


def body(messages: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {"model": "fake-model", "messages": messages, "max_completion_tokens": 256, **extra}


def test_overflow_is_summarized_retried_and_remembered(clean_fake: FakeUpstream,
                                                       tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    messages = [*history("a", 8, 700), {"role": "user", "content": "what now?"}]
    proxy = start(clean_fake, tmp_path)
    try:
        status, answer, headers = post(proxy, body(messages))
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"].startswith("Fake reply")
        assert headers["x-tailfloor"] == "compacted:overflow"
        assert kinds(clean_fake) == ["chat", "summary", "chat"]
        first, summarizing, retry = clean_fake.chat_requests()
        assert orjson.loads(first.body) == body(messages)
        assert summarizing.headers["Authorization"] == AUTH  # the client's own credentials
        assert retry.headers["Authorization"] == AUTH
        sent = orjson.loads(retry.body)["messages"]
        assert sent[0] == messages[0] and carries_summary(retry.body)
        assert "follow this summary verbatim" in orjson.dumps(sent[1]).decode()  # rules' note
        assert sent[2:] == messages[-2:]  # the raw tail: min_tail_messages = 2
        # the client is told the usage of what it sent, capped below the learned window
        upstream_prompt = len(orjson.dumps(sent)) // 4
        assert upstream_prompt < answer["usage"]["prompt_tokens"] <= 8191
        assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 1
        assert proxy.sample("tailfloor_compactions_total", trigger="overflow") == 1
        assert proxy.sample("tailfloor_summarizer_duration_seconds_count") == 1
        assert proxy.sample("tailfloor_tokens_removed_total") > 0

        # the next turn repeats the whole history: the stored summary replaces it, no new call
        clean_fake.received.clear()
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "and then?"}]
        status, answer, headers = post(proxy, body(messages))
        assert status == 200 and headers["x-tailfloor"] == "reused"
        assert kinds(clean_fake) == ["chat"]
        assert carries_summary(clean_fake.chat_requests()[0].body)
        assert proxy.sample("tailfloor_compactions_total", trigger="reused") == 1
    finally:
        proxy.stop()

    # a restart keeps the compaction (same --state)
    clean_fake.received.clear()
    proxy = start(clean_fake, tmp_path)
    try:
        status, answer, headers = post(proxy, body(messages))
        assert status == 200 and headers["x-tailfloor"] == "reused"
        assert kinds(clean_fake) == ["chat"]
    finally:
        proxy.stop()


def test_streaming_overflow_with_the_openai_sdk(clean_fake: FakeUpstream, tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    messages = [*history("s", 8, 700), {"role": "user", "content": "stream please"}]
    proxy = start(clean_fake, tmp_path)
    try:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=AUTH.split()[1], max_retries=0,
                               timeout=30)
        stream = client.chat.completions.create(
            model="fake-model", messages=messages, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True})
        chunks = list(stream)
        reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert reply.startswith("Fake reply")
        usage = chunks[-1].usage
        assert usage is not None and 0 < usage.prompt_tokens <= 8191
        assert kinds(clean_fake) == ["chat", "summary", "chat"]
        assert orjson.loads(clean_fake.chat_requests()[1].body)["stream"] is False
        assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 1
    finally:
        proxy.stop()


def test_second_overflow_answers_400_for_the_agent(clean_fake: FakeUpstream,
                                                   tmp_path: Path) -> None:
    clean_fake.script.extend([Reply(status=400, error=overflow_error(50000)),
                              Reply(text=SUMMARY_TEXT),
                              Reply(status=400, error=overflow_error(40000))])
    proxy = start(clean_fake, tmp_path)
    try:
        status, answer, _ = post(proxy, body(history("b", 8, 700)))
        assert status == 400
        assert answer["error"]["code"] == "context_length_exceeded"
        assert "maximum context length is 8192 tokens" in answer["error"]["message"]
        assert len(clean_fake.chat_requests()) == 3  # never a second retry
        assert proxy.sample("tailfloor_overflow_total", outcome="failed") == 1
    finally:
        proxy.stop()


def test_summarizer_failure_falls_back_to_dropping(clean_fake: FakeUpstream,
                                                   tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    clean_fake.script.extend([Reply(status=400, error=overflow_error(50000)),
                              Reply(status=503, error={"message": "summarizer down"})])
    messages = history("c", 8, 700)
    proxy = start(clean_fake, tmp_path)
    try:
        status, answer, headers = post(proxy, body(messages))
        assert status == 200, answer
        assert headers["x-tailfloor"] == "dropped:overflow"
        retry = orjson.loads(clean_fake.chat_requests()[2].body)["messages"]
        assert retry[0] == messages[0] and "[tailfloor]" in orjson.dumps(retry[1]).decode()
        assert retry[-2:] == messages[-2:]
        assert SUMMARY_MARKER not in orjson.dumps(retry).decode()
        assert proxy.sample("tailfloor_summarizer_failures_total") == 1
        assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == 1
        # a failing summarizer is left alone for a while: the next overflow drops at once
        clean_fake.received.clear()
        status, _, headers = post(proxy, body(history("c2", 8, 700)))
        assert status == 200 and headers["x-tailfloor"] == "dropped:overflow"
        assert kinds(clean_fake) == ["chat", "chat"]
        assert proxy.sample("tailfloor_summarizer_failures_total") == 2
    finally:
        proxy.stop()


def test_learned_window_drives_the_next_preflight(clean_fake: FakeUpstream,
                                                  tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    proxy = start(clean_fake, tmp_path)
    try:
        status, _, _ = post(proxy, body(history("d", 8, 700)))  # teaches "8192 tokens"
        assert status == 200
        clean_fake.received.clear()
        # another session, far above 8192 - reserve by our estimate: compacted before sending
        status, _, headers = post(proxy, body(history("e", 16)))
        assert status == 200 and headers["x-tailfloor"] == "compacted:preflight"
        seen = kinds(clean_fake)  # a long history is summarized in chunks, never sent whole
        assert seen[-1] == "chat" and set(seen[:-1]) == {"summary"}
        assert proxy.sample("tailfloor_compactions_total", trigger="preflight") == 1
    finally:
        proxy.stop()


def test_passthrough_rule_returns_the_upstream_error(clean_fake: FakeUpstream,
                                                     tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    proxy = start(clean_fake, tmp_path, defaults='on_overflow = "passthrough"')
    try:
        status, answer, _ = post(proxy, body(history("f", 8, 700)))
        assert status == 400 and "(chars=" in answer["error"]["message"]  # the fake's own text
        assert kinds(clean_fake) == ["chat"]
        assert proxy.sample("tailfloor_overflow_total", outcome="passthrough") == 1
    finally:
        proxy.stop()


def test_silent_overflow_compacts_the_next_request(clean_fake: FakeUpstream,
                                                   tmp_path: Path) -> None:
    models = ('[[models]]\npattern = "fake-model"\ncontext_window = 8192\n'
              'encoding = "o200k_base"\nmargin = 0.2\n')
    clean_fake.script.append(Reply(usage={"prompt_tokens": 9000, "completion_tokens": 5,
                                          "total_tokens": 9005}))
    messages = history("g", 6)
    proxy = start(clean_fake, tmp_path, models=models)
    try:
        status, _answer, _ = post(proxy, body(messages))
        assert status == 200
        assert proxy.sample("tailfloor_overflow_total", outcome="silent") == 1
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
        status, _, headers = post(proxy, body(messages))
        assert status == 200 and headers["x-tailfloor"] == "compacted:preflight"
        assert kinds(clean_fake) == ["chat", "summary", "chat"]
    finally:
        proxy.stop()


def test_overflow_inside_a_stream_is_passed_on_and_counted(clean_fake: FakeUpstream,
                                                           tmp_path: Path) -> None:
    event = {"error": {"message": "This model's maximum context length is 8192 tokens. However, "
                                  "your messages resulted in 9100 tokens.",
                       "type": "invalid_request_error", "code": "context_length_exceeded"}}
    chunks = [b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",'
              b'"choices":[{"index":0,"delta":{"content":"par"},"finish_reason":null}]}\n\n',
              b"data: " + orjson.dumps(event) + b"\n\n"]
    clean_fake.script.append(Reply(chunks=chunks))
    messages = history("m", 6)
    proxy = start(clean_fake, tmp_path)
    try:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=AUTH.split()[1], max_retries=0,
                               timeout=30)
        received = []
        # the SDK raises the error event: it reached the client
        with pytest.raises(openai.APIError, match="maximum context length"):
            for chunk in client.chat.completions.create(
                    model="fake-model", messages=messages, stream=True):  # type: ignore[arg-type]
                received.extend(c.delta.content or "" for c in chunk.choices)
        assert "par" in received
        assert proxy.sample("tailfloor_overflow_total", outcome="mid_stream") == 1
        # the request's own overflow, not the upstream failing: no upstream error alert
        assert proxy.sample("tailfloor_upstream_errors_total", kind="error_event") == 0
        assert len(clean_fake.chat_requests()) == 1  # never retried once bytes went out
        # the session's next request is compacted before it is sent
        messages += [{"role": "user", "content": "again"}]
        status, _, headers = post(proxy, body(messages))
        assert status == 200 and headers["x-tailfloor"] == "compacted:preflight"
        assert kinds(clean_fake)[1:] == ["summary", "chat"]
    finally:
        proxy.stop()


def test_an_upstream_counting_more_than_us_gets_a_shorter_retry(clean_fake: FakeUpstream,
                                                                tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    messages = history("u", 8, 700)
    proxy = start(clean_fake, tmp_path, min_tail=6)
    try:
        status, answer, _ = post(proxy, body(messages))  # overflow, stored with 6 raw kept
        assert status == 200
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "next"}]
        clean_fake.received.clear()
        # the reused request fits by our count, but this upstream counts 20000 tokens
        error = overflow_error(0)
        error["message"] = ("This model's maximum context length is 8192 tokens. However, "
                            "your messages resulted in 20000 tokens.")
        clean_fake.script.append(Reply(status=400, error=error))
        status, _, headers = post(proxy, body(messages))
        assert status == 200 and headers["x-tailfloor"] == "compacted:overflow"
        assert kinds(clean_fake) == ["chat", "summary", "chat"]
        first, summarizing, retry = clean_fake.chat_requests()
        assert len(orjson.loads(first.body)["messages"]) == 2 + 6 + 2  # summary + tail + new
        assert b"<previous-summary>" in summarizing.body  # the stored summary is updated
        # cut by the upstream's measure: only the current turn stays raw
        assert orjson.loads(retry.body)["messages"][2:] == messages[-1:]
    finally:
        proxy.stop()


def test_concurrent_overflows_of_one_session_share_one_summary(clean_fake: FakeUpstream,
                                                               tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    messages = history("p", 8, 700)
    proxy = start(clean_fake, tmp_path)
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: post(proxy, body(messages)), range(4)))
        assert [status for status, _, _ in results] == [200] * 4
        assert kinds(clean_fake).count("summary") == 1
        sent = [orjson.loads(r.body)["messages"] for r in clean_fake.chat_requests()]
        overflowed = sum(total_chars(m) > MAX_CHARS for m in sent if not is_summarization(m))
        assert overflowed >= 1  # the rest came after the summary was stored: reused at once
        assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == overflowed
    finally:
        proxy.stop()


def test_without_state_compactions_live_as_long_as_the_process(clean_fake: FakeUpstream,
                                                               tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    messages = history("n", 8, 700)
    proxy = ProxyProcess(clean_fake.url, "--rules", str(rules_dir(tmp_path)))
    try:
        assert post(proxy, body(messages))[0] == 200
        status, _, headers = post(proxy, body(messages))
        assert status == 200 and headers["x-tailfloor"] == "reused"
        assert kinds(clean_fake).count("summary") == 1
        line = next(line for line in proxy.logs().splitlines() if "no --state" in line)
        scratch = Path(orjson.loads(line)["msg"].split(" kept in ")[1].split(" until ")[0])
        assert (scratch / "compactions.sqlite3").exists()
    finally:
        proxy.stop()
    assert not scratch.exists()  # removed when tailfloor stopped


def test_the_summarizer_gets_the_clients_credentials_and_no_body_headers() -> None:
    headers = summarizer_headers({"Authorization": "Bearer k", "Content-Type": "application/json",
                                  "Content-Length": "99", "Content-Encoding": "gzip",
                                  "Accept": "text/event-stream", "Connection": "keep-alive",
                                  "x-stainless-lang": "js"})
    lowered = {k.lower(): v for k, v in headers.items()}
    assert lowered["authorization"] == "Bearer k" and lowered["x-stainless-lang"] == "js"
    assert lowered["accept"] == "application/json"
    assert not {"content-type", "content-length", "content-encoding", "connection"} & set(lowered)


def test_a_guessed_window_never_makes_a_silent_overflow(clean_fake: FakeUpstream,
                                                        tmp_path: Path) -> None:
    # fake-model has no row in the model table: 128000 is only the unknown-model default
    clean_fake.script.append(Reply(usage={"prompt_tokens": 150000, "completion_tokens": 5,
                                          "total_tokens": 150005}))
    proxy = start(clean_fake, tmp_path)
    try:
        assert post(proxy, body(history("q", 2)))[0] == 200
        assert proxy.sample("tailfloor_overflow_total", outcome="silent") == 0
    finally:
        proxy.stop()


def test_an_unusable_state_directory_degrades_to_a_private_one(clean_fake: FakeUpstream,
                                                               tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proxy = ProxyProcess(clean_fake.url, "--rules", str(rules_dir(tmp_path)),
                         "--state", str(blocker / "state"))
    try:
        assert post(proxy, body(history("r", 8, 700)))[0] == 200  # still recovers
        assert "cannot use --state" in proxy.logs()
    finally:
        proxy.stop()


def test_a_summarizer_timeout_falls_back_in_time(clean_fake: FakeUpstream,
                                                 tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=MAX_CHARS)
    clean_fake.script.extend([Reply(status=400, error=overflow_error(50000)),
                              Reply(text=SUMMARY_TEXT, delay_before_headers=2.5)])
    proxy = start(clean_fake, tmp_path, defaults="summarizer_timeout = 0.5")
    try:
        status, _, headers = post(proxy, body(history("t", 8, 700)))
        assert status == 200 and headers["x-tailfloor"] == "dropped:overflow"
        # tailfloor gave up on the summary and answered: the summarizer's call was left
        # before the fake's answer came (it was never completed).
        summary_call = clean_fake.chat_requests()[1]
        assert b"summar" in summary_call.body.lower() and not summary_call.completed
        assert proxy.sample("tailfloor_summarizer_failures_total") == 1
        assert "summarizer failed (timeout" in proxy.logs()
    finally:
        proxy.stop()


def test_an_overflow_pattern_from_the_rules_is_recognised(clean_fake: FakeUpstream,
                                                          tmp_path: Path) -> None:
    clean_fake.script.append(Reply(status=500, raw_body=b"backend: prompt way too big (42)"))
    proxy = start(clean_fake, tmp_path, defaults="overflow_patterns = ['way too big']")
    try:
        status, _, headers = post(proxy, body(history("w", 8, 700)))
        assert status == 200 and headers["x-tailfloor"] == "compacted:overflow"
        assert kinds(clean_fake) == ["chat", "summary", "chat"]
    finally:
        proxy.stop()
    clean_fake.received.clear()
    clean_fake.script.append(Reply(status=500, raw_body=b"backend: prompt way too big (42)"))
    proxy = start(clean_fake, tmp_path)  # without the pattern: an ordinary error, passed on
    try:
        status, _, _ = post(proxy, body(history("x", 8, 700)))
        assert status == 500 and kinds(clean_fake) == ["chat"]
    finally:
        proxy.stop()
