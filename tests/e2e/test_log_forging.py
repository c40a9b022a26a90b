"""A client's values cannot forge a log line: a model name, an agent id, a path, a session id
or a request id holding a newline, a carriage return or an escape sequence stays on its
request's own line, escaped in the text format and one JSON string in the JSON format.

Through a real ``tailfloor serve`` process writing its log to a file (what an operator
reads); the oracle is a count of that file's lines, one access line per request sent.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.fake_upstream import FakeUpstream

FORGED = "x\n2026-12-02 06:00:00,000 ERROR   tailfloor [-] FORGED-LINE\x1b[31m\r\nFORGED2"
_LINE_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR)\s")


def _post(proxy: ProxyProcess, target: str, body: bytes, headers: dict[str, str]
          ) -> tuple[int, bool]:
    """One request on a raw socket (a client library would refuse some of these bytes):
    its status, and whether tailfloor's handler answered it (aiohttp's parser refuses some
    header bytes itself, before any handler: no access line is due then)."""
    head = [f"POST {target} HTTP/1.1", f"Host: 127.0.0.1:{proxy.port}",
            "Content-Type: application/json", f"Content-Length: {len(body)}",
            "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head_bytes = answer.split(b"\r\n\r\n", 1)[0].lower()
    return int(answer.split(b" ", 2)[1]), b"\r\nx-tailfloor-request-id:" in head_bytes


def _chat(model: str, **fields: object) -> bytes:
    return orjson.dumps({"model": model, "stream": False, **fields,
                         "messages": [{"role": "user", "content": "hi"}]})


# (target, body, headers): each forges one client-controlled value of a log line.
CASES = [
    ("/v1/chat/completions", _chat(FORGED), {}),
    ("/v1/responses", orjson.dumps({"model": FORGED, "input": "hi"}), {}),
    ("/v1/messages", orjson.dumps({"model": FORGED, "max_tokens": 8,
                                   "messages": [{"role": "user", "content": "hi"}]}), {}),
    ("/agents/FORGED%0a2026-12-02%2006:00:00,000%20ERROR%1b[31m/v1/chat/completions",
     _chat("fake-model"), {}),
    ("/v1/chat/completions%0d%0aFORGED-LINE%1b[31m", _chat("fake-model"), {}),
    ("/v1/chat/completions", _chat("fake-model", session_id=FORGED,
                                   prompt_cache_key=FORGED), {}),
    ("/v1/chat/completions", _chat("fake-model"),
     {"x-tailfloor-session": "FORGED-LINE\x1b[31m\x7f", "x-request-id": "FORGED\x1b[2J",
      "x-session-affinity": "FORGED\x1b]0;title\x07"}),
    # what an HTTP parser lets through in a header value: tabs and bytes 0x80-0xff, the C1
    # controls (0x85 is a line break to some readers, 0x9b a terminal's CSI)
    ("/v1/chat/completions", _chat("fake-model"),
     {"x-tailfloor-session": "FORGED\x85LINE\x9b31m\tx", "x-request-id": "FORGED\x9b2J",
      "x-session-affinity": "FORGED\x85\x9b"}),
]


@pytest.fixture(scope="module", params=["text", "json"])
def logged(request: pytest.FixtureRequest, fake: FakeUpstream) -> Iterator[ProxyProcess]:
    process = ProxyProcess(fake.url, "--access-log", "--log-level", "DEBUG",
                           "--log-format", request.param)
    process.fmt = request.param  # type: ignore[attr-defined]
    yield process
    process.stop()


def test_every_forged_value_stays_on_its_request_s_line(logged: ProxyProcess,
                                                        clean_fake: FakeUpstream) -> None:
    before = logged.logs()
    handled = 0
    for target, body, headers in CASES:
        status, ours = _post(logged, target, body, headers)
        assert status < 500
        # Every answer from a handler is tailfloor's own (a path aiohttp's router cannot
        # match would get its plain-text 404).
        assert ours or any("\x1b" in v for v in headers.values()), (target, status)
        handled += ours
    assert handled == len(CASES) - 1  # only the control bytes in headers stop at the parser
    logged.sample("tailfloor_requests_total", route="chat_completions", model="fake-model",
                  status="200")  # settled: every access line is written
    written = logged.logs()[len(before):]
    for raw in ("\x1b", "\r", "\x07", "\x85", "\x9b", "\u2028"):
        assert raw not in written, repr(raw)
    lines = written.splitlines()
    if logged.fmt == "json":  # type: ignore[attr-defined]
        entries = [orjson.loads(line) for line in lines]
        access = [e for e in entries if e.get("logger") == "tailfloor.access"]
        assert any("FORGED-LINE" in str(e.get("model")) for e in access)
    else:
        for line in lines:
            assert _LINE_START.match(line) or line.startswith(("Traceback", "  ", "\t")), line
        assert not any(line.startswith("2026-12-02 06:00:00,000") for line in lines)
        access = [line for line in lines if " tailfloor.access " in line]
    assert len(access) == handled, "\n".join(map(str, access))
    assert "FORGED" in written  # the values are there, escaped, not dropped


# ------------------------------------------------ errors decided before the body is read
@pytest.mark.parametrize("target,headers,code", [
    ("/agents/a%20b/v1/messages", {}, "invalid_request_target"),
    ("/v1/messages", {"Transfer-Encoding": "gzip, chunked"}, "invalid_header"),
    ("/agents/a%20b/v1/chat/completions", {}, "invalid_request_target"),
    ("/v1/chat/completions", {"Transfer-Encoding": "gzip, chunked"}, "invalid_header"),
])
def test_an_early_error_has_the_path_s_shape(proxy: ProxyProcess, target: str,
                                             headers: dict[str, str], code: str) -> None:
    body = b"{}"
    head = [f"POST {target} HTTP/1.1", f"Host: 127.0.0.1:{proxy.port}",
            "Content-Type: application/json", "Connection: close",
            *(f"{k}: {v}" for k, v in headers.items())]
    if "Transfer-Encoding" not in headers:
        head.append(f"Content-Length: {len(body)}")
        payload = body
    else:
        payload = b"2\r\n{}\r\n0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert 400 <= status < 500, answer
    error = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    if target.endswith("/v1/messages"):
        assert error["type"] == "error" and isinstance(error["error"]["message"], str), error
        assert "code" not in error["error"] or error["error"].get("code") == code
    else:
        assert error["error"]["code"] == code, error
