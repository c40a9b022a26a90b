"""The export post's HTTP/1.1 framing, pure: the request head made once per endpoint, and a
collector's answer read whole however its bytes are split, bounded, and refused when it is
not HTTP/1.x or contradicts itself."""

from __future__ import annotations

import pytest

from proxy.telemetry.framing import (
    MAX_BODY,
    MAX_HEAD,
    MAX_LINES,
    Answer,
    AnswerError,
    request_head,
)

# (answer bytes, status, kept alive): each ends exactly at its last byte.
ANSWERS = {
    "length": (b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
               b"Content-Length: 5\r\n\r\n\x12\x03abc", 200, True),
    "empty": (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200, True),
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n"
                b"3;ext=1\r\n\x12\x01a\r\n2\r\nbc\r\n0\r\nX-Trailer: t\r\n\r\n", 200, True),
    "no content": (b"HTTP/1.1 204 No Content\r\nServer: c\r\n\r\n", 204, True),
    "interim first": (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\n"
                      b"content-length: 2\r\n\r\nok", 202, True),
    "closing": (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\n"
                b"Content-Length: 1\r\n\r\nx", 200, False),
    "http/1.0": (b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 200, False),
    "refused": (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 7"
                b"\r\n\r\nbusy...", 503, True),
    "no reason": (b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 200, True),
}


def read(pieces: list[bytes]) -> tuple[Answer, int]:
    """The answer fed ``pieces``; how many were fed when it said it was complete."""
    answer = Answer()
    for fed, piece in enumerate(pieces, 1):
        if answer.feed(piece):
            return answer, fed
    return answer, 0


@pytest.mark.parametrize("name", ANSWERS)
def test_an_answer_is_read_whole_wherever_its_bytes_are_split(name: str) -> None:
    raw, status, kept = ANSWERS[name]
    splits = [[raw[:i], raw[i:]] for i in range(1, len(raw))]
    splits += [[raw[i:i + 1] for i in range(len(raw))]]  # a byte at a time
    splits += [[raw[:i], raw[i:j], raw[j:]] for i in range(1, len(raw), 7)
               for j in range(i + 1, len(raw), 5)]
    for pieces in splits:
        answer, fed = read(pieces)
        assert fed == len(pieces), (name, pieces)  # complete with its last byte, not before
        assert (answer.status, answer.keep_alive, answer.done) == (status, kept, True)


@pytest.mark.parametrize("name", ["length", "chunked", "no content", "empty"])
def test_bytes_past_the_answer_leave_the_connection_unused(name: str) -> None:
    raw, status, _ = ANSWERS[name]
    answer, _ = read([raw + b"HTTP/1.1 200 OK\r\n"])
    assert answer.done and answer.status == status and not answer.keep_alive
    answer, _ = read([raw])
    assert answer.keep_alive
    assert answer.feed(b"X") and not answer.keep_alive  # fed once complete


def test_a_body_read_to_the_close_ends_with_the_close() -> None:
    answer = Answer()
    assert not answer.feed(b"HTTP/1.1 200 OK\r\nContent-Type: x\r\n\r\nsome")
    assert not answer.feed(b" more")
    assert answer.closed() and answer.status == 200 and not answer.keep_alive


@pytest.mark.parametrize("cut", [b"HTTP/1.1 200 O", b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n"
                                 b"\r\nab", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"
                                 b"\r\n\r\n4\r\nab"])
def test_an_answer_cut_short_by_the_close_is_an_error(cut: bytes) -> None:
    answer = Answer()
    assert not answer.feed(cut)
    with pytest.raises(AnswerError):
        answer.closed()


MALFORMED = {
    "not http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "http/2": b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
    "four digits": b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
    "two digits": b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n",
    "letters": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    "leading zero": b"HTTP/1.1 020 OK\r\nContent-Length: 0\r\n\r\n",
    "switched": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
    "two lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
    "signed length": b"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx",
    "list length": b"HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\nx",
    "empty length": b"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
    "gzip only": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",
    "chunked twice": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "no colon": b"HTTP/1.1 200 OK\r\nContent-Length 0\r\n\r\n",
    "space before colon": b"HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n",
    "folded": b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    "bad chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "chunk without crlf": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"1\r\nxyz",
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_answer_is_an_error_however_it_arrives(name: str) -> None:
    raw = MALFORMED[name]
    for pieces in ([raw], [raw[i:i + 1] for i in range(len(raw))]):
        answer = Answer()
        with pytest.raises(AnswerError):
            for piece in pieces:
                answer.feed(piece)
            answer.closed()  # what was not refused as it came is cut short


def test_an_answer_too_large_is_refused_before_its_body_is_read() -> None:
    answer = Answer()
    with pytest.raises(AnswerError, match="too large"):
        answer.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))


