"""Which tracked session a request belongs to, and whether it may draw on it. Pure.

The request-side signals come from ``proxy.identity.identify``; this module matches them against
the session catalog (in-memory indexes only, so the cost does not grow with the number of
sessions) and grades the evidence:

- ``strong``: the request holds something only its session can know: one of the session's
  tool-call ids (random, unguessable) or the agent's compaction summary;
- ``weak``: only texts match: the latest user text, the newest user and assistant texts
  before it ("yes", "thanks", a canned reply are in many sessions);
- ``claim``: the request names the session (a header, ``prompt_cache_key``, OpenClaw's
  Runtime line) and its content neither confirms nor contradicts it.

A session found on strong evidence is ``trusted``. Weak evidence and claims are trusted only
inside a certain tenant (``Tenant``): one transcript root watched (the sidecar), or an agent
prefix the rules bind to the session's root. Each ``--sessions`` root is a tenant; across
tenants a guessable text or a named id proves nothing.

A request that names a session the catalog does not know yet (a new session has no
transcript until its first reply) gets a predecessor only within a certain tenant: the
OpenClaw session key's current session (same agent, no contradicting fingerprint), or the
fingerprint rule: exactly one candidate whose recorded request fingerprint (system prompt and
tools, volatile parts normalised) matches. Anything else is not identified or ``untrusted``,
and the caller passes the request through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from proxy.identity.identify import RequestSignals
from proxy.identity.prompt_prints import Fingerprints
from proxy.transcripts.records import SessionRecord
from proxy.values import frozen_value

__all__ = ["ERROR", "NOT_LOOKED_UP", "ONE_TENANT", "SUMMARIZATION", "UNAUTHENTICATED", "Evidence",
           "Lineage", "SessionIndex", "Tenant", "find_session"]

Evidence = Literal["strong", "weak", "claim", "none"]
_SOURCE_METHOD = {"prompt_cache_key": "prompt_cache_key", "runtime": "runtime"}
# Every tool-call id the request's scan kept: in a tool loop the newest ones may not be in
# the transcript yet (the running turn), the ones before them are.
_MAX_TOOL_SIGNALS = 16


class SessionIndex(Protocol):
    """The catalog queries lineage needs (``proxy.transcripts.catalog.Catalog``)."""

    def get(self, session_id: str) -> SessionRecord | None: ...

    def by_key(self, session_key: str, scope: str | None = None) -> SessionRecord | None: ...

    def find_tool_call(self, call_id: str) -> frozenset[str]: ...

    def find_key(self, key: int | None) -> frozenset[str]: ...


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


@frozen_value
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
    explicit: bool = False  # the request names its session (an id, a session key)
    evidence: Evidence = "none"
    trusted: bool = False  # it may draw on the session (and its predecessor)

    @property
    def identified(self) -> bool:
        return self.session_id is not None or self.predecessor is not None


# The outcomes that are only a method (no session, nothing trusted), made once: most
# requests end in one of them.
NOT_LOOKED_UP = Lineage("not_looked_up")
UNAUTHENTICATED = Lineage("unauthenticated")
SUMMARIZATION = Lineage("summarization")
ERROR = Lineage("error")
UNIDENTIFIED = Lineage("unidentified")
NO_PREDECESSOR = Lineage("no_predecessor")
UNTRUSTED = Lineage("untrusted")
AMBIGUOUS = Lineage("ambiguous")
AGENT_MISMATCH = Lineage("agent_mismatch")
CONTENT_MISMATCH = Lineage("content_mismatch")
FINGERPRINT_MISMATCH = Lineage("fingerprint_mismatch")


def _agent_conflict(record: SessionRecord, signals: RequestSignals) -> bool:
    # Pi's transcripts carry no agent id of their own (the tracker names them "pi"), so only
    # OpenClaw sessions can contradict the agent a request names.
    if signals.agent_id is None or record.agent_id is None or record.source == "pi":
        return False
    if record.agent_id != signals.agent_id:
        return True
    return bool(signals.session_key and record.session_key
                and signals.session_key != record.session_key)


def find_session(signals: RequestSignals, body: Mapping[str, Any], catalog: SessionIndex, *,
                 prints: Fingerprints, print_: str | None,
                 tenant: Tenant = ONE_TENANT) -> Lineage:
    """Identify the request's session and, for a brand-new session, its predecessor."""
    if signals.is_summarization:
        return SUMMARIZATION
    if signals.session_id:
        record = catalog.get(signals.session_id)
        method = _SOURCE_METHOD.get(signals.session_source or "", "header")
        if record is not None and not tenant.excludes(record):
            if _agent_conflict(record, signals):
                return AGENT_MISMATCH
            scores = _content_scores(signals, catalog)
            if scores and record.session_id not in scores:
                # The id says one session, the messages another: trust neither.
                return CONTENT_MISMATCH
            found = scores.get(record.session_id)
            evidence: Evidence = found.evidence if found is not None else "claim"
            return _graded(method, record, evidence, tenant, explicit=True)
        return _new_session(signals, body, catalog, prints=prints, print_=print_, tenant=tenant)
    best = _by_content(signals, catalog, tenant)
    if isinstance(best, Lineage):
        return best
    if best is not None:
        record, hits = best
        return _graded(hits.method, record, hits.evidence, tenant)
    return _new_session(signals, body, catalog, prints=prints, print_=print_, tenant=tenant)


