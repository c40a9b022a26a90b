"""The exceptions the request path raises, and the one place they become HTTP answers.

    ProxyError                    an answer the client gets instead of the upstream's
    +-- Rejected                  4xx: the client's request is refused, never sent upstream
    |   +-- BadRequest            400 invalid_json: the body is not a JSON object
    |   +-- InvalidBody           400 invalid_body: a compressed body that does not decompress
    |   +-- InvalidTarget         400 invalid_request_target: a path or query that cannot be
    |   |                         forwarded safely (control characters, dot segments, "*")
    |   +-- InvalidHeader         400 invalid_header: a header value with CR, LF or NUL
    |   +-- BodyTooLarge          413: over --max-body-bytes (compressed or decompressed)
    |   +-- UnsupportedEncoding   415: a chat body in an encoding tailfloor cannot read
    +-- UpstreamUnavailable       502: could not connect, or the connection broke before an answer
    +-- UpstreamTimeout           504: no answer within the timeouts

Every error body has the OpenAI shape ``{"error": {"message", "type", "code", "param"}}`` so
SDKs and agents surface a readable message instead of a parse failure.
"""

from __future__ import annotations

from typing import TypeVar

import orjson

_E = TypeVar("_E", bound=BaseException)


class ProxyError(Exception):
    status = 500
    error_type = "server_error"
    code = "internal_error"
    reason = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Rejected(ProxyError):
    """The client's request is refused before anything reaches the upstream."""

    status = 400
    error_type = "invalid_request_error"


class BadRequest(Rejected):
    code = "invalid_json"
    reason = "invalid_json"


class InvalidBody(Rejected):
    code = "invalid_body"
    reason = "invalid_body"


class InvalidTarget(Rejected):
    code = "invalid_request_target"
    reason = "invalid_target"


class InvalidHeader(Rejected):
    code = "invalid_header"
    reason = "invalid_header"


class BodyTooLarge(Rejected):
    status = 413
    code = "request_too_large"
    reason = "too_large"


class BodyTimeout(Rejected):
    status = 408
    code = "request_timeout"
    reason = "body_timeout"


class Busy(Rejected):
    """Too many request bytes held at once: the client should retry shortly."""

    status = 503
    error_type = "server_error"
    code = "busy"
    reason = "busy"


class ShuttingDown(Rejected):
    """The drain began before the request's body had arrived."""

    status = 503
    error_type = "server_error"
    code = "shutting_down"
    reason = "shutting_down"


class UnsupportedEncoding(Rejected):
    status = 415
    code = "unsupported_encoding"
    reason = "unsupported_encoding"


class UpstreamUnavailable(ProxyError):
    status = 502
    error_type = "upstream_error"
    code = "upstream_unavailable"
    reason = "connect"


class UpstreamTimeout(ProxyError):
    status = 504
    error_type = "upstream_error"
    code = "upstream_timeout"
    reason = "timeout"


class AnswerTooLarge(ProxyError):
    status = 502
    error_type = "upstream_error"
    code = "upstream_answer_too_large"
    reason = "answer_too_large"




def error_body(message: str, error_type: str, code: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}})


def to_response_parts(exc: ProxyError) -> tuple[int, bytes]:
    """(HTTP status, OpenAI-shaped JSON body) for a proxy error."""
    return exc.status, error_body(exc.message, exc.error_type, exc.code)


def unlinked(exc: _E) -> _E:
    """``exc``, and every exception chained to it, without the frames it was raised through.

    A traceback holds each frame of the raise and, through them, whatever those frames hold:
    the upstream connection that keeps its error, the trail that keeps the failure, the
    relay's outcome. The exception held by one of them closes a cycle that only the garbage
    collector frees, and only once it walks the generation it sits in: a request in flight
    during a full collection has its objects frozen until the hourly thaw
    (``server/full_collections.py``). Nothing reads these tracebacks (the errors are answers,
    not bugs), so what keeps an expected failure, or chains it, keeps it without them; a
    bug's exception keeps its frames for the log. The context is walked too: an exception
    that an enclosing ``except`` still handles would lose its frames, so none may be there."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        link = todo.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        link.__traceback__ = None
        todo.extend(chained for chained in (link.__cause__, link.__context__)
                    if chained is not None)
    return exc