def test_a_head_too_large_or_with_too_many_lines_is_refused() -> None:
    with pytest.raises(AnswerError, match="too large"):
        answer = Answer()
        answer.feed(b"HTTP/1.1 200 OK\r\n")
        for _ in range(MAX_HEAD // 1000 + 1):
            answer.feed(b"X-Pad: " + b"a" * 1000 + b"\r\n")
    lines = b"".join(b"X-%d: 1\r\n" % n for n in range(MAX_LINES + 1))
    with pytest.raises(AnswerError, match="too many"):
        Answer().feed(b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 0\r\n\r\n")
    # As many as allowed is fine.
    lines = b"".join(b"X-%d: 1\r\n" % n for n in range(MAX_LINES - 1))
    assert Answer().feed(b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 0\r\n\r\n")


def test_bodies_past_the_bound_are_refused_as_they_arrive() -> None:
    chunked = Answer()
    chunked.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(AnswerError, match="too large"):
        for _ in range(MAX_BODY // 4096 + 1):
            chunked.feed(b"1000\r\n" + b"x" * 4096 + b"\r\n")
    closing = Answer()
    closing.feed(b"HTTP/1.0 200 OK\r\n\r\n")
    with pytest.raises(AnswerError, match="too large"):
        for _ in range(MAX_BODY // 4096 + 1):
            closing.feed(b"x" * 4096)
    # Chunk framing without data (empty extensions, endless trailers) is bounded too.
    trailers = Answer()
    trailers.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")
    with pytest.raises(AnswerError, match="too large"):
        for _ in range(10_000):
            trailers.feed(b"X-T: " + b"t" * 100 + b"\r\n")
    interim = Answer()
    with pytest.raises(AnswerError, match="too large"):
        for _ in range(100_000):
            interim.feed(b"HTTP/1.1 100 Continue\r\n\r\n")


def test_the_request_head_says_the_host_and_headers_and_leaves_the_length_to_the_post() -> None:
    head = request_head("/v1/traces?k=v", "collector.test", 4318, False,
                        {"x-key": "s3cret", "Content-Type": "application/x-protobuf"})
    assert head == (b"POST /v1/traces?k=v HTTP/1.1\r\nHost: collector.test:4318\r\n"
                    b"Accept-Encoding: identity\r\nx-key: s3cret\r\n"
                    b"Content-Type: application/x-protobuf\r\nContent-Length: ")
    assert request_head("/", "c.test", 443, True, {}) == (
        b"POST / HTTP/1.1\r\nHost: c.test\r\nAccept-Encoding: identity\r\nContent-Length: ")
    assert b"Host: [::1]:4318\r\n" in (request_head("/", "::1", 4318, False, {}) or b"")
    assert b"Host: xn--bcher-kva.test\r\n" in (request_head("/", "bücher.test", 80, False, {})
                                               or b"")


def test_the_post_frames_its_body_whatever_the_headers_say() -> None:
    head = request_head("/v1/traces", "c", 80, False, {
        "Content-Length": "1", "transfer-encoding": "chunked", "host": "other", "X-A": "é"})
    assert head == (b"POST /v1/traces HTTP/1.1\r\nAccept-Encoding: identity\r\n"
                    b"host: other\r\nX-A: \xe9\r\nContent-Length: ")


@pytest.mark.parametrize(("path", "host", "headers"), [
    ("/v1/tr aces", "c", {}), ("/v1/\x00", "c", {}), ("/v1/\u00e9", "c", {}),
    ("v1/traces", "c", {}), ("/", "c\r\nX-Injected: 1", {}),
    ("/", "c", {"x-key": "a\r\nX-Injected: 1"}), ("/", "c", {"x-key": "a\nb"}),
    ("/", "c", {"x key": "a"}), ("/", "c", {"": "a"}), ("/", "c", {"x-key": "\u20ac"}),
])
def test_a_head_that_cannot_carry_a_part_unchanged_is_refused(
        path: str, host: str, headers: dict[str, str]) -> None:
    assert request_head(path, host, 80, False, headers) is None
