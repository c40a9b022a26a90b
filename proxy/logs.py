"""Logging set-up: JSON or text lines, each carrying the request id, never a secret."""

from __future__ import annotations

import logging
import re
import sys
import time
from contextvars import ContextVar
from typing import Any

import orjson

REQUEST_ID: ContextVar[str] = ContextVar("tailfloor_request_id", default="-")

# Anything that looks like a credential is masked even if a message quotes it by mistake:
# the whole value of a credential header wherever a message quotes headers (scheme and all,
# whatever the key looks like), bearer tokens, credential query parameters, sk- keys.
_HEADER_SECRET = re.compile(
    r"(?i)(?<![A-Za-z0-9-])(authorization|proxy-authorization|x-api-key|api-key|api_key|apikey"
    r"|cookie|set-cookie|x-goog-api-key|client_secret|refresh_token|access_token|password"
    r"|passwd)(['\"]?\s*[:=]\s*b?['\"]?|['\"]\s*,\s*b?['\"])([^\r\n'\",}]+)")
_QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:api[_-]?key|key|token|access_token|auth|sig|signature|password|secret)=)"
    r"([^&#\s'\"]+)")
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)([^@\s/]+)(@)")
_BEARER = re.compile(r"(?i)(bearer\s+)([^\s'\",]+)")
_KEY = re.compile(
    r"\b(?:(?:sk|gsk|xai|sk-ant|sk-or)[-_][A-Za-z0-9_\-]{8,}|AIza[0-9A-Za-z_\-]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|hf_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})")

_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {"message"}


def redact(text: str) -> str:
    text = _HEADER_SECRET.sub(lambda m: m.group(1) + m.group(2) + "[redacted]", text)
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + "[redacted]", text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + "[redacted]" + m.group(3), text)
    text = _BEARER.sub(lambda m: m.group(1) + "[redacted]", text)
    return _KEY.sub("[redacted]", text)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": REQUEST_ID.get(),
            "msg": redact(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = (value if isinstance(value, int | float | bool) or value is None
                              else redact(str(value)))
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(entry, default=str).decode()


# What a text line must not carry raw: a client's value (a model name, a path, an id) could
# otherwise end the line and forge the next one, or drive the terminal (ESC sequences).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def escape_controls(text: str) -> str:
    """``text`` on one line: control characters as ``\\xNN`` / ``\\uNNNN`` escapes."""
    return _CONTROL.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                   else f"\\u{ord(m.group()):04x}"), text)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{key}={escape_controls(str(value))}" for key, value in record.__dict__.items()
            if key not in _RESERVED and not key.startswith("_"))
        line = (f"{self.formatTime(record)} {record.levelname:<7} {record.name} "
                f"[{escape_controls(REQUEST_ID.get())}] "
                f"{escape_controls(record.getMessage())}")
        if extras:
            line += " " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return redact(line)


def configure(log_format: str, level: str, access_log: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's access log would duplicate ours and prints raw request lines.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("tailfloor.access").setLevel(logging.INFO if access_log else logging.WARNING)
