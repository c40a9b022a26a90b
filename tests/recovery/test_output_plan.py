"""Lowering an output limit: the arithmetic, and the body rewritten in place."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.policy.parse import RulesError, parse_rules
from proxy.policy.records import Policy
from proxy.recovery.output import lowered_output, minimum_output, plan_clamp
from proxy.wire.members import with_output_limit


def test_minimum_output_is_the_smaller_of_the_floor_and_the_share() -> None:
    policy = Policy()  # 1024 tokens, a quarter
    assert minimum_output(policy, 4000) == 1000
    assert minimum_output(policy, 32000) == 1024
    assert minimum_output(policy, 10) == 3  # ceil(2.5)
    assert minimum_output(Policy(min_output_tokens=4096, min_output_share=1.0), 8000) == 4096
    assert minimum_output(Policy(min_output_tokens=4096, min_output_share=1.0), 2000) == 2000


@pytest.mark.parametrize(("requested", "prompt", "window", "minimum", "expected"), [
    (4000, 5000, 8192, 1000, 3192),  # OpenAI's example: the completion is what overflows
    (4000, 7900, 8192, 1000, None),  # 292 left: below the minimum, the prompt must shrink
    (3000, 5000, 8192, 750, None),  # fits as asked: the output is not what overflowed
    (0, 9000, 8192, 1, None),  # no limit asked: nothing to lower
    (1024, 2048, 2048, 256, None),  # llama.cpp: the prompt alone fills the window
    (1024, 1500, 2048, 256, 548),
])
def test_lowered_output(requested: int, prompt: int, window: int, minimum: int,
                        expected: int | None) -> None:
    assert lowered_output(requested, prompt, window, minimum) == expected


def test_the_limit_is_replaced_where_it_sits_and_nothing_else_changes() -> None:
    raw = (b'{ "model" : "m",\n  "messages": [{"role": "user", "content": "set \\"max_tokens\\"'
           b': 9000 in the config"}, {"role": "tool", "content": {"max_tokens": 9000}}],\n'
           b'  "max_tokens"  :  9000 , "temperature": 0.5e0 }')
    lowered = with_output_limit(raw, 700)
    assert lowered == raw.replace(b'"max_tokens"  :  9000', b'"max_tokens"  :  700')
    parsed = json.loads(lowered)
    assert parsed["max_tokens"] == 700
    assert parsed["messages"] == json.loads(raw)["messages"]  # the nested 9000s stay


def test_both_limits_are_lowered_and_only_when_above() -> None:
    raw = b'{"max_completion_tokens":5000,"messages":[],"max_tokens":600}'
    assert with_output_limit(raw, 1000) == (
        b'{"max_completion_tokens":1000,"messages":[],"max_tokens":600}')
    assert with_output_limit(raw, 6000) is None


@pytest.mark.parametrize("raw", [
    b'{"messages":[]}',  # no limit
    b'{"max_tokens":4000.0}',  # not a whole number: left to the upstream to judge
    b'{"max_tokens":"4000"}',
    b'[{"max_tokens":4000}]',  # not an object
    b'{"max_tokens":4000',  # cut short
    b'{"messages":[{"content":"unterminated}],"max_tokens":4000}',
])
def test_bodies_that_cannot_be_lowered(raw: bytes) -> None:
    assert with_output_limit(raw, 10) is None


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(extra=st.dictionaries(_TEXT.filter(lambda k: not k.startswith("max_")), _JSON,
                             max_size=5),
       asked=st.integers(2, 10**6), ascii_only=st.booleans(), indent=st.sampled_from([None, 2]))
def test_any_body_keeps_every_other_member(extra: dict[str, Any], asked: int, ascii_only: bool,
                                           indent: int | None) -> None:
    body = {**extra, "max_completion_tokens": asked, "messages": [extra]}
    raw = json.dumps(body, ensure_ascii=ascii_only, indent=indent).encode()
    lowered = with_output_limit(raw, asked - 1)
    assert lowered is not None
    assert json.loads(lowered) == {**body, "max_completion_tokens": asked - 1}
    # the bytes around the number are the client's own
    before, _, after = raw.partition(b'"max_completion_tokens": ' + str(asked).encode())
    assert lowered == before + b'"max_completion_tokens": ' + str(asked - 1).encode() + after


def test_plan_clamp_reports_what_it_did() -> None:
    raw = b'{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4000}'
    clamp = plan_clamp(raw, policy=Policy(), requested=4000, prompt=5000, window=8192,
                       trigger="overflow", measured=True, session="s")
    assert clamp is not None and clamp.limit == 3192 and clamp.label == "clamped:overflow"
    assert json.loads(clamp.body)["max_completion_tokens"] == 3192
    assert plan_clamp(raw, policy=Policy(), requested=4000, prompt=7900, window=8192,
                      trigger="overflow", measured=True, session="s") is None


def test_the_minimum_output_is_a_rules_key() -> None:
    rules = parse_rules([("00.toml", "[defaults]\nmin_output_tokens = 2048\n"
                                     "min_output_share = 0.5\n")])
    assert minimum_output(rules.defaults, 3000) == 1500
    with pytest.raises(RulesError) as bad:
        parse_rules([("00.toml", "[defaults]\nmin_output_share = 1.5\nmin_output_tokens = 0\n")])
    assert any("min_output_share = 1.5" in p for p in bad.value.problems)
    assert any("min_output_tokens = 0" in p for p in bad.value.problems)


def test_a_limit_that_cannot_be_lowered_in_place_lowers_none() -> None:
    """A whole-number limit beside a fractional one: lowering only one would leave the
    upstream the other, still too large."""
    raw = b'{"max_completion_tokens":9000.0,"max_tokens":9000,"messages":[]}'
    assert with_output_limit(raw, 1000) is None
    assert with_output_limit(b'{"max_completion_tokens":900.0,"max_tokens":9000}', 1000) == (
        b'{"max_completion_tokens":900.0,"max_tokens":1000}')
