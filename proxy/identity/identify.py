"""What a chat request says about itself: agent, session, summary, tail, rendering style.

Only the request is read here (path, headers, parsed body); matching it against transcripts
is the session catalog's job. Signals, in the order they are trusted (docs: wire.md section 2):
the ``/agents/<id>/`` path prefix, configured headers, ``prompt_cache_key``, OpenClaw's
``Runtime: agent=... | session=<key> | sessionId=<id>`` line (system prompt in 2026.7, first
user message in 2026.9, a second text part of the summary after compaction), then content
(tool-call ids, the latest user text).

Cost matters (every request passes here): only the leading messages and the tail are read,
plus one role check per message to count the raw tail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import unquote

from proxy.policy.records import Identification
from proxy.transcripts.entries import assistant_text_key, summary_key, user_text_key
from proxy.values import frozen_value
from proxy.wire.boundary import call_ids
from proxy.wire.content import first_text, head_length, message_text
from proxy.wire.openclaw import (
    INTERNAL_CONTEXT,
    OPENCLAW_CONTINUE,
    USER_PREFIX,
    RuntimeLine,
    clean_id,
    parse_runtime,
    strip_user_prefix,
)
from proxy.wire.summary import is_summary_text, unwrap_summary

__all__ = [
    "RenderStyle",
    "RequestSignals",
    "identify",
    "is_summarization",
    "split_agent_path",
]

SUMMARIZER_PROMPT = "You are a context summarization assistant"
MAX_TOOL_IDS = 16
CONTENT_KEYS = 8  # newest user and assistant texts looked up besides the latest user text
_LEADING_SCAN = 3  # messages after the system prompt searched for the summary / Runtime line

_AGENT_PATH = re.compile(r"^/agents/([^/]{1,128})(/.*)?$")
_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")


@frozen_value
class RenderStyle:
    """How the agent renders history, as far as this request shows it."""

    user_prefix: bool  # user texts start with OpenClaw's "[Mon 2026-11-30 02:27 UTC] "
    user_parts: bool | None  # user content as parts (Pi) or a string (OpenClaw); None: unseen
    tool_ids_without_underscore: bool | None  # None: the request has no tool calls
    internal_context: bool  # OpenClaw's trailing internal-context user message is present


class RequestSignals(NamedTuple):
    """Built for every request: a named tuple is made in one C call, where a frozen
    dataclass set its 23 fields one by one (about a quarter of ``identify``'s instructions
    for a two-message request)."""

    agent_id: str | None
    agent_source: str | None  # "path" | "header" | "runtime"
    session_id: str | None
    session_source: str | None  # "header:<name>" | "prompt_cache_key" | "runtime"
    session_key: str | None  # OpenClaw's session key from the Runtime line
    header_session_id: str | None
    prompt_cache_key: str | None
    runtime: RuntimeLine | None
    is_summarization: bool  # a compaction call: never rewritten
    summary_index: int | None  # index of the agent's summary message
    summary_text: str | None  # the summary inside it (unwrapped)
    first_raw_index: int | None  # first message after the system prompt and the summary
    raw_after_summary: int  # user/assistant/tool messages after it (internal context excluded)
    tool_call_ids: tuple[str, ...]  # the newest ids (at most MAX_TOOL_IDS), in request order
    latest_user_text: str | None  # prefix and Runtime suffix stripped
    style: RenderStyle
    has_assistant: bool = False  # the conversation holds an assistant message
    # The index keys of the latest user text and of the summary, computed with the rest
    # (off the event loop for a large request: normalising megabytes of text is not free).
    latest_user_key: int | None = None
    summary_key: int | None = None
    # Index keys of the newest user and assistant texts but the latest user text: the
    # transcript may lag the request by its newest messages, not by those before them.
    content_keys: tuple[int, ...] = ()
    # A prompt-cache refresh (Pi 1.x ``cacheWarming``): the request before it again, capped
    # at one output token. It must get that request's rewrite and start nothing new.
    cache_warm: bool = False


class _TailScan(NamedTuple):
    """What one backward pass over the conversation found."""

    raw: int
    latest_user_text: str | None
    tool_call_ids: tuple[str, ...]
    user_prefix: bool
    internal_context: bool
    user_parts: bool | None
    has_assistant: bool
    content_keys: tuple[int, ...]


def split_agent_path(path: str) -> tuple[str | None, str]:
    """``/agents/<id>/v1/chat/completions`` -> ``("<id>", "/v1/chat/completions")``."""
    found = _AGENT_PATH.match(path)
    if found is None:
        return None, path
    agent = unquote(found.group(1))
    if not _AGENT_ID.match(agent):
        return None, path
    return agent, found.group(2) or "/"


def _role(message: object) -> object:
    if message.__class__ is dict or isinstance(message, Mapping):
        return message.get("role")
    return None


def is_summarization(body: Mapping[str, Any]) -> bool:
    """A compaction call (Pi and OpenClaw): summarizer system prompt, one <conversation>."""
    messages = body.get("messages")
    if body.get("tools") or not isinstance(messages, list) or len(messages) != 2:
        return False
    system, user = messages
    head = message_text(user).lstrip()
    # Pi 1.x summarizes the start of a split turn as "# Conversation" (its turn prefix).
    return (_role(system) in ("system", "developer") and _role(user) == "user"
            and message_text(system).lstrip().startswith(SUMMARIZER_PROMPT)
            and (head.startswith("<conversation>") or head.startswith("# Conversation\n")))


def is_cache_warm(body: Mapping[str, Any]) -> bool:
    """A request capped at one output token: an agent keeping its prompt cache alive."""
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    return cap == 1 and not isinstance(cap, bool)


def identify(path_agent: str | None, headers: Mapping[str, str], body: Mapping[str, Any],
             config: Identification | None = None) -> RequestSignals:
    """Read every request-side identification signal; never raises on odd bodies."""
    config = config or Identification()
    lowered = {k.lower(): v for k, v in headers.items()}
    header_session, header_name = None, None
    for name in config.session_headers:
        header_session = clean_id(lowered.get(name))
        if header_session:
            header_name = name
            break
    cache_key = clean_id(body.get("prompt_cache_key"))
    raw_messages = body.get("messages")
    messages: Sequence[Any] = raw_messages if isinstance(raw_messages, list) else ()

    summarization = is_summarization(body)
    runtime, summary_index, first_raw = (None, None, None) if summarization else _leading(messages)
    scan = _tail(messages, first_raw, summary_index is not None)
    ids = scan.tool_call_ids
    summary = unwrap_summary(messages[summary_index]) if summary_index is not None else None

    agent, agent_source = None, None
    header_agent = lowered.get(config.agent_header) if config.agent_header else None
    for candidate, source in ((path_agent, "path"), (header_agent, "header"),
                              (runtime.agent if runtime else None, "runtime")):
        if isinstance(candidate, str) and _AGENT_ID.match(candidate.strip()):
            agent, agent_source = candidate.strip(), source
            break
    session, session_source = None, None
    for value, source in ((header_session, f"header:{header_name}"),
                          (cache_key, "prompt_cache_key"),
                          (runtime.session_id if runtime else None, "runtime")):
        if value:
            session, session_source = value, source
            break
    return RequestSignals(
        agent_id=agent, agent_source=agent_source, session_id=session,
        session_source=session_source, session_key=runtime.session_key if runtime else None,
        header_session_id=header_session, prompt_cache_key=cache_key, runtime=runtime,
        is_summarization=summarization, summary_index=summary_index,
        summary_text=summary,
        first_raw_index=first_raw, raw_after_summary=scan.raw, tool_call_ids=ids,
        latest_user_text=scan.latest_user_text,
        latest_user_key=user_text_key(scan.latest_user_text) if scan.latest_user_text else None,
        summary_key=summary_key(summary) if summary else None,
        style=RenderStyle(user_prefix=scan.user_prefix, user_parts=scan.user_parts,
                          tool_ids_without_underscore=(all("_" not in i for i in ids)
                                                       if ids else None),
                          internal_context=scan.internal_context),
        has_assistant=scan.has_assistant, content_keys=scan.content_keys,
        cache_warm=not summarization and is_cache_warm(body))


def _leading(messages: Sequence[Any]) -> tuple[RuntimeLine | None, int | None, int | None]:
    """Runtime line, summary index and first raw index, from the head of the list."""
    i = head_length(messages)
    first_raw = i if i < len(messages) else None
    runtime: RuntimeLine | None = None
    summary_index: int | None = None
    # OpenClaw 2026.7 writes the line into the system prompt, which no user controls; a line
    # in the first user message must not override it (a user could type one there).
    for k in range(i):
        runtime = runtime or parse_runtime(message_text(messages[k]), "system")
    for j in range(i, min(i + _LEADING_SCAN, len(messages))):
        message = messages[j]
        if _role(message) != "user":
            continue
        text = message_text(message)
        if is_summary_text(text):
            summary_index = j
            first_raw = j + 1 if j + 1 < len(messages) else None
            runtime = runtime or parse_runtime(text, "summary")
            break
        if j == i:
            runtime = runtime or parse_runtime(text, "first_user")
    return runtime, summary_index, first_raw


def _tail(messages: Sequence[Any], first_raw: int | None, summarized: bool) -> _TailScan:
    """One tight backward pass: this loop runs over every message of every request."""
    raw = 0
    latest: str | None = None
    ids: list[str] = []
    prefix = internal = assistant = False
    parts: bool | None = None
    start = first_raw if first_raw is not None else len(messages)
    # Earlier texts matter only without a summary: the summary decides a compacted request.
    want = 0 if summarized else CONTENT_KEYS
    keys: list[int] = []
    for k in range(len(messages) - 1, start - 1, -1):
        message = messages[k]
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant":
            raw += 1
            assistant = True
            if len(ids) < MAX_TOOL_IDS and message.get("tool_calls"):
                ids[:0] = list(call_ids(message))[: MAX_TOOL_IDS - len(ids)]
            content = message.get("content")
            if len(keys) < want and isinstance(content, str):
                found = assistant_text_key(content)
                if found is not None:
                    keys.append(found)
        elif role == "tool":
            raw += 1
        elif role == "user":
            content = message.get("content")
            if content.__class__ is list and content and content[0].__class__ is dict \
                    and str(content[0].get("text", "")).startswith(INTERNAL_CONTEXT):
                internal = True
                continue
            raw += 1
            if parts is None and isinstance(content, str | list):
                parts = isinstance(content, list)
            if latest is None:
                text = content if isinstance(content, str) else message_text(message)
                prefix = prefix or USER_PREFIX.match(text) is not None
                stripped = strip_user_prefix(text)
                latest = None if stripped.startswith(OPENCLAW_CONTINUE) else stripped
            elif len(keys) < want:
                found = user_text_key(message_text(message))
                if found is not None:
                    keys.append(found)
    if not prefix and first_raw is not None and first_raw < len(messages):
        prefix = USER_PREFIX.match(first_text(messages[first_raw]) or "") is not None
    return _TailScan(raw, latest, tuple(ids), prefix, internal, parts, assistant,
                     tuple(dict.fromkeys(keys)))
