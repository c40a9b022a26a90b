"""Is this upstream answer a context overflow? Pure classification of status + body or SSE event.

Input is what the proxy holds when the upstream answered with an error: the HTTP status, the
content type and the body bytes (possibly empty, possibly not JSON), or the ``error`` event of
a stream. The answer is a frozen :class:`OverflowVerdict` that also carries the numbers the
error text states (the model's window, the prompt tokens measured), so the caller can learn the
real window of a model from its first overflow.

Order of checks, and why:

1. HTTP 429 is never an overflow: it is the status of rate limiting by definition, and its
   bodies mention tokens ("too many tokens per minute").
2. Exclusions (wire.md section 4) before anything else, for the same reason.
3. Structured shapes, which need no wording: OpenAI's ``error.code == "context_length_exceeded"``
   and llama.cpp's ``type == "exceed_context_size_error"`` (with ``n_ctx``/``n_prompt_tokens``).
4. The pattern table against every string of the error (message, type, code, OpenRouter's
   ``metadata.raw``...), plus the line an OpenAI SDK would print (``400 <message>`` or
   ``400 status code (no body)``), so the Cerebras empty-body row sees what agents see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.recovery.patterns import (
    EXCLUSIONS,
    OVERFLOW_ROWS,
    PatternRow,
    compile_row,
    numbers_from_text,
)

__all__ = [
    "InvalidPatternError",
    "OverflowDetector",
    "OverflowVerdict",
    "context_length_exceeded_body",
]

# Error bodies are small; a bound keeps the regex scan cheap against a hostile multi-MB answer.
_MAX_TEXT = 16 * 1024
_MAX_STRINGS = 64
_MESSAGE_KEEP = 500
_OVERFLOW_STATUSES_WITHOUT_BODY = frozenset({400, 413})
_RATE_LIMITED = 429


class InvalidPatternError(ValueError):
    """An extra overflow pattern from the rules is not a valid regular expression."""


@dataclass(frozen=True, slots=True)
class OverflowVerdict:
    is_overflow: bool
    pattern: str | None = None  # row name or structured signal that decided it
    shape: str = "none"  # openai | vllm | llamacpp | anthropic | json | text | empty | none
    excluded_by: str | None = None
    window: int | None = None  # the model's window, when the error states it
    prompt_tokens: int | None = None
    requested_output_tokens: int | None = None
    message: str = ""  # the error message, bounded, for logs


@dataclass(frozen=True, slots=True)
class _Parsed:
    shape: str
    message: str
    strings: tuple[str, ...]
    code: object
    error_type: str | None
    n_ctx: int | None
    n_prompt: int | None
    explicit: bool = False  # an ``error`` key or ``object: "error"``, not a guessed holder


class OverflowDetector:
    """Holds the compiled tables: the built-in rows plus extra patterns from the rules."""

    __slots__ = ("_exclusions", "_rows")

    def __init__(self, extra_patterns: Sequence[str] = ()) -> None:
        extra: list[PatternRow] = []
        for index, pattern in enumerate(extra_patterns):
            try:
                extra.append(compile_row(f"rules[{index}]", pattern, "rules"))
            except Exception as exc:  # re.error, and TypeError for a non-string from TOML
                raise InvalidPatternError(
                    f"overflow pattern {index} ({pattern!r}) is not a valid regex: {exc}"
                ) from exc
        self._rows: tuple[PatternRow, ...] = (*OVERFLOW_ROWS, *extra)
        self._exclusions: tuple[PatternRow, ...] = EXCLUSIONS

    @property
    def rows(self) -> tuple[PatternRow, ...]:
        return self._rows

    def classify_response(
        self, status: int, content_type: str | None, body: bytes
    ) -> OverflowVerdict:
        """Classify a complete non-2xx answer (or a 2xx JSON answer carrying an ``error``)."""
        if status == _RATE_LIMITED:
            return OverflowVerdict(False, excluded_by="status_429", shape="none")
        parsed = _parse_body(content_type, body)
        if status < 400 and not parsed.explicit:
            # a success body is only an error when it says so; never scan an answer's content
            return OverflowVerdict(False, shape=parsed.shape)
        return self._decide(status, parsed)

    def classify_stream_event(self, event: Mapping[str, Any]) -> OverflowVerdict:
        """Classify the parsed JSON of an SSE ``data:`` event that carries an ``error``."""
        parsed = _parse_json(event)
        if parsed is None or not parsed.explicit:
            return OverflowVerdict(False, shape="none")
        return self._decide(None, parsed)

    def classify_text(self, text: str) -> OverflowVerdict:
        """Classify a bare error message (e.g. an agent's recorded ``errorMessage``)."""
        text = text[:_MAX_TEXT]
        return self._decide(None, _Parsed("text", text, (text,), None, None, None, None))

    def _decide(self, status: int | None, parsed: _Parsed) -> OverflowVerdict:
        haystack = "\n".join(_candidate_lines(status, parsed))[:_MAX_TEXT]
        message = parsed.message[:_MESSAGE_KEEP]
        for row in self._exclusions:
            if row.regex.search(haystack):
                return OverflowVerdict(False, shape=parsed.shape, excluded_by=row.name,
                                       message=message)
        pattern = _structured_signal(parsed)
        if pattern is None:
            pattern = next((r.name for r in self._rows if r.regex.search(haystack)), None)
        if pattern is None:
            return OverflowVerdict(False, shape=parsed.shape, message=message)
        numbers = numbers_from_text(haystack)
        return OverflowVerdict(
            True,
            pattern=pattern,
            shape=parsed.shape,
            window=parsed.n_ctx if parsed.n_ctx is not None else numbers.window,
            prompt_tokens=parsed.n_prompt if parsed.n_prompt is not None else numbers.prompt_tokens,
            requested_output_tokens=numbers.output_tokens,
            message=message,
        )


def _structured_signal(parsed: _Parsed) -> str | None:
    if parsed.code == "context_length_exceeded":
        return "openai_code"
    if parsed.error_type == "exceed_context_size_error":
        return "llamacpp_type"
    return None


def _candidate_lines(status: int | None, parsed: _Parsed) -> Iterable[str]:
    yield from parsed.strings
    if status is not None:
        if parsed.shape == "empty" and status in _OVERFLOW_STATUSES_WITHOUT_BODY:
            yield f"{status} status code (no body)"
        elif parsed.message:
            yield f"{status} {parsed.message}"


def _parse_body(content_type: str | None, body: bytes) -> _Parsed:
    stripped = body[:_MAX_TEXT * 4].strip()
    if not stripped:
        return _Parsed("empty", "", (), None, None, None, None)
    if stripped[:1] in (b"{", b"[") or "json" in (content_type or "").lower():
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, list) and value and isinstance(value[0], dict):
            value = value[0]  # Gemini wraps some errors in a one-element array
        if isinstance(value, dict):
            parsed = _parse_json(value)
            if parsed is not None:
                return parsed
    text = stripped[:_MAX_TEXT].decode("utf-8", errors="replace")
    return _Parsed("text", text, (text,), None, None, None, None)


