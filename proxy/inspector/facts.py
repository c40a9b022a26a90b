"""What the inspector shows of kept requests, as plain values: the JSON twin of each page is
exactly these, and the HTML is rendered from them (``proxy.inspector.pages``).

Worked out when a page asks, never on the request path. Message text goes in only when the
operator turned content on; without it a message is its role, provenance, size, tool names
and a short hash. No header or credential is in a report, so none can be shown.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from proxy.inspector.digest import MessageDigest, clean, digest_of
from proxy.inspector.store import CLEAN_SLATE, SessionRecord
from proxy.report import AGENT, Origin, RequestReport

__all__ = ["CLEAN_SLATE_TEXT", "PROVENANCES", "broke_text", "floor_text", "recovery_text",
           "request_facts", "session_facts", "session_row"]

CLEAN_SLATE_TEXT = ("the user began this session with the clean-slate marker: nothing of "
                    "the previous session was carried in, and none of its pins")
_BROKE = {
    "mid_stream": "the upstream broke off its stream; the client got an error event in place "
                  "of the rest of the answer",
    "timeout": "the upstream went silent mid-stream (timeout); the client got an error event "
               "in place of the rest of the answer",
    "error_event": "the upstream ended its stream with an error event",
}
_BROKE_PLAIN = {  # an answer too large to hold, passed on as it came (not a stream)
    "mid_stream": "the upstream broke off its answer after its head; the client got it cut "
                  "short",
    "timeout": "the upstream went silent mid-answer (timeout); the client got it cut short",
}
PROVENANCES = ("agent", "restored", "carried", "summary", "inserted", "pinned")
_CHARS_PER_TOKEN = 4  # the estimate tailfloor uses when it has no tokenizer for a model


def session_row(record: SessionRecord) -> dict[str, Any]:
    return {"id": record.session_id, "agent": record.agent, "source": record.source,
            "last_request": record.last, "requests_kept": len(record.requests),
            "requests_seen": record.seen, "floors": record.floors, "carries": record.carries,
            "compactions": record.compactions, "overflows": record.overflows,
            "clean_slate": record.clean_slate}


def session_facts(record: SessionRecord, content: bool) -> dict[str, Any]:
    """The session and its kept requests, newest first; each request's messages marked
    ``unchanged`` where the request before it sent the same message."""
    reports = [entry.report() for entry in record.requests]
    out: list[dict[str, Any]] = []
    previous: set[str] = set()
    for report in reports:  # oldest first: each is compared with the one before it
        facts = request_facts(report, content, previous)
        previous = {m["hash"] for m in facts["messages"]}
        out.append(facts)
    out.reverse()
    return {**session_row(record), "requests": out}


def request_facts(report: RequestReport, content: bool,
                  previous: Iterable[str] = ()) -> dict[str, Any]:
    seen = set(previous)
    messages = _messages(report.messages, report.origins, content, seen)
    by_provenance = dict.fromkeys(PROVENANCES, 0)
    for message in messages:
        by_provenance[message["provenance"]] += message["tokens"]
    usage = report.usage
    return {
        "request_id": report.request_id, "at": report.at, "route": report.route,
        "model": report.model, "agent": report.agent, "stream": report.stream,
        "status": report.status, "verdict": report.verdict, "seconds": report.seconds,
        "proxy_seconds": report.proxy_seconds, "session_id": report.session_id,
        "method": report.method, "named_session": report.named_session,
        "floor": {"kind": report.floor_kind, "reason": report.floor_reason,
                  "restored": report.restored, "carried": report.carried,
                  "carried_from": report.carried_from, "added_tokens": report.added_tokens,
                  "capped": report.capped},
        "recovery": {
            "compaction": report.compaction, "why": report.compaction_why,
            "replaced": report.replaced, "tokens_removed": report.tokens_removed,
            "overflow": report.overflow,
            "clamp": list(report.clamp) if report.clamp is not None else None,
            "summary": None if report.summary is None else {
                "model": report.summary.model, "seconds": report.summary.seconds,
                "prompt_tokens": report.summary.prompt_tokens,
                "completion_tokens": report.summary.completion_tokens,
                "failure": report.summary.failure}},
        "attempts": [{"number": a.number, "status": a.status, "error": a.error,
                      "broke": a.broke,
                      "started": a.started, "latency": a.latency,
                      "first_chunk": a.first_chunk, "compacted": a.compacted}
                     for a in report.attempts],
        "usage": None if usage is None else {
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "cached_tokens": usage.cached_tokens,
            "reasoning_tokens": usage.reasoning_tokens},
        "finish_reason": report.finish_reason, "window": report.window,
        "tokens": {"estimated": sum(by_provenance.values()), "by_provenance": by_provenance},
        "messages": messages,
    }


def floor_text(floor: dict[str, Any]) -> str:
    """The floor's verdict in a line (plain text: the page escapes it)."""
    parts = [floor["kind"]]
    if floor["restored"]:
        parts.append(f"{floor['restored']} restored")
    if floor["carried"]:
        parts.append(f"{floor['carried']} carried from {floor['carried_from']}")
    if floor["added_tokens"]:
        parts.append(f"{floor['added_tokens']} tokens added")
    if floor["capped"]:
        parts.append("capped")
    if floor["reason"]:
        parts.append(f"reason: {floor['reason']}")
    if floor["reason"] == CLEAN_SLATE:
        parts.append(CLEAN_SLATE_TEXT)
    return ", ".join(parts)


