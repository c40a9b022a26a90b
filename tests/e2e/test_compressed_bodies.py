"""Compressed request bodies on both routes, through a real ``tailfloor serve``.

The rule: gzip/deflate bodies reach the upstream decoded, with their own length and no
Content-Encoding, and exactly one request per client request; a body that does not
decode is a 400 ``invalid_body``; the body limit applies to the decoded size (413).
The fake upstream records bodies as they arrived on the wire (no decompression).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.e2e.rawhttp import RawAnswer, send_raw
from tests.fake_upstream import FakeUpstream
from tests.inprocess import InProcessProxy

LIMIT = 1024 * 1024
CHAT = orjson.dumps({"model": "m", "stream": False,
                     "messages": [{"role": "user", "content": "hello " * 200}]})
EMBED = orjson.dumps({"model": "e", "input": "text " * 500})


@pytest.fixture(scope="module")
def small_limit(fake: FakeUpstream) -> Iterator[ProxyProcess]:
    process = InProcessProxy(fake, "--max-body-bytes", str(LIMIT))
    yield process
    process.stop()


def post(proxy: ProxyProcess, path: str, body: bytes, encoding: str,
         extra: str = "") -> RawAnswer:
    head = (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Encoding: {encoding}\r\nContent-Length: {len(body)}{extra}")
    return send_raw(proxy.port, head.encode(), body)


@pytest.mark.parametrize("path,plain", [("/v1/chat/completions", CHAT),
                                        ("/v1/embeddings", EMBED)])
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "x-gzip"])
def test_compressed_bodies_arrive_decoded_as_one_request(
        small_limit: ProxyProcess, clean_fake: FakeUpstream, path: str, plain: bytes,
        encoding: str) -> None:
    packed = zlib.compress(plain) if encoding == "deflate" else gzip.compress(plain)
    for _run in range(3):
        clean_fake.reset()
        answer = post(small_limit, path, packed, encoding)
        assert answer.status == 200, answer.body
        b = send_raw(small_limit.port, b"GET /v1/after HTTP/1.1\r\nHost: t")
        assert orjson.loads(b.body)["path"] == "/v1/after"
        assert [r.path for r in clean_fake.received] == [path, "/v1/after"]
        seen = clean_fake.received[0]
        assert seen.body == plain
        assert "Content-Encoding" not in seen.headers
        if "Content-Length" in seen.headers:
            assert int(seen.headers["Content-Length"]) == len(plain)
        else:
            assert seen.headers.get("Transfer-Encoding") == "chunked"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
@pytest.mark.parametrize("body", [b"this is not gzip at all", gzip.compress(CHAT)[:-12],
                                  gzip.compress(CHAT)[:40] + b"\xff" * 40],
                         ids=["not-gzip", "truncated", "corrupt"])
def test_a_body_that_does_not_decode_is_invalid_body(
        small_limit: ProxyProcess, clean_fake: FakeUpstream, path: str, body: bytes) -> None:
    answer = post(small_limit, path, body, "gzip")
    assert answer.status == 400
    error = orjson.loads(answer.body)["error"]
    assert error["code"] == "invalid_body" and error["type"] == "invalid_request_error"
    assert clean_fake.received == []
    # The proxy and its upstream connections are still sound.
    assert send_raw(small_limit.port, b"GET /v1/models HTTP/1.1\r\nHost: t").status == 200
    assert [r.path for r in clean_fake.received] == ["/v1/models"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_a_gzip_bomb_is_413(small_limit: ProxyProcess, clean_fake: FakeUpstream,
                            path: str) -> None:
    bomb = gzip.compress(b"0" * (64 * LIMIT))  # 64 MiB of zeros in ~65 KB
    assert len(bomb) < LIMIT
    answer = post(small_limit, path, bomb, "gzip")
    assert answer.status == 413
    assert orjson.loads(answer.body)["error"]["code"] == "request_too_large"
    assert all(r.path != path or not r.completed for r in clean_fake.received)


def test_an_unknown_encoding_is_415_on_chat_and_passes_through_elsewhere(
        small_limit: ProxyProcess, clean_fake: FakeUpstream) -> None:
    answer = post(small_limit, "/v1/chat/completions", b"\x00\x01brotli?", "br")
    assert answer.status == 415
    assert orjson.loads(answer.body)["error"]["code"] == "unsupported_encoding"
    assert clean_fake.received == []
    answer = post(small_limit, "/v1/files", b"\x00\x01brotli?", "br")
    assert answer.status == 200
    seen = clean_fake.received[-1]
    assert seen.body == b"\x00\x01brotli?" and seen.headers["Content-Encoding"] == "br"
    assert seen.headers["Content-Length"] == str(len(b"\x00\x01brotli?"))


@pytest.mark.parametrize("over", [False, True], ids=["at-limit", "over-limit"])
def test_a_chunked_chat_body_that_arrives_at_once_is_held_to_the_limit(
        small_limit: ProxyProcess, clean_fake: FakeUpstream, over: bool) -> None:
    # The whole body arrives with the head (read without waiting): the limit still holds.
    pad = LIMIT - len(CHAT) + (1 if over else 0)
    body = CHAT[:-1] + b',"pad":"' + b" " * (pad - 9) + b'"}'
    assert len(body) == LIMIT + (1 if over else 0)
    framed = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
    answer = send_raw(small_limit.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                      b"Content-Type: application/json\r\nTransfer-Encoding: chunked", framed)
    if over:
        assert answer.status == 413
        assert orjson.loads(answer.body)["error"]["code"] == "request_too_large"
        assert all(r.path != "/v1/chat/completions" for r in clean_fake.received)
    else:
        assert answer.status == 200
        assert orjson.loads(clean_fake.received[-1].body)["pad"].strip() == ""
