"""Token counts for chat requests, offline.

The tables, ``o200k_base`` and ``cl100k_base``, come with tailfloor
(``proxy/encoding_tables.py``). When one cannot be loaded (package missing, file damaged)
counting falls back to Pi's estimate (characters / 4, an image as 4800 characters) and a
warning is logged once.

Counts follow OpenAI's documented accounting for chat messages: each message costs its content
plus a few tokens of framing, and every reply is primed with 3 tokens. They are exact for
OpenAI models only; for other models the caller passes a ``margin`` and the count grows by it.

Per-message counts are cached by a hash of the message's JSON bytes, so the growing
conversation of one session costs one tokenization per new message, not per request. A
caller that only asks whether a request fits can have a bound instead (``request_within``):
the new messages' JSON sizes, no tokenization at all while that bound fits.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import orjson

from proxy.encoding_tables import ESTIMATE, TABLES, EncodingUnavailable, load_bundled_encoding

__all__ = [
    "ENCODINGS",
    "ESTIMATE",
    "IMAGE_CHARS",
    "EncodingUnavailable",
    "Encodings",
    "EstimateTokenizer",
    "RequestTokens",
    "TiktokenTokenizer",
    "TokenCounter",
    "Tokenizer",
    "load_bundled_encoding",
]

log = logging.getLogger(__name__)

ENCODINGS: tuple[str, ...] = (*TABLES, ESTIMATE)
# Pi's estimator counts an image as 4800 characters (1200 tokens); base64 data must never be
# tokenized as text, it would count a screenshot as a novel.
IMAGE_CHARS = 4800
_IMAGE_PARTS = ("image_url", "input_image", "image")
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 3  # OpenAI: <|start|>{role/name}\n{content}<|end|>\n
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3  # framing of one function call; OpenAI does not document it exactly
REPLY_PRIMING = 3  # every reply is primed with <|start|>assistant<|message|>

class Tokenizer(Protocol):
    name: str
    exact: bool

    def count(self, text: str) -> int: ...


class TiktokenTokenizer:
    """tiktoken's count, cut into pieces: one pathological text (megabytes of one repeated
    character) makes its regex recurse until it panics, and costs quadratic time; pieces of
    ``PIECE`` characters keep both bounded. A text over ``ESTIMATE_ABOVE`` characters is
    estimated: counting it exactly would take seconds of CPU for no decision it changes."""

    PIECE = 16_384
    ESTIMATE_ABOVE = 1_000_000

    def __init__(self, encoding: Any) -> None:
        self.name: str = encoding.name
        self.exact = True
        self._encode: Callable[[str], list[int]] = encoding.encode_ordinary

    def count(self, text: str) -> int:
        if not text:
            return 0
        if len(text) > self.ESTIMATE_ABOVE:
            return -(-len(text) // CHARS_PER_TOKEN)
        try:
            if len(text) <= self.PIECE:
                return len(self._encode(text))
            piece = self.PIECE
            return sum(len(self._encode(text[i:i + piece])) for i in range(0, len(text), piece))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # tiktoken's Rust core panics (a BaseException) on some input
            return -(-len(text) // CHARS_PER_TOKEN)


class EstimateTokenizer:
    def __init__(self) -> None:
        self.name = ESTIMATE
        self.exact = False

    def count(self, text: str) -> int:
        return -(-len(text) // CHARS_PER_TOKEN)


class Encodings:
    """Tokenizers by encoding name, loaded on first use; failures degrade to the estimate.

    With ``background`` (the server), a table is loaded in a worker thread on first use and
    the estimate answers until it is there: a table costs ~0.4 s and ~45 MB, so a proxy that
    never needs one neither waits nor pays for it, and no request blocks the event loop.
    """

    def __init__(self, loader: Callable[[str], Any] = load_bundled_encoding,
                 background: bool = False) -> None:
        self._loader = loader
        self._loaded: dict[str, Tokenizer] = {ESTIMATE: EstimateTokenizer()}
        self.degraded: dict[str, str] = {}  # encoding name -> why the estimate is used
        self._background = background
        self._loading: set[str] = set()

    def get(self, name: str) -> Tokenizer:
        """The tokenizer for ``name``; loads it on first use, the estimate if that fails."""
        tokenizer = self._loaded.get(name)
        if tokenizer is not None:
            return tokenizer
        if self._background:
            if name not in self._loading:
                self._loading.add(name)
                threading.Thread(target=self._load, args=(name,), daemon=True,
                                 name=f"tailfloor-tokenizer-{name}").start()
            return self._loaded[ESTIMATE]
        return self._load(name)

    def settled(self, name: str) -> bool:
        """Whether ``name`` counts the way it will from now on (not the estimate standing in
        while its table loads): only such counts may be compared with an upstream's."""
        return name in self._loaded

    def _load(self, name: str) -> Tokenizer:
        started = time.perf_counter()
        try:
            tokenizer: Tokenizer = TiktokenTokenizer(self._loader(name))
            log.info("tokenizer %s loaded in %.2f s; token counts are exact from now on", name,
                     time.perf_counter() - started)
        except Exception as exc:  # any loader failure must degrade, never break a request
            self.degraded[name] = str(exc)
            log.warning("tokenizer %s unavailable (%s); token counts are estimates "
                        "(characters/4) from now on", name, exc)
            tokenizer = self._loaded[ESTIMATE]
        self._loaded[name] = tokenizer
        return tokenizer


