"""The policy: what the floor does for a request, as frozen records, and how one is chosen.

A ``RuleSet`` is built once from the TOML files (``proxy.policy.parse``) or from the built-in
defaults below, which are the same values as ``rules/default.toml``. Choosing the policy of a
request (``RuleSet.resolve``) walks the ordered rules, first match wins, with a small cache, so
it costs a dict lookup in the steady state. Every rule's policy is merged with the defaults
when the rules are parsed, never per request.

Patterns (agent id, model, session key, model table) are shell-style globs (``*``, ``?``,
``[...]``), matched case-insensitively against the whole value.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from proxy.policy.pin_patterns import DEFAULT_PIN_PATTERNS

if TYPE_CHECKING:
    from proxy.policy.prices import PriceList

__all__ = [
    "CARRY_PLACEHOLDERS",
    "MODES",
    "ON_OVERFLOW",
    "REPORT_USAGE",
    "RESET_KINDS",
    "AgentRoot",
    "Identification",
    "Match",
    "Mode",
    "ModelSpec",
    "Notes",
    "OnOverflow",
    "Pattern",
    "Policy",
    "ReportUsage",
    "Rule",
    "RuleSet",
    "StoreLimits",
    "builtin_rules",
]

Mode = Literal["enforce", "shadow", "off"]
OnOverflow = Literal["recover", "passthrough"]
ReportUsage = Literal["client", "upstream"]
MODES: Final = ("enforce", "shadow", "off")
RESET_KINDS: Final = ("daily", "idle", "new", "reset")
REPORT_USAGE: Final = ("client", "upstream")
ON_OVERFLOW: Final = ("recover", "passthrough")
CARRY_PLACEHOLDERS: Final = ("ended_at", "session_id", "reason", "messages")
_CACHE_LIMIT = 4096


# The default pin marker (proxy/floor/pins.py), compiled once for every policy.
DEFAULT_PINS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE) for p in DEFAULT_PIN_PATTERNS)

@dataclass(frozen=True, slots=True)
class Pattern:
    """A glob, compiled once."""

    glob: str
    regex: re.Pattern[str] = field(compare=False, repr=False)

    @classmethod
    def of(cls, glob: str) -> Pattern:
        return cls(glob, re.compile(fnmatch.translate(glob), re.IGNORECASE | re.DOTALL))

    def matches(self, value: str | None) -> bool:
        return value is not None and self.regex.match(value) is not None


@dataclass(frozen=True, slots=True)
class Notes:
    """Texts tailfloor adds to a rewritten request."""

    summary_followed: str = (
        "The most recent messages of this conversation follow this summary verbatim; "
        "where they overlap with the summary, they take precedence.")
    carry_forward: str = (
        "[tailfloor] The {messages} messages below come from the previous session of this "
        "conversation, which ended at {ended_at} ({reason}). They are earlier context, "
        "not a new request.")
    carry_forward_end: str = (
        "[tailfloor] End of the previous session's messages. The current session starts here.")
    pinned: str = "[tailfloor] Pinned by the user earlier in this conversation:"

    def carry_forward_text(self, *, messages: int, ended_at: str, session_id: str,
                           reason: str) -> str:
        """The opening marker with its placeholders filled (validated when parsed)."""
        return self.carry_forward.format(messages=messages, ended_at=ended_at,
                                         session_id=session_id, reason=reason)


@dataclass(frozen=True, slots=True)
class Policy:
    """Everything the floor and overflow recovery need to decide for one request."""

    mode: Mode = "enforce"
    min_tail_messages: int = 30
    carry_forward_on_reset: bool = True
    carry_reset_kinds: frozenset[str] = frozenset(RESET_KINDS)
    reserve_tokens: int = 16384
    report_usage: ReportUsage = "client"
    on_overflow: OnOverflow = "recover"
    preflight: bool = True
    summary_model: str | None = None
    summary_max_tokens: int = 4096
    summarizer_timeout: float = 120.0
    min_output_tokens: int = 1024  # an output limit is lowered to fit, never below this...
    min_output_share: float = 0.25  # ...or this share of what was asked, when smaller
    overflow_patterns: tuple[re.Pattern[str], ...] = ()  # extra overflow messages (issue 5)
    # Pinned messages (proxy/floor/pins.py): user messages matching these stay in every
    # request raw, after the summary; at most max_pinned, within pinned_token_budget.
    pin_patterns: tuple[re.Pattern[str], ...] = field(default_factory=lambda: DEFAULT_PINS)
    pin_assistant: bool = False
    max_pinned: int = 16
    pinned_token_budget: int = 2000
    # A new session whose first user message starts with this gets no carry ("" : none).
    clean_slate_marker: str | None = "--clean"
    notes: Notes = field(default_factory=Notes)
    source: str = "defaults"  # "defaults" or the name of the rule that produced it

    def carries(self, reset_kind: str) -> bool:
        """Whether a reset of this kind carries the predecessor's tail forward."""
        return self.carry_forward_on_reset and reset_kind in self.carry_reset_kinds

    def token_budget(self, context_window: int) -> int:
        """Tokens a request may use: the window minus the reserve (at most a quarter of it)."""
        return context_window - min(self.reserve_tokens, context_window // 4)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    pattern: str
    context_window: int
    encoding: str
    margin: float


@dataclass(frozen=True, slots=True)
class Identification:
    """Where a request's session is named (read before any policy is known, so global)."""

    session_headers: tuple[str, ...] = ("x-tailfloor-session", "session_id", "x-session-affinity",
                                        "x-client-request-id")
    agent_header: str | None = "x-tailfloor-agent"


@dataclass(frozen=True, slots=True)
class AgentRoot:
    """``[[agents]]``: requests through ``/agents/<id>/`` belong to this transcript root.

    Each ``--sessions`` root is a tenant; with several, content-free identification (the
    request fingerprint) is only trusted for a request whose agent prefix is bound here."""

    agent_id: str
    root: str
    # A file holding the agent's key: requests through its prefix must carry it in
    # ``x-tailfloor-agent-key`` to be given anything of a session (the rules hold no secret).
    key_file: str | None = None


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_entries_per_session: int = 8
    max_entries_total: int = 10000


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    file: str
    index: int  # position in its file's [[rules]] list, from 0
    agent: Pattern | None
    model: Pattern | None
    session_key: Pattern | None
    overrides: tuple[str, ...]  # policy fields this rule sets; the rest come from the defaults
    policy: Policy
    dialect: Pattern | None = None  # chat_completions | responses | messages

    def matches(self, agent: str | None, model: str | None, session_key: str | None,
                dialect: str | None = None) -> bool:
        return all(p is None or p.matches(v) for p, v in (
            (self.agent, agent), (self.model, model), (self.session_key, session_key),
            (self.dialect, dialect or "chat_completions")))


@dataclass(frozen=True, slots=True)
class Match:
    rule: Rule | None  # None: the defaults apply
    policy: Policy


_BUILTIN_MODELS: Final = (
    ModelSpec("*gpt-4o*", 128000, "o200k_base", 0.0),
    ModelSpec("*gpt-4.1*", 1047576, "o200k_base", 0.0),
    ModelSpec("*gpt-5*", 400000, "o200k_base", 0.0),
    ModelSpec("o[134]", 200000, "o200k_base", 0.0),
    ModelSpec("o[134]-*", 200000, "o200k_base", 0.0),
    ModelSpec("*/o[134]", 200000, "o200k_base", 0.0),
    ModelSpec("*/o[134]-*", 200000, "o200k_base", 0.0),
    ModelSpec("*gpt-4-turbo*", 128000, "cl100k_base", 0.0),
    ModelSpec("*gpt-4*", 8192, "cl100k_base", 0.0),
    ModelSpec("*gpt-3.5-turbo*", 16385, "cl100k_base", 0.0),
    ModelSpec("*claude*", 200000, "o200k_base", 0.25),
)
_BUILTIN_UNKNOWN: Final = ModelSpec("*", 128000, "o200k_base", 0.2)


def _no_prices() -> PriceList:
    # Imported here: prices.py uses this module's Pattern.
    from proxy.policy.prices import PriceList

    return PriceList()


@dataclass(frozen=True, slots=True)
class RuleSet:
    defaults: Policy = field(default_factory=Policy)
    rules: tuple[Rule, ...] = ()
    models: tuple[ModelSpec, ...] = _BUILTIN_MODELS
    unknown_model: ModelSpec = _BUILTIN_UNKNOWN
    identification: Identification = field(default_factory=Identification)
    store: StoreLimits = field(default_factory=StoreLimits)
    agents: tuple[AgentRoot, ...] = ()
    files: tuple[str, ...] = ()
    prices: PriceList = field(default_factory=_no_prices)
    # Derived state, never passed in (so dataclasses.replace cannot share a cache).
    _model_patterns: tuple[Pattern, ...] = field(init=False, compare=False, repr=False)
    _policies: dict[tuple[str | None, str | None, str | None, str | None], Match] = field(
        init=False, compare=False, repr=False)
    _model_cache: dict[str, ModelSpec] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_model_patterns",
                           tuple(Pattern.of(m.pattern) for m in self.models))
        object.__setattr__(self, "_policies", {})
        object.__setattr__(self, "_model_cache", {})

    def explain(self, agent: str | None, model: str | None, session_key: str | None,
                dialect: str | None = None) -> Match:
        """The first rule matching the request (or the defaults) and the policy it yields."""
        key = (agent, model, session_key, dialect)
        found = self._policies.get(key)
        if found is None:
            found = next((Match(r, r.policy) for r in self.rules
                          if r.matches(agent, model, session_key, dialect)), None)
            found = found or Match(None, self.defaults)
            if len(self._policies) >= _CACHE_LIMIT:
                self._policies.clear()
            self._policies[key] = found
        return found

    def agent_root(self, agent_id: str | None) -> str | None:
        """The transcript root an ``[[agents]]`` entry binds this agent id to."""
        if agent_id is None:
            return None
        return next((a.root for a in self.agents if a.agent_id == agent_id), None)

    def resolve(self, agent: str | None, model: str | None, session_key: str | None,
                dialect: str | None = None) -> Policy:
        return self.explain(agent, model, session_key, dialect).policy

    def model(self, name: str | None) -> ModelSpec:
        """Context window, encoding and token margin of a model (first table row that matches)."""
        if not name:
            return self.unknown_model
        spec = self._model_cache.get(name)
        if spec is None:
            spec = next((m for m, p in zip(self.models, self._model_patterns, strict=True)
                         if p.matches(name)), self.unknown_model)
            if len(self._model_cache) >= _CACHE_LIMIT:
                self._model_cache.clear()
            self._model_cache[name] = spec
        return spec


def builtin_rules() -> RuleSet:
    """The policy used without a rules directory; ``rules/default.toml`` spells out the same."""
    return RuleSet()
