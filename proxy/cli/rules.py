"""``tailfloor rules check DIR``: validate a rules directory and explain what applies.

Exit status: 0 valid, 1 invalid (every problem printed, one per line), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from proxy.policy.files import load_rules_dir
from proxy.policy.parse import POLICY_FIELDS as _POLICY_FIELDS
from proxy.policy.parse import RulesError
from proxy.policy.records import Policy, Rule, RuleSet


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("rules", help="validate and explain policy files")
    sub = parser.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    check = sub.add_parser(
        "check", help="validate a rules directory and explain which rules apply",
        description="Validate every *.toml in DIR (all problems at once) and print the "
                    "policy. With --agent/--model/--session-key, show which rule a request "
                    "with those values gets.")
    check.add_argument("directory", type=Path, metavar="DIR")
    check.add_argument("--agent", help="agent id of a hypothetical request")
    check.add_argument("--model", help="model of a hypothetical request")
    check.add_argument("--session-key", dest="session_key", help="its session key or id")
    check.set_defaults(run=run)


def run(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        rules = load_rules_dir(ns.directory)
    except RulesError as exc:
        print(f"{ns.directory}: {len(exc.problems)} problem(s):", file=out)
        for problem in exc.problems:
            print(f"  {problem}", file=out)
        return 1
    describe(rules, out)
    if ns.agent is not None or ns.model is not None or ns.session_key is not None:
        explain(rules, ns.agent, ns.model, ns.session_key, out)
    return 0


def _value(policy: Policy, name: str) -> str:
    value = getattr(policy, name)
    if isinstance(value, frozenset):
        return "[" + ", ".join(sorted(value)) + "]"
    if isinstance(value, tuple):
        return "[" + ", ".join(p.pattern for p in value) + "]"
    return repr(value)


def _match_text(rule: Rule) -> str:
    parts = [f"{key}={pattern.glob!r}" for key, pattern in
             (("agent", rule.agent), ("model", rule.model), ("session_key", rule.session_key))
             if pattern is not None]
    return " ".join(parts) or "(matches every request)"


def describe(rules: RuleSet, out: TextIO) -> None:
    files = ", ".join(rules.files) or "none (built-in defaults)"
    print(f"OK: {len(rules.files)} file(s): {files}", file=out)
    print("defaults:", file=out)
    for name in _POLICY_FIELDS:
        print(f"  {name} = {_value(rules.defaults, name)}", file=out)
    print(f"rules ({len(rules.rules)}, first match wins):", file=out)
    for position, rule in enumerate(rules.rules):
        sets = ", ".join(rule.overrides) or "nothing (defaults)"
        print(f"  {position}. {rule.name!r} [{rule.file} rules[{rule.index}]] "
              f"when {_match_text(rule)}; sets {sets}", file=out)
    print("models (first match wins):", file=out)
    for spec in (*rules.models, rules.unknown_model):
        print(f"  {spec.pattern!r}: window {spec.context_window}, encoding {spec.encoding}, "
              f"margin {spec.margin:g}", file=out)
    ident = rules.identification
    print(f"identification: headers {', '.join(ident.session_headers) or '(none)'}; "
          f"agent header {ident.agent_header or '(none)'}", file=out)
    print(f"store: {rules.store.max_entries_per_session} per session, "
          f"{rules.store.max_entries_total} in total", file=out)


def explain(rules: RuleSet, agent: str | None, model: str | None, session_key: str | None,
            out: TextIO) -> None:
    match = rules.explain(agent, model, session_key)
    print(f"request agent={agent!r} model={model!r} session_key={session_key!r}:", file=out)
    if match.rule is None:
        print("  no rule matches: the defaults apply", file=out)
    else:
        print(f"  rule {match.rule.name!r} ({match.rule.file} rules[{match.rule.index}]) "
              "applies", file=out)
    for name in _POLICY_FIELDS:
        print(f"  {name} = {_value(match.policy, name)}", file=out)
    spec = rules.model(model)
    print(f"  model table: {spec.pattern!r} -> window {spec.context_window}, "
          f"encoding {spec.encoding}, margin {spec.margin:g}; token budget "
          f"{match.policy.token_budget(spec.context_window)}", file=out)
