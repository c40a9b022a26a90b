"""Which tracked session a request belongs to, and whether its lineage is certain. Pure.

The request-side signals come from ``proxy.floor.identify``; this module matches them against the
session catalog (in-memory indexes only, so the cost does not grow with the number of
sessions) and applies the certainty rules of the floor:

- an explicit session id (header, ``prompt_cache_key``, OpenClaw's Runtime line) names a
  tracked session: that session, unless the request's agent contradicts the session's;
- otherwise content: the newest tool-call ids and the latest user text, looked up in the
  catalog's indexes; the session matching the most signals wins, a tie is ambiguous;
- a request that names a session the catalog does not know yet (a new session has no
  transcript until its first reply) gets a predecessor only through a recorded link: the
  same agent and OpenClaw session key (the key's current session), or the fingerprint rule;
- the fingerprint rule: exactly one candidate whose recorded request fingerprint (system
  prompt and tools, volatile parts normalised) matches this request's, and only when the
  request's tenant is certain (``Tenant``): one transcript root watched, or an agent prefix
  the rules bind to a root. A system prompt is no secret (Pi's is public), so across tenants
  a matching fingerprint proves nothing and the request is ``untrusted``.

An id a request names is a claim: it picks among sessions its content fits and never
authorises a carry alone. Fingerprints are recorded only for sessions the request's content
vouched for, so a claimed id cannot plant one. Anything else is not identified, and the
caller passes the request through unchanged.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.floor.identify import RequestSignals, message_text
from proxy.transcripts.records import SessionRecord

__all__ = ["Fingerprints", "Lineage", "SessionIndex", "Tenant", "find_session", "fingerprint"]

# Volatile parts of system prompts: dates and times (Pi's "Current date:"), uuids and
# OpenClaw's per-session Runtime fields (2026.7 puts the Runtime line in the system prompt).
_VOLATILE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|(?<=sessionId=)[^ |\n]+|(?<=session=)[^ |\n]+")
_SOURCE_METHOD = {"prompt_cache_key": "prompt_cache_key", "runtime": "runtime"}
_MAX_TOOL_SIGNALS = 4


class SessionIndex(Protocol):
    """The catalog queries lineage needs (``proxy.transcripts.catalog.Catalog``)."""

    def get(self, session_id: str) -> SessionRecord | None: ...

    def by_key(self, session_key: str, scope: str | None = None) -> SessionRecord | None: ...

    def find_tool_call(self, call_id: str) -> frozenset[str]: ...

    def find_user_text(self, text: str) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class Tenant:
    """The transcript root a request may draw on without content proof.

    ``certain`` with ``root`` None: every tracked session is the tenant's (one root)."""

    certain: bool
    root: str | None = None

    def admits(self, record: SessionRecord) -> bool:
        """Whether content-free evidence may tie the request to this session."""
        return self.certain and (self.root is None or record.info.root == self.root)

    def excludes(self, record: SessionRecord) -> bool:
        """Whether the session lies in another tenant than the request's known one."""
        return self.root is not None and record.info.root != self.root


ONE_TENANT = Tenant(True)


@dataclass(frozen=True, slots=True)
class Lineage:
    """The outcome of identification.

    ``session_id``: the tracked session the request belongs to (None for the first requests
    of a session that has no transcript yet, or when not identified). ``predecessor``: for
    such a new session, the session whose tail may be carried. ``method`` is the metrics
    label: how it was identified, or why not.
    """

    method: str
    session_id: str | None = None
    predecessor: str | None = None
    explicit: bool = False  # identified by an id the request carries, not by content
    vouched: bool = False  # the request's own messages are found in the session

    @property
    def identified(self) -> bool:
        return self.session_id is not None or self.predecessor is not None


def fingerprint(body: Mapping[str, Any]) -> str | None:
    """System prompt(s) and tools of a request, volatile parts normalised; None without both."""
    messages = body.get("messages")
    system = []
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in ("system",
                                                                             "developer"):
                break
            system.append(message_text(message))
    tools = body.get("tools")
    if not system and not tools:
        return None
    digest = hashlib.blake2b(digest_size=12)
    for text in system:
        digest.update(_VOLATILE.sub("~", text).encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    try:
        digest.update(orjson.dumps(tools or []))
    except TypeError:
        return None
    return digest.hexdigest()


class Fingerprints:
    """Recorded request fingerprints per session, bounded (oldest sessions forgotten first)."""

    def __init__(self, limit: int = 50_000, per_fingerprint: int = 64) -> None:
        self._limit = limit
        self._per = per_fingerprint
        self._by_session: OrderedDict[str, str] = OrderedDict()
        self._by_print: dict[str, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._by_session)

    def get(self, session_id: str) -> str | None:
        return self._by_session.get(session_id)

    def record(self, session_id: str, print_: str) -> None:
        old = self._by_session.get(session_id)
        if old == print_:
            self._by_session.move_to_end(session_id)
            return
        if old is not None:
            self._forget(session_id, old)
        self._by_session[session_id] = print_
        holders = self._by_print.setdefault(print_, OrderedDict())
        holders[session_id] = None
        if len(holders) > self._per:
            self._forget(next(iter(holders)), print_)
        while len(self._by_session) > self._limit:
            sid, fp = next(iter(self._by_session.items()))
            self._forget(sid, fp)

    def sessions(self, print_: str) -> list[str]:
        return list(self._by_print.get(print_, ()))

    def _forget(self, session_id: str, print_: str) -> None:
        self._by_session.pop(session_id, None)
        holders = self._by_print.get(print_)
        if holders is not None:
            holders.pop(session_id, None)
            if not holders:
                del self._by_print[print_]


def _agent_conflict(record: SessionRecord, signals: RequestSignals) -> bool:
    # Pi's transcripts carry no agent id of their own (the tracker names them "pi"), so only
    # OpenClaw sessions can contradict the agent a request names.
    if signals.agent_id is None or record.agent_id is None or record.source == "pi":
        return False
    if record.agent_id != signals.agent_id:
        return True
    return bool(signals.session_key and record.session_key
                and signals.session_key != record.session_key)


def _has_assistant(messages: Sequence[Any]) -> bool:
    return any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)


