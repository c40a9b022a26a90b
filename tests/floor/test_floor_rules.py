from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from proxy.policy.parse import RulesError, parse_rules
from proxy.policy.records import Notes, Policy, RuleSet, builtin_rules

REPO = Path(__file__).resolve().parents[2]


def parse(*texts: str) -> RuleSet:
    return parse_rules([(f"{i:02d}.toml", t) for i, t in enumerate(texts)])


def problems(*texts: str) -> list[str]:
    with pytest.raises(RulesError) as caught:
        parse(*texts)
    return caught.value.problems


def test_shipped_default_toml_equals_the_builtin_policy() -> None:
    shipped = parse_rules([("default.toml", (REPO / "rules" / "default.toml").read_text())])
    assert dataclasses.replace(shipped, files=()) == builtin_rules()
    assert shipped.rules == ()


def test_empty_rule_set_is_the_builtin_policy() -> None:
    assert parse_rules([]) == builtin_rules()
    assert builtin_rules().defaults.min_tail_messages == 30
    assert builtin_rules().defaults.carry_forward_on_reset is True


def test_first_matching_rule_wins_and_unset_fields_come_from_defaults() -> None:
    rules = parse("""
[defaults]
min_tail_messages = 12
reserve_tokens = 2000

[[rules]]
name = "ops on claude"
agent = "ops-*"
model = "*claude*"
min_tail_messages = 50
[rules.notes]
summary_followed = "Raw messages follow."

[[rules]]
name = "all ops"
agent = "ops-*"
mode = "shadow"

[[rules]]
name = "main session"
session_key = "agent:*:main"
carry_forward_on_reset = false
""")
    first = rules.resolve("ops-eu", "anthropic/Claude-Sonnet-4", None)
    assert first.source == "ops on claude"
    assert first.min_tail_messages == 50
    assert first.reserve_tokens == 2000 and first.mode == "enforce"
    assert first.notes.summary_followed == "Raw messages follow."
    assert first.notes.carry_forward == Notes().carry_forward
    second = rules.resolve("OPS-us", "gpt-4o", None)
    assert (second.source, second.mode, second.min_tail_messages) == ("all ops", "shadow", 12)
    third = rules.resolve("main", "gpt-4o", "agent:main:main")
    assert third.source == "main session" and not third.carries("daily")
    assert rules.resolve("main", "gpt-4o", None).source == "defaults"
    assert rules.resolve(None, None, None) == rules.defaults
    match = rules.explain("ops-eu", "claude-x", None)
    assert match.rule is not None and match.rule.overrides == (
        "min_tail_messages", "notes.summary_followed")


def test_resolution_is_cached_and_stable() -> None:
    rules = parse('[[rules]]\nname = "a"\nagent = "a*"\nmin_tail_messages = 3\n')
    assert rules.resolve("ab", "m", None) is rules.resolve("ab", "m", None)
    for i in range(5000):
        rules.resolve(f"agent-{i}", "m", None)
    assert len(rules._policies) <= 4096
    assert rules.resolve("ab", "m", None).min_tail_messages == 3


def test_files_combine_in_name_order() -> None:
    rules = parse(
        '[defaults]\nmin_tail_messages = 5\nmode = "shadow"\n'
        '[[rules]]\nname = "early"\nagent = "x"\nmin_tail_messages = 1\n',
        '[defaults]\nmin_tail_messages = 9\n'
        '[[rules]]\nname = "late"\nagent = "x"\nmin_tail_messages = 2\n'
        '[identification]\nsession_headers = ["X-Conversation"]\nagent_header = ""\n')
    assert rules.defaults.min_tail_messages == 9 and rules.defaults.mode == "shadow"
    assert [r.name for r in rules.rules] == ["early", "late"]
    assert rules.resolve("x", None, None).min_tail_messages == 1
    assert rules.identification.session_headers == ("x-conversation",)
    assert rules.identification.agent_header is None


def test_model_table_and_unknown_models() -> None:
    builtin = builtin_rules()
    assert builtin.model("gpt-4o-mini").encoding == "o200k_base"
    assert builtin.model("openai/gpt-4o").context_window == 128000
    assert builtin.model("gpt-4-0613").context_window == 8192
    assert builtin.model("o3-mini").context_window == 200000
    assert builtin.model("claude-sonnet-4").margin == 0.25
    unknown = builtin.model("qwen3-coder-30b")
    assert unknown == builtin.unknown_model and unknown.margin > 0
    assert builtin.model(None) == builtin.unknown_model
    custom = parse('[[models]]\npattern = "qwen*"\ncontext_window = 32768\nencoding = "estimate"\n'
                   '[unknown_model]\ncontext_window = 8192\n')
    assert custom.model("Qwen3-Coder").context_window == 32768
    assert custom.model("gpt-4o").context_window == 8192  # the table was replaced
    assert custom.model("gpt-4o").margin == builtin.unknown_model.margin