def _graded(method: str, record: SessionRecord, evidence: Evidence, tenant: Tenant, *,
            explicit: bool = False) -> Lineage:
    trusted = evidence == "strong" or tenant.admits(record)
    return Lineage(method, session_id=record.session_id, explicit=explicit, evidence=evidence,
                   trusted=trusted)


@dataclass(slots=True)
class _Hits:
    """What of the request a session holds."""

    score: int = 0
    method: str = ""
    strong: bool = False

    @property
    def evidence(self) -> Evidence:
        return "strong" if self.strong else "weak"


def _content_scores(signals: RequestSignals, catalog: SessionIndex) -> dict[str, _Hits]:
    """Sessions holding the request's agent summary, newest tool-call ids and latest user
    text."""
    hits: dict[str, _Hits] = {}

    def add(sessions: frozenset[str], method: str, strong: bool) -> None:
        for sid in sessions:
            found = hits.setdefault(sid, _Hits(method=method))
            found.score += 1
            found.strong = found.strong or strong

    if signals.summary_key is not None:
        add(catalog.find_key(signals.summary_key), "summary", True)
    for call_id in reversed(signals.tool_call_ids[-_MAX_TOOL_SIGNALS:]):
        add(catalog.find_tool_call(call_id), "tool_call", True)
    if signals.latest_user_key is not None:
        add(catalog.find_key(signals.latest_user_key), "user_text", False)
    # Texts are guessable ("hi", a canned reply): weak, however many agree.
    for key in signals.content_keys:
        add(catalog.find_key(key), "content", False)
    return hits


def _by_content(signals: RequestSignals, catalog: SessionIndex, tenant: Tenant
                ) -> tuple[SessionRecord, _Hits] | Lineage | None:
    scores = _content_scores(signals, catalog)
    if not scores:
        return None
    candidates: list[tuple[tuple[bool, int], str, SessionRecord]] = []
    for sid, hits in scores.items():
        record = catalog.get(sid)
        if record is not None and not _agent_conflict(record, signals) \
                and not tenant.excludes(record):
            candidates.append(((hits.strong, hits.score), sid, record))
    if not candidates:
        return AGENT_MISMATCH
    if signals.summary_key is not None and not any(c[0][0] for c in candidates):
        # The request holds an agent summary no tracked session wrote: its session is one
        # the watcher has not read yet, whatever texts others share with it.
        return UNIDENTIFIED
    # A session holding something unguessable beats any number of matching texts.
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    if len(candidates) > 1 and candidates[0][0] == candidates[1][0]:
        return AMBIGUOUS
    _rank, sid, record = candidates[0]
    return record, scores[sid]


def _new_session(signals: RequestSignals, body: Mapping[str, Any], catalog: SessionIndex, *,
                 prints: Fingerprints, print_: str | None, tenant: Tenant) -> Lineage:
    """A request no tracked transcript holds: the first requests of a new session. Nothing
    in it is proof, so a predecessor is found only within a certain tenant."""
    if signals.summary_index is not None or signals.has_assistant:
        # A compacted or longer conversation that no transcript holds: not a new session.
        return UNIDENTIFIED
    if signals.session_key and signals.agent_id:
        record = catalog.by_key(signals.session_key)
        if record is None or record.session_id == signals.session_id:
            return NO_PREDECESSOR
        if record.agent_id != signals.agent_id or tenant.excludes(record):
            return AGENT_MISMATCH
        if not tenant.admits(record):
            return UNTRUSTED  # a session key is a claim; keys are guessable
        recorded = prints.get(record.session_id)
        if recorded is not None and print_ is not None and recorded != print_:
            return FINGERPRINT_MISMATCH
        return Lineage("session_key", predecessor=record.session_id, explicit=True,
                       evidence="claim", trusted=True)
    if signals.agent_source == "runtime" or signals.session_key:
        return NO_PREDECESSOR
    if print_ is None:
        return UNIDENTIFIED
    holders = [r for r in (catalog.get(s) for s in prints.sessions(print_)) if r is not None]
    if signals.agent_id is not None:
        holders = [r for r in holders if not _agent_conflict(r, signals)]
    if holders and not tenant.certain:
        # A system prompt and tools are no secret: across tenants they prove nothing.
        return UNTRUSTED
    holders = [r for r in holders if tenant.admits(r)]
    superseded = {r.predecessor for r in holders}
    heads = [r for r in holders if r.session_id not in superseded]
    if not heads:
        return NO_PREDECESSOR
    if len(heads) > 1:
        return AMBIGUOUS
    return Lineage("fingerprint", predecessor=heads[0].session_id, evidence="claim",
                   trusted=True)
