"""TOML policy files -> ``RuleSet``, reporting every problem of the whole file set at once.

Files are read in name order and act as one: keys of ``[defaults]``, ``[defaults.notes]``,
``[identification]``, ``[store]`` and ``[unknown_model]`` in a later file override the same
keys of an earlier one; ``[[rules]]``, ``[[models]]`` and ``[[agents]]`` lists are concatenated
in file order
(first match wins, so lower-named files are tried first). When no file has a ``[[models]]``
entry, the built-in model table is used. Unknown keys are errors: a typo must not silently
fall back to a default.

Each problem names the file, the section or rule (index and name), the field and the bad value.
"""

from __future__ import annotations

import dataclasses
import re
import string
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.policy.pin_patterns import unsafe_pattern
from proxy.policy.prices import Price, PriceList
from proxy.policy.records import (
    CARRY_PLACEHOLDERS,
    MODES,
    ON_OVERFLOW,
    REPORT_USAGE,
    RESET_KINDS,
    AgentRoot,
    Identification,
    ModelSpec,
    Notes,
    Pattern,
    Policy,
    Rule,
    RuleSet,
    StoreLimits,
)
from proxy.tokens import ENCODINGS

__all__ = ["POLICY_FIELDS", "RulesError", "parse_rules"]

_TOP_LEVEL = ("defaults", "rules", "models", "unknown_model", "identification", "store",
              "agents", "prices")
_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")
_MATCH_KEYS = ("agent", "model", "session_key")