def test_policy_helpers() -> None:
    policy = Policy(reserve_tokens=16384, carry_reset_kinds=frozenset({"daily"}))
    assert policy.token_budget(200000) == 200000 - 16384
    assert policy.token_budget(8192) == 8192 - 2048  # reserve capped at a quarter of the window
    assert policy.carries("daily") and not policy.carries("idle")
    assert not dataclasses.replace(policy, carry_forward_on_reset=False).carries("daily")


def test_overflow_patterns_compile_case_insensitive() -> None:
    rules = parse('[defaults]\noverflow_patterns = ["context budget of \\\\d+ exhausted"]\n')
    (pattern,) = rules.defaults.overflow_patterns
    assert isinstance(pattern, re.Pattern)
    assert pattern.search("Context budget of 4096 EXHAUSTED")


def test_every_problem_of_the_file_set_is_reported_with_its_location() -> None:
    found = problems(
        """
[defaults]
min_tail_messages = "thirty"
mode = "loud"
carry_reset_kinds = ["daily", "weekly"]
overflow_patterns = ["(unclosed"]
[defaults.notes]
carry_forward = "ended {when}"

[[rules]]
name = "bad one"
agent = "x"
reserve_tokens = -5
on_overflow = "retry"
min_tail_mesages = 3
""",
        "[defaults\nbroken",
        '[[models]]\npattern = "m*"\nencoding = "p50k_base"\ncontext_window = 0\n'
        '[[rules]]\nname = "bad one"\n[store]\nmax_entries_total = 0\n[surprise]\n')
    text = "\n".join(found)
    expected = [
        "00.toml: [defaults]: field min_tail_messages = 'thirty'",
        "00.toml: [defaults]: field mode = 'loud'",
        "unknown reset kind 'weekly'",
        "pattern '(unclosed' does not compile",
        "00.toml: [defaults.notes]: field carry_forward = 'ended {when}': unknown placeholder",
        "00.toml: rules[0] 'bad one': field reserve_tokens = -5",
        "00.toml: rules[0] 'bad one': field on_overflow = 'retry'",
        "00.toml: rules[0] 'bad one': unknown field 'min_tail_mesages'",
        "01.toml: not valid TOML",
        "02.toml: models[0]: field encoding = 'p50k_base'",
        "02.toml: models[0]: field context_window = 0",
        "02.toml: rules[0] 'bad one': name 'bad one' already used in 00.toml",
        "02.toml: [store]: field max_entries_total = 0",
        "02.toml: unknown section 'surprise'",
    ]
    for piece in expected:
        assert piece in text, piece
    assert len(found) == len(expected)


def test_structural_mistakes_are_problems_not_crashes() -> None:
    found = problems('rules = "nope"\nmodels = 3\n',
                     "defaults = 1\n[[rules]]\nname = 7\nagent = 1\n",
                     '[[models]]\npattern = "x"\n',
                     '[defaults]\nnotes = "x"\ncarry_forward_on_reset = "yes"\n'
                     '[defaults.summary]\n')
    text = "\n".join(found)
    for piece in ("00.toml: rules must be an array", "00.toml: models must be an array",
                  "01.toml: [defaults]: expected a table", "01.toml: rules[0]: field name = 7",
                  "01.toml: rules[0]: field agent = 1", "02.toml: models[0]: missing field",
                  "03.toml: [defaults.notes]: expected a table",
                  "03.toml: [defaults]: field carry_forward_on_reset = 'yes'",
                  "03.toml: [defaults]: unknown field 'summary'"):
        assert piece in text, piece


def test_notes_placeholders_and_literal_braces() -> None:
    rules = parse('[defaults.notes]\ncarry_forward = "{{tf}} {messages} from {session_id} '
                  'at {ended_at} ({reason})"\n')
    text = rules.defaults.notes.carry_forward_text(
        messages=3, session_id="s1", ended_at="2026-11-30T02:27:00Z", reason="daily")
    assert text == "{tf} 3 from s1 at 2026-11-30T02:27:00Z (daily)"
    assert any("bad braces" in p for p in problems('[defaults.notes]\ncarry_forward = "{x"\n'))
    default = Notes().carry_forward_text(messages=30, session_id="s", ended_at="T", reason="idle")
    assert "30 messages" in default and "ended at T (idle)" in default


def test_summary_model_empty_means_none() -> None:
    assert parse('[defaults]\nsummary_model = ""\n').defaults.summary_model is None
    rules = parse('[defaults]\nsummary_model = "gpt-4o-mini"\nsummarizer_timeout = 30\n')
    assert rules.defaults.summary_model == "gpt-4o-mini"
    assert rules.defaults.summarizer_timeout == 30.0


def test_a_rule_can_match_the_dialect() -> None:
    rules = parse("""
[[rules]]
name = "claude api"
dialect = "messages"
min_tail_messages = 40

[[rules]]
name = "responses off"
dialect = "responses"
mode = "off"
""")
    assert rules.resolve("a", "m", None, "messages").min_tail_messages == 40
    assert rules.resolve("a", "m", None, "responses").mode == "off"
    plain = rules.resolve("a", "m", None)
    assert plain.min_tail_messages != 40 and plain.mode != "off"
    assert rules.resolve("a", "m", None, "chat_completions") == plain
