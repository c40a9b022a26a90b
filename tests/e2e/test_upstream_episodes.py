"""An upstream that cannot be reached, or refuses the agent's key, is said once per episode
in one clear line, and the client gets an answer in its dialect's shape each time."""

from __future__ import annotations

import urllib.error
import urllib.request

import orjson

from tests.conftest import ProxyProcess, free_port
from tests.fake_upstream import FakeUpstream, Reply


def post(proxy: ProxyProcess, path: str = "/v1/chat/completions") -> tuple[int, bytes]:
    body = orjson.dumps({"model": "fake-model", "max_tokens": 8, "stream": False,
                         "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(proxy.url + path, data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_an_unreachable_upstream_is_said_once_with_what_to_do() -> None:
    proxy = ProxyProcess(f"http://127.0.0.1:{free_port()}")
    try:
        answers = [post(proxy) for _ in range(4)] + [post(proxy, "/v1/messages")]
        for status, body in answers[:4]:
            assert status in (502, 503, 504) and "error" in orjson.loads(body), body
        anthropic = orjson.loads(answers[4][1])
        assert anthropic["type"] == "error", anthropic
        lines = [line for line in proxy.logs().splitlines() if "failed (connect)" in line]
        assert len(lines) == 1, lines
        assert "is the model server running" in lines[0] and "--upstream" in lines[0]
    finally:
        proxy.stop()


def test_refused_credentials_are_said_once_and_an_answer_ends_the_episode(
        fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    proxy = ProxyProcess(fake.url)
    refusal = orjson.dumps({"error": {"message": "Incorrect API key provided",
                                      "type": "invalid_request_error",
                                      "code": "invalid_api_key"}})
    try:
        for _ in range(3):
            clean_fake.script.append(Reply(status=401, raw_body=refusal))
        assert [post(proxy)[0] for _ in range(3)] == [401, 401, 401]
        refused = [line for line in proxy.logs().splitlines() if "refused a request" in line]
        assert len(refused) == 1 and "API key" in refused[0], refused
        assert post(proxy)[0] == 200
        clean_fake.script.append(Reply(status=401, raw_body=refusal))
        assert post(proxy)[0] == 401
        refused = [line for line in proxy.logs().splitlines() if "refused a request" in line]
        assert len(refused) == 2  # a new episode after an answer
    finally:
        proxy.stop()