def _parse_json(value: Mapping[str, Any]) -> _Parsed | None:
    error = value.get("error")
    if isinstance(error, str):
        return _Parsed("json", error, (error,), None, None, None, None, explicit=True)
    if isinstance(error, Mapping):
        holder: Mapping[str, Any] = error
    elif value.get("object") == "error" or "message" in value or "detail" in value:
        holder = value  # vLLM's top-level error, FastAPI's {"detail": ...}, bare {"message": ...}
    else:
        return None
    message = _first_str(holder, "message", "detail", "msg")
    code = holder.get("code")
    error_type = holder.get("type") if isinstance(holder.get("type"), str) else None
    if value.get("type") == "error" and isinstance(error, Mapping):
        shape = "anthropic"
    elif error_type == "exceed_context_size_error" or "n_ctx" in holder:
        shape = "llamacpp"
    elif isinstance(code, int) and not isinstance(code, bool):
        shape = "vllm"
    else:
        shape = "openai"
    return _Parsed(
        shape=shape,
        message=message,
        strings=tuple(_strings(value)),
        code=code,
        error_type=error_type,
        n_ctx=_int_field(holder, "n_ctx"),
        n_prompt=_int_field(holder, "n_prompt_tokens"),
        explicit=isinstance(error, Mapping) or value.get("object") == "error",
    )


def _first_str(holder: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        item = holder.get(key)
        if isinstance(item, str) and item:
            return item
    return ""


def _int_field(holder: Mapping[str, Any], key: str) -> int | None:
    item = holder.get(key)
    if isinstance(item, int) and not isinstance(item, bool) and item > 0:
        return item
    return None


def _strings(value: object) -> list[str]:
    """Every string in the error object, breadth first and bounded (OpenRouter nests the
    provider's own error as a JSON string under ``metadata.raw``)."""
    found: list[str] = []
    queue: list[object] = [value]
    while queue and len(found) < _MAX_STRINGS:
        item = queue.pop(0)
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, Mapping):
            queue.extend(item.values())
        elif isinstance(item, list):
            queue.extend(item[:_MAX_STRINGS])
    return found


def context_length_exceeded_body(window: int, prompt_tokens: int | None = None) -> bytes:
    """The HTTP 400 body tailfloor answers when it cannot bring a request under the window.

    OpenAI's own shape and wording, so every agent's recovery recognises it: the OpenAI SDKs
    raise ``400 <message>`` and Pi/OpenClaw match ``maximum context length is N tokens``.
    """
    if prompt_tokens is not None:
        detail = f"However, your messages resulted in {prompt_tokens} tokens."
    else:
        detail = "The request could not be compacted to fit it."
    message = (
        f"This model's maximum context length is {window} tokens. {detail} "
        "Please reduce the length of the messages."
    )
    return orjson.dumps({"error": {
        "message": message,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }})

