"""Regressions of the one-request-context redesign, through a real ``tailfloor serve``.

- The floor and recovery read one policy: a rule that turns tailfloor off for an agent named
  by the agent header turns off both (recovery used to take the agent from the path only and
  still compacted the request before sending it).
- One client's 400 that does not say ``stream_options`` is refused (here: the client's own
  mistake in a field next to it) leaves usage injection on for the next streaming client.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import orjson

from tests.conftest import ProxyProcess
from tests.fake_upstream import FakeUpstream, Reply
from tests.inprocess import InProcessProxy
from tests.recovery.conversation import history

RULES = """[defaults]
min_tail_messages = 2

[[rules]]
name = "ops is left alone"
agent = "ops"
mode = "off"

[[models]]
pattern = "fake*"
context_window = 4000
encoding = "estimate"
margin = 0.0
"""


def post(proxy: ProxyProcess, body: dict[str, object], headers: dict[str, str]
         ) -> tuple[int, str]:
    request = urllib.request.Request(proxy.url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            response.read()
            return response.status, response.headers.get("x-tailfloor", "")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("x-tailfloor", "")


def test_an_agent_header_rule_turns_off_the_floor_and_recovery(clean_fake: FakeUpstream,
                                                               tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "00.toml").write_text(RULES)
    proxy = InProcessProxy(clean_fake, "--rules", str(rules))
    try:
        # Far over the 4000-token window: preflight would compact it for any other agent.
        body = {"model": "fake-model", "messages": history("ops", 12, 1500), "stream": False}
        status, verdict = post(proxy, body, {"x-tailfloor-agent": "ops"})
        assert status == 200 and verdict == "off"
        sent = clean_fake.chat_requests()
        assert len(sent) == 1 and orjson.loads(sent[0].body) == body  # no summary call
        assert proxy.sample("tailfloor_compactions_total") == 0
        # Without the header the same request is compacted before it is sent.
        clean_fake.received.clear()
        status, verdict = post(proxy, body, {})
        assert status == 200 and "preflight" in verdict, verdict
    finally:
        proxy.stop()


def test_a_400_not_about_stream_options_keeps_usage_injection_on(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    body = {"model": "fake-model", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    clean_fake.script.append(Reply(status=400, error={
        "message": "'stream_options.include_obfuscation' must be a boolean",
        "type": "invalid_request_error", "param": "stream_options.include_obfuscation",
        "code": None}))
    status, _ = post(proxy, body, {})
    assert status == 400
    post(proxy, body, {})
    last = orjson.loads(clean_fake.chat_requests()[-1].body)
    assert last["stream_options"] == {"include_usage": True}
    assert proxy.sample("tailfloor_upstream_errors_total", kind="stream_options_rejected") == 0


def unread(proxy: ProxyProcess, fake: FakeUpstream, body: dict[str, object]) -> None:
    """The body goes upstream byte for byte, unread, said in x-tailfloor and counted."""
    before = proxy.sample("tailfloor_identification_total", method="too_large")
    raw = json.dumps(body).encode()
    request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=raw,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        assert response.headers["x-tailfloor"] == "none; reason=too_large"
    assert fake.chat_requests()[-1].body == raw
    assert proxy.sample("tailfloor_identification_total", method="too_large") == before + 1


def test_a_body_of_too_many_objects_is_forwarded_unread(proxy: ProxyProcess,
                                                        clean_fake: FakeUpstream) -> None:
    """More than 50,000 JSON objects: parsing alone would stall every other request."""
    unread(proxy, clean_fake, {"model": "fake-model",
                               "messages": [{"role": "user", "content": "hi"}] * 60_000})


def test_a_body_of_too_many_values_is_forwarded_unread(proxy: ProxyProcess,
                                                       clean_fake: FakeUpstream) -> None:
    """Few objects but more than 100,000 JSON values: each a Python object once parsed, 15-20
    times the body's bytes, and seconds of one call that holds the interpreter."""
    unread(proxy, clean_fake, {"model": "fake-model", "metadata": [[]] * 150_000,
                               "messages": [{"role": "user", "content": "hi"}]})


def test_a_body_over_8_mib_streams_through_unread(proxy: ProxyProcess,
                                                  clean_fake: FakeUpstream) -> None:
    unread(proxy, clean_fake, {"model": "fake-model", "stream": False, "messages": [
        {"role": "user", "content": "x" * (9 * 1024 * 1024)}]})