class RulesError(ValueError):
    """The rules are invalid; ``problems`` lists every one, each naming file, rule and field."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid rules:\n" + "\n".join(f"  - {p}" for p in self.problems))


class _Bad(ValueError):
    pass


def _whole(minimum: int) -> Callable[[object], int]:
    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _Bad(f"expected a whole number >= {minimum}")
        return value
    return check


def _positive_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _Bad("expected a number > 0")
    return float(value)


def _margin(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 5:
        raise _Bad("expected a number from 0 to 5 (0.2 = count 20% more)")
    return float(value)


def _share(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise _Bad("expected a number above 0 and at most 1 (0.25 = a quarter)")
    return float(value)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Bad("expected true or false")
    return value


def _choice(options: Sequence[str]) -> Callable[[object], str]:
    def check(value: object) -> str:
        if value not in options:
            raise _Bad("expected one of " + ", ".join(repr(o) for o in options))
        return str(value)
    return check


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad("expected a non-empty string")
    return value


def _optional_text(value: object) -> str | None:
    if not isinstance(value, str):
        raise _Bad("expected a string (\"\" for none)")
    return value.strip() or None


def _strings(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Bad("expected a list of non-empty strings")
    return list(value)


def _reset_kinds(value: object) -> frozenset[str]:
    kinds = _strings(value)
    unknown = [k for k in kinds if k not in RESET_KINDS]
    if unknown:
        raise _Bad(f"unknown reset kind {unknown[0]!r}; known: {', '.join(RESET_KINDS)}")
    return frozenset(kinds)


def _regexes(value: object) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for text in _strings(value):
        try:
            compiled.append(re.compile(text, re.IGNORECASE))
        except re.error as exc:
            raise _Bad(f"pattern {text!r} does not compile: {exc}") from exc
    return tuple(compiled)


def _pin_patterns(value: object) -> tuple[re.Pattern[str], ...]:
    for text in _strings(value):
        why = unsafe_pattern(text)
        if why is not None:
            raise _Bad(f"pin pattern {text!r} is refused: {why}")
    return _regexes(value)


def _glob(value: object) -> Pattern:
    return Pattern.of(_text(value))


def _header_names(value: object) -> tuple[str, ...]:
    return tuple(name.lower() for name in _strings(value))


def _carry_text(value: object) -> str:
    text = _text(value)
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError as exc:
        raise _Bad(f"bad braces ({exc}); write {{{{ and }}}} for literal braces") from exc
    unknown = sorted(fields - set(CARRY_PLACEHOLDERS))
    if unknown:
        raise _Bad(f"unknown placeholder {{{unknown[0]}}}; known: "
                   + ", ".join("{" + p + "}" for p in CARRY_PLACEHOLDERS))
    return text


_POLICY: Mapping[str, Callable[[object], Any]] = {
    "mode": _choice(MODES),
    "min_tail_messages": _whole(0),
    "carry_forward_on_reset": _bool,
    "carry_reset_kinds": _reset_kinds,
    "reserve_tokens": _whole(0),
    "report_usage": _choice(REPORT_USAGE),
    "on_overflow": _choice(ON_OVERFLOW),
    "preflight": _bool,
    "summary_model": _optional_text,
    "summary_max_tokens": _whole(1),
    "summarizer_timeout": _positive_number,
    "min_output_tokens": _whole(1),
    "min_output_share": _share,
    "overflow_patterns": _regexes,
    "pin_patterns": _pin_patterns,
    "pin_assistant": _bool,
    "max_pinned": _whole(0),
    "pinned_token_budget": _whole(0),
    "clean_slate_marker": _optional_text,
}
POLICY_FIELDS: tuple[str, ...] = tuple(_POLICY)
_NOTES: Mapping[str, Callable[[object], Any]] = {
    "summary_followed": _text, "carry_forward": _carry_text, "carry_forward_end": _text,
    "pinned": _text}
_MODEL: Mapping[str, Callable[[object], Any]] = {
    "pattern": _text, "context_window": _whole(1), "encoding": _choice(ENCODINGS),
    "margin": _margin}
_IDENTIFICATION: Mapping[str, Callable[[object], Any]] = {
    "session_headers": _header_names, "agent_header": _optional_text}
_STORE: Mapping[str, Callable[[object], Any]] = {
    "max_entries_per_session": _whole(1), "max_entries_total": _whole(1)}
def _agent_id(value: object) -> str:
    if not isinstance(value, str) or not _AGENT_ID.match(value):
        raise _Bad("expected an agent id (1-128 letters, digits or ._:@-)")
    return value


def _absolute_path(value: object) -> str:
    if not isinstance(value, str) or not value.startswith(("/", "~")):
        raise _Bad("expected an absolute path (the --sessions root it binds to)")
    return value


def _key_file(value: object) -> str:
    if not isinstance(value, str) or not value.startswith(("/", "~")):
        raise _Bad("expected the absolute path of a file holding the agent's key")
    return value


_AGENTS: Mapping[str, Callable[[object], Any]] = {"id": _agent_id, "root": _absolute_path,
                                                  "key_file": _key_file}
_RULE_MATCH: Mapping[str, Callable[[object], Any]] = {
    "name": _text, "agent": _glob, "model": _glob, "session_key": _glob, "dialect": _glob}


class _Collector:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def table(self, where: str, raw: object, schema: Mapping[str, Callable[[object], Any]],
              nested: Sequence[str] = ()) -> dict[str, Any]:
        """Validate a TOML table against ``schema``; bad or unknown keys become problems."""
        if not isinstance(raw, dict):
            self.problems.append(f"{where}: expected a table, got {raw!r}")
            return {}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            check = schema.get(key)
            if check is None:
                if key not in nested:
                    known = ", ".join(sorted(schema))
                    self.problems.append(f"{where}: unknown field {key!r} (known: {known})")
                continue
            try:
                values[key] = check(value)
            except _Bad as exc:
                self.problems.append(f"{where}: field {key} = {value!r}: {exc}")
        return values


def parse_rules(sources: Sequence[tuple[str, str]]) -> RuleSet:
    """Build a ``RuleSet`` from ``(file name, TOML text)`` pairs, in the order given."""
    c = _Collector()
    defaults: dict[str, Any] = {}
    notes: dict[str, Any] = {}
    merged: dict[str, dict[str, Any]] = {"identification": {}, "store": {}, "unknown_model": {}}
    raw_rules: list[tuple[str, int, dict[str, Any]]] = []
    models: list[ModelSpec] = []
    agents: list[AgentRoot] = []
    prices: list[Price] = []
    for file, text in sources:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            c.problems.append(f"{file}: not valid TOML: {exc}")
            continue
        for key in doc:
            if key not in _TOP_LEVEL:
                known = ", ".join(_TOP_LEVEL)
                c.problems.append(f"{file}: unknown section {key!r} (known: {known})")
        if "defaults" in doc:
            defaults.update(c.table(f"{file}: [defaults]", doc["defaults"], _POLICY, ("notes",)))
            if isinstance(doc["defaults"], dict) and "notes" in doc["defaults"]:
                notes.update(c.table(f"{file}: [defaults.notes]", doc["defaults"]["notes"], _NOTES))
        for section, schema in (("identification", _IDENTIFICATION), ("store", _STORE),
                                ("unknown_model", _MODEL)):
            if section in doc:
                merged[section].update(c.table(f"{file}: [{section}]", doc[section], schema))
        models.extend(_models(c, file, doc.get("models", [])))
        agents.extend(_agents(c, file, doc.get("agents", [])))
        prices.extend(_prices(c, file, doc.get("prices", [])))
        rules = doc.get("rules", [])
        if not isinstance(rules, list):
            c.problems.append(f"{file}: rules must be an array of tables ([[rules]])")
            rules = []
        raw_rules.extend((file, i, r) for i, r in enumerate(rules))

    base = dataclasses.replace(Policy(), **defaults, notes=dataclasses.replace(Notes(), **notes))
    built = _rules(c, base, raw_rules)
    unknown = merged["unknown_model"]
    unknown_spec = dataclasses.replace(RuleSet().unknown_model, **unknown)
    if c.problems:
        raise RulesError(c.problems)
    return RuleSet(
        defaults=base, rules=built, models=tuple(models) if models else RuleSet().models,
        unknown_model=unknown_spec,
        identification=dataclasses.replace(Identification(), **merged["identification"]),
        store=dataclasses.replace(StoreLimits(), **merged["store"]),
        agents=tuple(agents), files=tuple(file for file, _ in sources),
        prices=PriceList(tuple(prices)))


def _price(value: object) -> float:
    """Dollars per million tokens: a number, zero allowed (a free or local model)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _Bad("must be a number >= 0 (USD per million tokens)")
    return float(value)


