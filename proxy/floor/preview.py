"""What the floor would do to a given request: ``tailfloor inspect SESSION --request FILE``.

The request file holds a chat body (``{"model", "messages", ...}``) or a recorded request
(``{"path", "headers", "body"}``). The request is tied to SESSION the way an operator's
session header would tie it, then run through the same decision the server makes, without
metrics or side effects. Returns a JSON-ready dict and a text rendering.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from proxy.chat import ChatRequest
from proxy.context import build_context
from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.floor.restore import is_counted
from proxy.floor.stage import Floor, TailSource
from proxy.identity.identify import split_agent_path
from proxy.identity.prompt_prints import Fingerprints
from proxy.identity.sessions import SessionFinder
from proxy.policy.records import RuleSet
from proxy.tokens import TokenCounter
from proxy.wire.content import message_text

__all__ = ["preview_request"]

_SNIPPET = 100


def _snippet(message: Mapping[str, Any]) -> str:
    text = " ".join(message_text(message).split())
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = [str(c.get("function", {}).get("name")) for c in calls if isinstance(c, dict)]
        text = (text + " " if text else "") + "[calls " + ", ".join(names) + "]"
    return text if len(text) <= _SNIPPET else text[:_SNIPPET - 1] + "…"


def preview_request(catalog: TailSource, rules: RuleSet, tokens: TokenCounter,
                    session_id: str, request: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The rewrite ``request`` would get as a request of ``session_id``."""
    body = request.get("body") if isinstance(request.get("body"), dict) else request
    assert isinstance(body, Mapping)
    headers = {str(k): str(v) for k, v in (request.get("headers") or {}).items()} \
        if "body" in request else {}
    agent, _path = split_agent_path(str(request.get("path") or ""))
    names = rules.identification.session_headers
    if names:
        headers = {k: v for k, v in headers.items() if k.lower() not in names}
        headers[names[0]] = session_id
    raw = orjson.dumps(body)
    chat = ChatRequest.parse(raw, orjson.loads(raw), agent)
    prints = Fingerprints()
    # The operator names the session: one tenant, as in a sidecar.
    models = ModelFactsResolver(LearnedWindows(), TokenRatios(), "")
    ctx = build_context(chat, headers, rules, models=models,
                        sessions=SessionFinder(catalog, prints=prints))
    decision = Floor(catalog, tokens, prints).decide(ctx)
    sent = decision.messages if decision.messages is not None else tuple(
        chat.body.get("messages") or ())
    added = {id(m) for m in decision.added}
    own = {id(m) for m in chat.body.get("messages") or ()}
    rows = []
    for index, message in enumerate(sent):
        if not isinstance(message, Mapping):
            continue
        origin = "added" if id(message) in added else "request" if id(message) in own \
            else "note"
        rows.append({"index": index, "role": message.get("role"), "origin": origin,
                     "raw": is_counted(message), "text": _snippet(message)})
    data: dict[str, Any] = {
        "session": session_id, "verdict": decision.verdict, "kind": decision.kind,
        "identification": decision.method, "source_session": decision.source_session,
        "added_messages": decision.added_raw, "added_tokens": decision.added_tokens,
        "capped": decision.capped, "details": decision.details,
        "bytes": {"request": len(raw), "rewritten": len(decision.body)},
        "messages": rows}
    lines = [f"session {session_id}: {decision.verdict}",
             f"identification: {decision.method or '-'}; from session "
             f"{decision.source_session or '-'}; +{decision.added_raw} messages, "
             f"+{decision.added_tokens} tokens" + (" (capped)" if decision.capped else "")]
    for row in rows:
        mark = {"added": "+", "note": "*"}.get(str(row["origin"]), " ")
        lines.append(f"{mark} {row['index']:4d} {row['role']:<9} {row['text']}")
    return data, "\n".join(lines)
