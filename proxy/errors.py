"""The exceptions the request path raises, and the one place they become HTTP answers.

    ProxyError                    an answer the client gets instead of the upstream's
    +-- BadRequest                400: the body is not a JSON object
    +-- BodyTooLarge              413: over --max-body-bytes
    +-- UpstreamUnavailable       502: could not connect, or the connection broke before an answer
    +-- UpstreamTimeout           504: no answer within the timeouts

Every error body has the OpenAI shape ``{"error": {"message", "type", "code", "param"}}`` so
SDKs and agents surface a readable message instead of a parse failure.
"""

from __future__ import annotations

import orjson


class ProxyError(Exception):
    status = 500
    error_type = "server_error"
    code = "internal_error"
    reason = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ProxyError):
    status = 400
    error_type = "invalid_request_error"
    code = "invalid_json"
    reason = "invalid_json"


class BodyTooLarge(ProxyError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"
    reason = "too_large"


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


def error_body(message: str, error_type: str, code: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}})


def to_response_parts(exc: ProxyError) -> tuple[int, bytes]:
    """(HTTP status, OpenAI-shaped JSON body) for a proxy error."""
    return exc.status, error_body(exc.message, exc.error_type, exc.code)
