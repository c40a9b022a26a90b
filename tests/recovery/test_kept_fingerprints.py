"""Remembered fingerprints of long texts: a derived session key is the same with the memory
as without it, whatever the memory saw before, and the memory stays within its budget."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.recovery.message_chain import KeptFingerprints, message_fingerprint
from proxy.recovery.request import derived_session_key

_LONG = KeptFingerprints.MIN_TEXT


def _text(seed: str, size: int) -> str:
    return (seed * (size // max(len(seed), 1) + 1))[:size]


_MESSAGES = st.builds(
    lambda role, seed, size, extra: {"role": role, "content": _text(seed, size), **extra},
    st.sampled_from(("system", "developer", "user", "assistant")),
    st.text(min_size=1, max_size=8), st.sampled_from((10, _LONG - 1, _LONG, _LONG + 7, 9000)),
    st.sampled_from(({}, {"name": "x"},
                     {"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]})))


@given(st.lists(st.lists(_MESSAGES, min_size=1, max_size=4), min_size=1, max_size=6),
       st.integers(1, 40_000))
def test_a_derived_key_is_the_same_with_the_memory_and_without(
        requests: list[list[dict[str, Any]]], budget: int) -> None:
    kept = KeptFingerprints(budget=budget)
    for messages in requests:
        head, conversation = messages[:-1], messages[-1:]
        assert derived_session_key("m", head, conversation, kept) == \
            derived_session_key("m", head, conversation)


def test_a_text_of_the_same_length_is_never_taken_for_a_kept_one() -> None:
    kept = KeptFingerprints()
    first = {"role": "system", "content": "a" * 5000}
    other = {"role": "system", "content": "a" * 4999 + "b"}
    as_user = {"role": "user", "content": "a" * 5000}
    assert kept.of(first) == message_fingerprint(first)
    assert kept.of(other) == message_fingerprint(other) != kept.of(first)
    assert kept.of(as_user) == message_fingerprint(as_user) != kept.of(first)


def test_the_kept_texts_stay_within_the_budget() -> None:
    kept = KeptFingerprints(budget=20_000)
    for n in range(50):
        kept.of({"role": "system", "content": f"{n:05d}" + "x" * 6000})
        assert sum(len(text) for _role, text in kept._kept) <= 20_000
    huge = {"role": "system", "content": "y" * 30_000}  # over the budget alone: not kept
    assert kept.of(huge) == message_fingerprint(huge)
    assert all(text != huge["content"] for _role, text in kept._kept)