def broke_text(attempts: Sequence[dict[str, Any]], streamed: bool = True) -> str | None:
    """How the answer ended short of whole, in a line; None when it did not. ``streamed``:
    the request asked for a stream (else only an answer too large to hold can break)."""
    # .get: the CLI may read the JSON of a tailfloor older than this field
    broke: str | None = attempts[-1].get("broke") if attempts else None
    if broke is None:
        return None
    return (_BROKE if streamed else _BROKE_PLAIN).get(broke, broke)


def recovery_text(recovery: dict[str, Any]) -> str | None:
    """What recovery did, in a line; None when it did nothing."""
    parts = []
    if recovery["compaction"]:
        parts.append(f"{recovery['compaction']} ({recovery['why'] or '-'}): "
                     f"{recovery['replaced']} messages replaced, about "
                     f"{recovery['tokens_removed']} tokens removed")
    made = recovery["summary"]
    if made is not None:
        parts.append(f"summary by {made['model']} in {made['seconds']:.2f} s"
                     + (f" failed: {made['failure']}" if made["failure"] else ""))
    if recovery["clamp"]:
        parts.append("output limit {} lowered to {}".format(*recovery["clamp"]))
    if recovery["overflow"]:
        parts.append(f"overflow: {recovery['overflow']}")
    return "; ".join(parts) or None


def _messages(messages: Sequence[Any] | None, origins: Sequence[Origin] | None,
              content: bool, previous: set[str]) -> list[dict[str, Any]]:
    if not messages:
        return []
    if origins is not None and len(origins) != len(messages):
        origins = None  # never a wrong mark: unknown origins read as the agent's own
    out = []
    for index, message in enumerate(messages):
        origin = origins[index] if origins is not None else AGENT
        found = message if isinstance(message, MessageDigest) else digest_of(message)
        role, size, digest, tools = found.role, found.size, found.hash, list(found.tools)
        item: dict[str, Any] = {
            "index": index, "role": role, "provenance": origin.provenance,
            "bytes": size, "tokens": -(-size // _CHARS_PER_TOKEN),
            "tools": tools, "hash": digest, "unchanged": digest in previous}
        if origin.session is not None:
            item["session"] = origin.session
        if origin.provenance == "summary":
            item["author"] = origin.author
            item["replaced"] = origin.replaced
            item["replaced_span"] = list(origin.replaced_span) if origin.replaced_span \
                else None
        if content and not isinstance(message, MessageDigest):
            item["text"] = clean(_text(message))
        out.append(item)
    return out


def _text(message: Any) -> str:
    """What a reader needs of a message: its text parts, and its tool calls."""
    if not isinstance(message, dict):
        return repr(message)
    parts: list[str] = []
    body = message.get("content")
    if isinstance(body, str):
        parts.append(body)
    elif isinstance(body, list):
        for part in body:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(f"→ {function.get('name')}({function.get('arguments')})")
    return "\n".join(str(p) for p in parts)