_PRICE: Mapping[str, Callable[[object], Any]] = {
    "model": _text, "input": _price, "output": _price, "cache_read": _price,
    "cache_write": _price}


def _prices(c: _Collector, file: str, raw: object) -> list[Price]:
    if not isinstance(raw, list):
        c.problems.append(f"{file}: prices must be an array of tables ([[prices]])")
        return []
    rows = []
    for i, entry in enumerate(raw):
        values = c.table(f"{file}: prices[{i}]", entry, _PRICE)
        missing = [k for k in ("model", "input", "output")
                   if isinstance(entry, dict) and k not in entry]
        if missing:
            c.problems.append(f"{file}: prices[{i}]: missing field {missing[0]!r}")
        elif values.keys() >= {"model", "input", "output"}:
            rows.append(Price(values["model"], values["input"], values["output"],
                              values.get("cache_read"), values.get("cache_write")))
    return rows


def _agents(c: _Collector, file: str, raw: object) -> list[AgentRoot]:
    if not isinstance(raw, list):
        c.problems.append(f"{file}: agents must be an array of tables ([[agents]])")
        return []
    bound = []
    for i, entry in enumerate(raw):
        values = c.table(f"{file}: agents[{i}]", entry, _AGENTS)
        if isinstance(entry, dict) and not {"id", "root"} <= entry.keys():
            c.problems.append(f"{file}: agents[{i}]: needs both 'id' and 'root'")
        elif values.keys() >= {"id", "root"}:
            bound.append(AgentRoot(values["id"], values["root"], values.get("key_file")))
    return bound


def _models(c: _Collector, file: str, raw: object) -> list[ModelSpec]:
    if not isinstance(raw, list):
        c.problems.append(f"{file}: models must be an array of tables ([[models]])")
        return []
    specs = []
    for i, entry in enumerate(raw):
        where = f"{file}: models[{i}]"
        values = c.table(where, entry, _MODEL)
        required = ("pattern", "context_window", "encoding")
        missing = [k for k in required if isinstance(entry, dict) and k not in entry]
        if missing:
            c.problems.append(f"{where}: missing field {missing[0]!r}")
            continue
        if values.keys() >= {"pattern", "context_window", "encoding"}:
            specs.append(ModelSpec(values["pattern"], values["context_window"],
                                   values["encoding"], values.get("margin", 0.0)))
    return specs


def _rules(c: _Collector, base: Policy,
           raw_rules: list[tuple[str, int, dict[str, Any]]]) -> tuple[Rule, ...]:
    built: list[Rule] = []
    seen: dict[str, str] = {}
    for file, index, raw in raw_rules:
        name = raw.get("name") if isinstance(raw, dict) else None
        label = f"{file}: rules[{index}]" + (f" {name!r}" if isinstance(name, str) else "")
        if not isinstance(raw, dict):
            c.problems.append(f"{label}: expected a table, got {raw!r}")
            continue
        match = c.table(label, {k: v for k, v in raw.items() if k in _RULE_MATCH}, _RULE_MATCH)
        overrides = c.table(label, {k: v for k, v in raw.items() if k not in _RULE_MATCH},
                            _POLICY, ("notes",))
        rule_notes = c.table(f"{label} notes", raw.get("notes", {}), _NOTES)
        rule_name = str(match.get("name") or f"{file}#{index}")
        if rule_name in seen:
            c.problems.append(f"{label}: name {rule_name!r} already used in {seen[rule_name]}")
        seen[rule_name] = file
        policy = dataclasses.replace(
            base, **overrides, notes=dataclasses.replace(base.notes, **rule_notes),
            source=rule_name)
        built.append(Rule(
            name=rule_name, file=file, index=index, agent=match.get("agent"),
            model=match.get("model"), session_key=match.get("session_key"),
            dialect=match.get("dialect"),
            overrides=tuple(sorted([*overrides, *(f"notes.{k}" for k in rule_notes)])),
            policy=policy))
    return tuple(built)