def find_session(signals: RequestSignals, body: Mapping[str, Any], catalog: SessionIndex, *,
                 prints: Fingerprints, print_: str | None,
                 tenant: Tenant = ONE_TENANT) -> Lineage:
    """Identify the request's session and, for a brand-new session, its certain predecessor."""
    if signals.is_summarization:
        return Lineage("summarization")
    if signals.session_id:
        record = catalog.get(signals.session_id)
        method = _SOURCE_METHOD.get(signals.session_source or "", "header")
        if record is not None and not tenant.excludes(record):
            if _agent_conflict(record, signals):
                return Lineage("agent_mismatch")
            seen = _content_scores(signals, catalog)
            if seen and record.session_id not in seen:
                # The id says one session, the messages another: trust neither.
                return Lineage("content_mismatch")
            return Lineage(method, session_id=record.session_id, explicit=True,
                           vouched=bool(seen))
        return _new_session(signals, body, catalog, prints=prints, print_=print_, tenant=tenant)
    found = _by_content(signals, catalog, tenant)
    if isinstance(found, Lineage):
        return found
    if found is not None:
        return Lineage(found[1], session_id=found[0], vouched=True)
    return _new_session(signals, body, catalog, prints=prints, print_=print_, tenant=tenant)


def _content_scores(signals: RequestSignals, catalog: SessionIndex,
                    kinds: dict[str, str] | None = None) -> Counter[str]:
    """Sessions holding the request's newest tool-call ids and latest user text, by hits."""
    scores: Counter[str] = Counter()
    kinds = kinds if kinds is not None else {}
    for call_id in reversed(signals.tool_call_ids[-_MAX_TOOL_SIGNALS:]):
        for sid in catalog.find_tool_call(call_id):
            scores[sid] += 1
            kinds.setdefault(sid, "tool_call")
    if signals.latest_user_text:
        for sid in catalog.find_user_text(signals.latest_user_text):
            scores[sid] += 1
            kinds.setdefault(sid, "user_text")
    return scores


def _by_content(signals: RequestSignals, catalog: SessionIndex, tenant: Tenant
                ) -> tuple[str, str] | Lineage | None:
    kinds: dict[str, str] = {}
    scores = _content_scores(signals, catalog, kinds)
    if not scores:
        return None
    candidates = []
    for sid, score in scores.items():
        record = catalog.get(sid)
        if record is not None and not _agent_conflict(record, signals) \
                and not tenant.excludes(record):
            candidates.append((score, sid))
    if not candidates:
        return Lineage("agent_mismatch")
    candidates.sort(reverse=True)
    if len(candidates) > 1 and candidates[0][0] == candidates[1][0]:
        return Lineage("ambiguous")
    sid = candidates[0][1]
    return sid, kinds[sid]


def _new_session(signals: RequestSignals, body: Mapping[str, Any], catalog: SessionIndex, *,
                 prints: Fingerprints, print_: str | None, tenant: Tenant) -> Lineage:
    """A request no tracked transcript holds: the first requests of a new session."""
    messages = body.get("messages")
    listed: Sequence[Any] = messages if isinstance(messages, list) else ()
    if signals.summary_index is not None or _has_assistant(listed):
        # A compacted or longer conversation that no transcript holds: not a new session.
        return Lineage("unidentified")
    if signals.session_key and signals.agent_id:
        record = catalog.by_key(signals.session_key)
        if record is None or record.session_id == signals.session_id:
            return Lineage("no_predecessor")
        if record.agent_id != signals.agent_id or tenant.excludes(record):
            return Lineage("agent_mismatch")
        recorded = prints.get(record.session_id)
        if recorded is not None and print_ is not None and recorded != print_:
            return Lineage("fingerprint_mismatch")
        return Lineage("session_key", predecessor=record.session_id, explicit=True)
    if signals.agent_source == "runtime" or signals.session_key:
        return Lineage("no_predecessor")
    if print_ is None:
        return Lineage("unidentified")
    holders = [r for r in (catalog.get(s) for s in prints.sessions(print_)) if r is not None]
    if signals.agent_id is not None:
        holders = [r for r in holders if not _agent_conflict(r, signals)]
    if holders and not tenant.certain:
        # A system prompt and tools are no secret: across tenants they prove nothing.
        return Lineage("untrusted")
    holders = [r for r in holders if tenant.admits(r)]
    superseded = {r.predecessor for r in holders}
    heads = [r for r in holders if r.session_id not in superseded]
    if not heads:
        return Lineage("no_predecessor")
    if len(heads) > 1:
        return Lineage("ambiguous")
    return Lineage("fingerprint", predecessor=heads[0].session_id)
