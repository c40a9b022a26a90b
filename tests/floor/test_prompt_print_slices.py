"""A system prompt normalised a slice at a time is the prompt normalised whole, so the
fingerprint that ties a new session to the last one does not change; a prompt of megabytes
is fingerprinted in the worker thread that identifies its request, in slices."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.identity.prompt_prints import normalised_pieces

# The same expression as the module's, written out here: the oracle is the prompt
# normalised whole in one call, as it always was.
VOLATILE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|(?<=sessionId=)[^ |\n]+|(?<=session=)[^ |\n]+")

PIECES = st.sampled_from([
    "2026-11-30", "2026-11-30 02:27", "2026-11-30T02:27:59.5+01:00", " ", "7", "12", "abc",
    "sessionId=", "session=", "sessionId=e3b0c442", "deadbeef-0000-4000-8000-0123456789ab",
    "Runtime: agent=a | session=agent:a:main | sessionId=e3b0c442-98fc-1c14", "x" * 7,
    '{"session":1,', "mysession=ab", "\u0662\u0660\u0662\u0666-\u0661\u0661-\u0663\u0660"])
# What a prompt has between its parts, at least every few dozen characters: lines, Runtime
# fields, words.
BETWEEN = st.sampled_from(["\n", "|", " | ", "a ", "\n\n", "words and "])


@settings(max_examples=600, deadline=None)
@given(parts=st.lists(st.tuples(PIECES, BETWEEN), max_size=30), step=st.integers(80, 200))
def test_slices_normalise_as_the_whole_prompt(parts: list[tuple[str, str]], step: int) -> None:
    text = "".join(piece + between for piece, between in parts)
    pieces = list(normalised_pieces(text, step))
    assert "".join(pieces) == VOLATILE.sub("~", text)


@pytest.mark.parametrize("text", [
    "You are a coding agent; today is 2026-11-30 02:27. " * 20_000,  # no newline
    "x" * 300_000,  # no separator at all: cut after a character no date or uuid holds
])
def test_a_long_line_is_normalised_in_bounded_slices(text: str) -> None:
    pieces = list(normalised_pieces(text))
    assert "".join(pieces) == VOLATILE.sub("~", text)
    assert max(len(p) for p in pieces) <= 65_536


ARABIC_DATE = "\u0662\u0660\u0662\u0666-\u0661\u0661-\u0663\u0660"  # \\d is any decimal digit


@pytest.mark.parametrize("text", [
    "x" * 65_530 + "session=abc",  # the keyword cut at the slice's end
    "x" * 65_528 + "sessionId=abc",
    "x" * 65_520 + "mysession=abc" + "y" * 100 + " z",
    "x" * 65_530 + ARABIC_DATE + "x",  # a date in other digits across the slice's end
    '{"session":1,' + "x" * 65_519 + "2026-11-30T12:00:00Z" + "x",  # a word, not a keyword
])
def test_a_slice_without_separators_is_cut_where_no_match_crosses(text: str) -> None:
    assert "".join(normalised_pieces(text)) == VOLATILE.sub("~", text)


def test_a_line_with_no_place_to_cut_is_still_cut() -> None:
    # Nothing but dates and spaces after digits: cut where the slice ends (the only case
    # where the pieces may differ from the whole; still the same for the same prompt).
    text = "2026-11-30 02:27 " * 20_000
    pieces = list(normalised_pieces(text))
    assert max(len(p) for p in pieces) <= 65_536
    assert pieces == list(normalised_pieces(text))
