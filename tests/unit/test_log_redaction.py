"""Credentials of every shape stay out of both log formats: in the message, in extra fields
and in tracebacks."""

from __future__ import annotations

import io
import logging

import pytest

from proxy import logs

QUOTED = [
    "Authorization: Bearer CANARYPLAIN456",
    "b'Authorization: Bearer CANARYBYTES01\\x01'",
    "proxy-authorization: Basic Q0FOQVJZQkFTSUM=",
    "x-api-key: gsk_CANARYGROQ0123456",
    "api-key=CANARYAZURE789",
    '{"authorization": "CANARYJSON321"}',
    "Cookie: session=CANARYCOOKIE77; other=1",
    "GET /v1/models?key=CANARYQUERY55&alt=json",
    "token sk-ant-CANARYANTH0123 leaked",
    "OPENAI_API_KEY=CANARYENV0001",
    "('x-api-key', 'CANARYTUPLE02')",
    "(b'x-api-key', b'CANARYBYTES03')",
    "{'api_key': b'CANARYDICT04'}",
    "https://user:CANARYURL05@example.test/v1",
    "client_secret=CANARYCLIENT06",
    "key AIzaSyCANARY07abcdefghijklmnop",
    "token ghp_CANARY08abcdefghijklmnopqrst",
    "jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.CANARY09abcdef",
]


def _logged(fmt: str, message: str, **extra: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs._JsonFormatter() if fmt == "json" else logs._TextFormatter())
    logger = logging.getLogger(f"test.redaction.{fmt}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    try:
        raise ValueError(message)
    except ValueError:
        logger.exception("quoting: %s", message, extra=extra)
    return stream.getvalue()


@pytest.mark.parametrize("fmt", ["json", "text"])
@pytest.mark.parametrize("quoted", QUOTED)
def test_a_quoted_credential_is_masked(fmt: str, quoted: str) -> None:
    out = _logged(fmt, quoted, model=quoted, count=3)
    assert "CANARY" not in out, out
    assert "[redacted]" in out


def test_words_that_only_look_like_names_are_left_alone() -> None:
    text = "not authorized to do that; the key point; a token of thanks"
    assert logs.redact(text) == text
