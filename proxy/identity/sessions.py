"""Finding the session of a request: the floor's memory of fingerprints and tenants.

Holds what identification remembers between requests (the request fingerprint of each
session, the roots ``[[agents]]`` bindings resolve to) and applies ``lineage.find_session``.
No I/O beyond resolving a bound root once; the catalog queries it makes are in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from proxy.identity.identify import RequestSignals
from proxy.identity.lineage import ONE_TENANT, Lineage, SessionIndex, Tenant, find_session
from proxy.identity.prompt_prints import Fingerprints, fingerprint
from proxy.policy.records import RuleSet
from proxy.values import frozen_value
from proxy.wire.content import HEAD_ROLES, has_role

__all__ = ["Found", "SessionFinder"]

_PRINT_CACHE = 4096
_UNKNOWN = object()


@frozen_value
class Found:
    lineage: Lineage
    tenant: Tenant
    print_: str | None  # the request's fingerprint (system prompt and tools)
    planted: bool = False  # this request recorded its session's first fingerprint


class SessionFinder:
    def __init__(self, catalog: SessionIndex, *, prints: Fingerprints | None = None,
                 single_tenant: bool = True,
                 resolve_root: Callable[[str], str] = lambda root: root) -> None:
        self.catalog = catalog
        self.prints = prints if prints is not None else Fingerprints()
        # One transcript tenant (one root, or the default roots of one user): weak evidence
        # is trusted for any request. Else only through a bound agent prefix.
        self.single_tenant = single_tenant
        self._resolve_root = resolve_root
        self._bound: dict[str, str] = {}
        self._prints_by_head: dict[int, object] = {}

    def find(self, signals: RequestSignals, body: Mapping[str, Any], rules: RuleSet) -> Found:
        print_ = self._fingerprint(body)
        tenant = self._tenant(signals, rules)
        lineage = find_session(signals, body, self.catalog, prints=self.prints, print_=print_,
                               tenant=tenant)
        sid = lineage.session_id
        planted = False
        if sid is not None and print_ is not None and not signals.cache_warm and (
                lineage.evidence == "strong"
                or (lineage.evidence == "weak" and lineage.trusted and tenant.certain
                    and self.prints.get(sid) is None)):
            # A guessed text never replaces a fingerprint, and plants one only where the
            # tenant is certain; a claimed id alone plants none: what a carry is checked
            # against (proxy.floor.stage) is never what the claimant sent.
            planted = self.prints.get(sid) is None
            self.prints.record(sid, print_)
        return Found(lineage, tenant, print_, planted)

    def prime(self, body: Mapping[str, Any]) -> None:
        """The fingerprint ``find`` will look up for ``body``, made ahead: for a large request,
        in the worker thread that identifies it, not on the event loop (a system prompt of
        megabytes takes a second to normalise). A body it cannot fingerprint is left to
        ``find``, which says so in the lineage."""
        try:
            self._fingerprint(body)
        except Exception:
            return

    def resolved(self, root: str) -> str:
        """A root named in the rules, in the form the tracker records (resolved once)."""
        found = self._bound.get(root)
        if found is None:
            found = self._bound[root] = self._resolve_root(root)
        return found

    def _tenant(self, signals: RequestSignals, rules: RuleSet) -> Tenant:
        """The transcript root the request may draw on without strong evidence."""
        bound = rules.agent_root(signals.agent_id) if signals.agent_source == "path" else None
        if bound is not None:
            return Tenant(True, self.resolved(bound))
        return ONE_TENANT if self.single_tenant else Tenant(False)

    def _fingerprint(self, body: Mapping[str, Any]) -> str | None:
        # System prompts are 2-40 KB: normalise each distinct one once.
        messages = body.get("messages")
        head = messages[0] if isinstance(messages, list) and messages else None
        # A plain {role, content} head is keyed by its text: a string keeps its hash, which
        # the request's other lookups of the same text then reuse. A first message that is
        # no system prompt takes no part in the fingerprint (the tools alone make it): it is
        # not written out (on the event loop) only to be hashed.
        first: object
        if not has_role(head, HEAD_ROLES):
            first = None
        elif isinstance(head, dict) and len(head) == 2 and head.get("content").__class__ is str:
            first = (head.get("role"), head["content"])
        else:
            first = orjson.dumps(head)
        key = hash((first, orjson.dumps(body.get("tools") or [])))
        known = self._prints_by_head.get(key, _UNKNOWN)  # one lookup: prime() may clear it
        if known is not _UNKNOWN:
            return known if isinstance(known, str) else None
        found = fingerprint(body)
        if len(self._prints_by_head) >= _PRINT_CACHE:
            self._prints_by_head.clear()
        self._prints_by_head[key] = found
        return found