@dataclass(frozen=True, slots=True)
class RequestTokens:
    messages: int
    tools: int
    max_output: int
    exact: bool

    @property
    def total(self) -> int:
        return self.messages + self.tools + self.max_output


def _content_parts(content: object) -> tuple[list[str], int]:
    """Texts to tokenize and a character estimate for everything else (images, audio...)."""
    if isinstance(content, str):
        return [content], 0
    texts: list[str] = []
    other_chars = 0
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind in _IMAGE_PARTS:
                other_chars += IMAGE_CHARS
            elif isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind not in ("text", None):
                # Audio, files and future part types: estimate from their JSON size.
                other_chars += len(orjson.dumps(part))
    return texts, other_chars


def _raw_message_tokens(message: Mapping[str, Any], tokenizer: Tokenizer) -> int:
    count = tokenizer.count
    total = TOKENS_PER_MESSAGE
    role = message.get("role")
    if isinstance(role, str):
        total += count(role)
    if isinstance(message.get("name"), str):
        total += TOKENS_PER_NAME + count(message["name"])
    texts, other_chars = _content_parts(message.get("content"))
    for key in ("reasoning_content", "reasoning", "thinking"):
        value = message.get(key)
        if isinstance(value, str):
            texts.append(value)
    total += sum(count(t) for t in texts)
    total += -(-other_chars // CHARS_PER_TOKEN)
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        for call in tool_calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            total += TOKENS_PER_TOOL_CALL
            for key in ("name", "arguments"):
                if isinstance(function.get(key), str):
                    total += count(function[key])
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        total += count(call_id)
    return total


_HASH_BITS, _SIZE_BITS = 64, 48


def _packed(encoding: int, size: int, digest: int) -> int:
    """A count's key in one int: the encoding's number, the JSON's size and its hash."""
    return ((encoding << _SIZE_BITS | size) << _HASH_BITS) | (digest & ((1 << _HASH_BITS) - 1))


def _json_size(key: int) -> int:  # of the message a key was made of
    return (key >> _HASH_BITS) & ((1 << _SIZE_BITS) - 1)


class TokenCounter:
    """Counts chat requests, remembering per-message counts.

    The memory is two generations of at most ``cache_size / 2`` entries each: hits in the
    young one cost a dict lookup, hits in the old one are promoted, and when the young one
    fills up the old one is dropped. That approximates an LRU without per-hit bookkeeping."""

    def __init__(self, encodings: Encodings | None = None, cache_size: int = 65536) -> None:
        self.encodings = encodings if encodings is not None else Encodings()
        # Keyed by one int (``_packed``): 112 bytes a count kept, where a tuple of the
        # encoding's name, the JSON's size and its hash took 199 (tracemalloc, 65,536 counts).
        self._young: dict[int, int] = {}
        self._old: dict[int, int] = {}
        self._encoding_ids: dict[str, int] = {}
        self._ids_lock = threading.Lock()
        self._generation = max(1, cache_size // 2)
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    @property
    def bound(self) -> int:
        """The most counts remembered at once (both generations full)."""
        return 2 * self._generation

    def _cached(self, tokenizer: Tokenizer, value: object, compute: Callable[[], int]) -> int:
        """``compute()``, remembered by ``value``'s JSON bytes."""
        key = self._key(tokenizer, value)
        if key is None:  # not JSON (a caller bug or exotic input): count, don't cache
            return compute()
        found = self._recalled(key)
        if found is None:
            self.misses += 1
            found = compute()
        self._remember(key, found)
        return found

    def _key(self, tokenizer: Tokenizer, value: object) -> int | None:
        try:
            blob = orjson.dumps(value)
        except TypeError:
            return None
        encoding = self._encoding_ids.get(tokenizer.name)
        if encoding is None:
            with self._ids_lock:
                encoding = self._encoding_ids.setdefault(tokenizer.name,
                                                         len(self._encoding_ids))
        # Python's own 64-bit bytes hash plus the length: 3x cheaper than a digest, and a
        # collision (practically impossible at this cache size) only skews one count.
        return _packed(encoding, len(blob), hash(blob))

    def _recalled(self, key: int) -> int | None:
        found = self._young.get(key)
        if found is None:
            found = self._old.get(key)
        if found is not None:
            self.hits += 1
        return found

    def _remember(self, key: int, count: int) -> None:
        if key in self._young:
            return
        if len(self._young) >= self._generation:
            self._old = self._young
            self._young = {}
        self._young[key] = count

    def message(self, message: Mapping[str, Any], encoding: str) -> int:
        """Tokens of one message (content and framing), without margin."""
        tokenizer = self.encodings.get(encoding)
        return self._cached(tokenizer, message, lambda: _raw_message_tokens(message, tokenizer))

    def per_message(self, messages: Sequence[object], encoding: str) -> list[int]:
        """Tokens of each message, in order (0 for entries that are not objects)."""
        tokenizer = self.encodings.get(encoding)
        cached = self._cached
        out: list[int] = []
        for m in messages:
            if isinstance(m, dict):
                out.append(cached(tokenizer, m, partial(_raw_message_tokens, m, tokenizer)))
            else:
                out.append(0)
        return out

    def request_within(self, body: Mapping[str, Any], encoding: str, margin: float,
                       fits: Callable[[int], bool]) -> tuple[int, bool]:
        """``request(...).total`` when it decides something, else a bound above it; and
        whether it is the count. A message whose count is not remembered is bounded by its
        JSON size (a text token holds at least one byte, and the JSON holds every text,
        key and framing besides; images are counted, their estimate is not their size).
        When ``fits`` takes the bound, nothing is tokenized; otherwise those messages are
        counted (and remembered) and the count returned."""
        messages = body.get("messages")
        tokenizer = self.encodings.get(encoding)
        counts: list[int] = []
        unknown: list[tuple[int, dict[str, Any], int]] = []
        for m in messages if isinstance(messages, list) else ():
            if not isinstance(m, dict):
                counts.append(0)
                continue
            key = self._key(tokenizer, m)
            found = self._recalled(key) if key is not None else None
            if found is not None and key is not None:
                self._remember(key, found)  # an old generation's count stays
            elif found is None:
                if key is not None and not _pictured(m):
                    unknown.append((len(counts), m, key))
                    # the JSON's size, and the framing (``{}`` counts more than its 2 bytes)
                    counts.append(_json_size(key) + TOKENS_PER_MESSAGE)
                    continue
                found = self._cached(tokenizer, m, partial(_raw_message_tokens, m, tokenizer))
            counts.append(found)
        fixed = with_margin(self.tools(body.get("tools"), encoding), margin) \
            + requested_output(body)
        bound = with_margin(REPLY_PRIMING + sum(counts), margin) + fixed
        if not unknown or fits(bound):
            return bound, not unknown
        for at, m, key in unknown:
            # the same message earlier in this request (its generation may have turned since)
            known = self._young.get(key)
            if known is None:
                known = self._old.get(key)
            if known is None:
                self.misses += 1
                known = _raw_message_tokens(m, tokenizer)
                self._remember(key, known)
            counts[at] = known
        return with_margin(REPLY_PRIMING + sum(counts), margin) + fixed, True

    def tools(self, tools: object, encoding: str) -> int:
        if not tools:
            return 0
        tokenizer = self.encodings.get(encoding)
        return self._cached(tokenizer, tools,
                            lambda: tokenizer.count(orjson.dumps(tools).decode()))

    def request(self, body: Mapping[str, Any], encoding: str, margin: float = 0.0) -> RequestTokens:
        """Messages + tools (with ``margin``) and the requested output tokens of a chat body."""
        messages = body.get("messages")
        message_tokens = REPLY_PRIMING + sum(
            self.per_message(messages if isinstance(messages, list) else [], encoding))
        tool_tokens = self.tools(body.get("tools"), encoding)
        return RequestTokens(
            messages=with_margin(message_tokens, margin),
            tools=with_margin(tool_tokens, margin),
            max_output=requested_output(body),
            exact=self.encodings.get(encoding).exact and margin == 0.0,
        )


def _pictured(message: Mapping[str, Any]) -> bool:
    """Whether a message has an image part (counted as Pi estimates an image, which may
    exceed the part's JSON size)."""
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") in _IMAGE_PARTS for p in content)


def with_margin(tokens: int, margin: float) -> int:
    return math.ceil(tokens * (1.0 + margin)) if margin else tokens


def requested_output(body: Mapping[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0
