"""Tables that recognise a context overflow in an upstream error text, and read its numbers.

Every row of the overflow table comes from what providers are known to answer (the same table
Pi keeps in packages/ai/src/utils/overflow.ts, completed with rows seen from vLLM, Together,
OpenRouter, Ollama and z.ai). Rows are matched case-insensitively against the error text; the
exclusions are checked first because rate-limit messages can mention tokens too ("too many
tokens per minute") without the request being too long.

Pure data plus two small pure functions; compiled once at import, held in tuples (immutable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "EXCLUSIONS",
    "OVERFLOW_ROWS",
    "NumbersFound",
    "PatternRow",
    "compile_row",
    "numbers_from_text",
]

_FLAGS = re.IGNORECASE | re.MULTILINE


@dataclass(frozen=True, slots=True)
class PatternRow:
    name: str
    regex: re.Pattern[str]
    source: str


def compile_row(name: str, pattern: str, source: str) -> PatternRow:
    return PatternRow(name, re.compile(pattern, _FLAGS), source)


# (name, regex, who answers it). Order matters only for which name is reported when several
# rows match the same text: the more specific rows come first.
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("prompt_too_long", r"prompt is too long", "Anthropic"),
    ("request_too_large", r"request_too_large", "Anthropic HTTP 413"),
    ("input_too_long_for_model", r"input is too long for requested model", "Amazon Bedrock"),
    ("exceeds_context_window", r"exceeds the context window", "OpenAI Responses"),
    ("input_token_count_exceeds", r"input token count.*exceeds the maximum", "Google Gemini"),
    ("maximum_prompt_length", r"maximum prompt length is \d+", "xAI"),
    ("maximum_context_length", r"maximum context length is \d+ tokens",
     "OpenAI, OpenRouter, vLLM"),
    ("exceeds_maximum_context_length",
     r"exceeds (?:the )?(?:model'?s )?maximum context length",
     "LiteLLM, OpenAI-compatible servers"),
    ("exceeds_maximum_allowed_input_length",
     r"exceeds (?:the )?maximum allowed input length of [\d,]+ tokens?", "OpenRouter"),
    ("input_longer_than_context_length",
     r"input \(\d+ tokens\) is longer than the model'?s context length", "Together AI"),
    ("ollama_prompt_too_long", r"prompt too long; exceeded (?:max )?context length",
     "Ollama (explicit error)"),
    ("vllm_requested_output_tokens", r"requested \d+ output tokens", "vLLM 0.8+"),
    ("vllm_prompt_input_tokens", r"prompt contains.*\d+ input tokens", "vLLM 0.8+"),
    ("exceeds_limit_of", r"exceeds the limit of \d+", "GitHub Copilot"),
    ("exceeds_available_context_size", r"exceeds the available context size",
     "llama.cpp server"),
    ("greater_than_context_length", r"greater than the context length", "LM Studio"),
    ("context_window_exceeds_limit", r"context window exceeds limit", "MiniMax"),
    ("exceeded_model_token_limit", r"exceeded model token limit", "Kimi"),
    ("too_large_for_model", r"too large for model with \d+ maximum context length", "Mistral"),
    ("model_context_window_exceeded", r"model_context_window_exceeded", "z.ai"),
    # Groq's wording; OpenAI and vLLM bodies say it too, after the more telling numbers row.
    ("reduce_length_of_messages", r"reduce the length of the messages", "Groq"),
    ("context_length_exceeded", r"context[_ ]length[_ ]exceeded", "generic"),
    ("too_many_tokens", r"too many tokens", "generic"),
    ("token_limit_exceeded", r"token limit exceeded", "generic"),
    # The OpenAI SDKs turn an empty error answer into "400 status code (no body)"; the detector
    # synthesises that line for empty 400/413 bodies so this row sees what the agents see.
    ("no_body", r"^4(?:00|13)\s*(?:status code)?\s*\(no body\)", "Cerebras (empty body)"),
)

OVERFLOW_ROWS: tuple[PatternRow, ...] = tuple(compile_row(*row) for row in _ROWS)

EXCLUSIONS: tuple[PatternRow, ...] = (
    compile_row("throttling_or_unavailable", r"^(?:Throttling error|Service unavailable):",
                "Amazon Bedrock throttling / outage"),
    compile_row("rate_limit", r"rate limit", "every provider's rate limiter"),
    compile_row("too_many_requests", r"too many requests", "HTTP 429 wording"),
)


@dataclass(frozen=True, slots=True)
class NumbersFound:
    window: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None


_D = r"\d[\d,]*"
# Each regex names the groups it can fill: window (the limit the server enforces), prompt (what
# the request measured) and output (the completion it asked for). First match per group wins.
_NUMBER_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p, re.IGNORECASE) for p in (
    # OpenAI / vLLM / OpenRouter: "maximum context length is 8192 tokens"
    rf"maximum context length is (?P<window>{_D}) tokens",
    # OpenAI classic: "you requested 9224 tokens (1224 in the messages, 8000 in the completion)"
    rf"requested \d[\d,]* tokens \((?P<prompt>{_D}) in the messages, "
    rf"(?P<output>{_D}) in the completion\)",
    # OpenAI chat: "your messages resulted in 9000 tokens"
    rf"messages resulted in (?P<prompt>{_D}) tokens",
    # vLLM 0.8+: "requested 32000 output tokens and your prompt contains at least 769 input tokens"
    rf"requested (?P<output>{_D}) output tokens",
    rf"prompt contains (?:at least )?(?P<prompt>{_D}) input tokens",
    # vLLM max_tokens variant: "your request has 3500 input tokens"
    rf"request has (?P<prompt>{_D}) input tokens",
    # xAI: "maximum prompt length is 131072 but the request contains 537812 tokens"
    rf"maximum prompt length is (?P<window>{_D})",
    rf"request contains (?P<prompt>{_D}) tokens",
    # Anthropic: "prompt is too long: 213462 tokens > 200000 maximum"
    rf"prompt is too long: (?P<prompt>{_D}) tokens > (?P<window>{_D}) maximum",
    # Gemini: "The input token count (1196265) exceeds the maximum number of tokens allowed
    # (1048575)"
    rf"input token count \((?P<prompt>{_D})\) exceeds the maximum number of tokens "
    rf"allowed \((?P<window>{_D})\)",
    # GitHub Copilot: "prompt token count of 200000 exceeds the limit of 128000"
    rf"prompt token count of (?P<prompt>{_D}) exceeds the limit of (?P<window>{_D})",
    rf"exceeds the limit of (?P<window>{_D})",
    # Mistral: "Prompt contains 40000 tokens ... too large for model with 32768 maximum context
    # length"
    rf"prompt contains (?P<prompt>{_D}) tokens",
    rf"too large for model with (?P<window>{_D}) maximum context length",
    # Together: "The input (250000 tokens) is longer than the model's context length (200000
    # tokens)"
    rf"input \((?P<prompt>{_D}) tokens\) is longer than the model'?s context length "
    rf"\((?P<window>{_D}) tokens\)",
    # OpenRouter / Poolside: "Input length 131393 exceeds the maximum allowed input length of
    # 131040 tokens"
    rf"input length (?P<prompt>{_D}) exceeds",
    rf"maximum allowed input length of (?P<window>{_D}) tokens",
    # llama.cpp: "request (13392 tokens) exceeds the available context size (8192 tokens)"
    rf"request \((?P<prompt>{_D}) tokens\) exceeds the available context size "
    rf"\((?P<window>{_D}) tokens\)",
    # Kimi: "exceeded model token limit: 262144 (requested: 270000)"
    rf"exceeded model token limit: (?P<window>{_D}) \(requested: (?P<prompt>{_D})\)",
    # LM Studio: "the model is loaded with context length of only 4096 tokens"
    rf"context length of only (?P<window>{_D}) tokens",
    # SGLang / generic: "exceeds the model's maximum context length of 32768"
    rf"maximum context (?:length|limit) of (?P<window>{_D})",
))

# Numbers outside this range are parse accidents (error codes, years), not token counts.
_PLAUSIBLE = range(16, 100_000_001)


def _to_int(text: str | None) -> int | None:
    if text is None:
        return None
    value = int(text.replace(",", ""))
    return value if value in _PLAUSIBLE else None


def numbers_from_text(text: str) -> NumbersFound:
    """Window, prompt and requested output tokens stated by an overflow message, when stated."""
    found: dict[str, int] = {}
    for regex in _NUMBER_PATTERNS:
        match = regex.search(text)
        if match is None:
            continue
        for group, raw in match.groupdict().items():
            value = _to_int(raw)
            if value is not None and group not in found:
                found[group] = value
        if len(found) == 3:
            break
    return NumbersFound(found.get("window"), found.get("prompt"), found.get("output"))
