"""Whitespace collapsed a slice at a time is the text collapsed whole, and the keys made from
it are the keys of the text collapsed whole; a text of megabytes is collapsed without a
word object per word."""

from __future__ import annotations

import hashlib
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.transcripts.entries import summary_key, user_text_key
from proxy.wire.openclaw import collapsed, normalise_user_text, strip_user_prefix

# Words, every kind of whitespace str.split() knows, and the marks OpenClaw adds.
TEXT = st.lists(st.sampled_from(
    ["a", "b", "\u00e9", "\U0001f600", "\ud83d", " ", "  ", "\t", "\n", "\r", "\x0b", "\x0c",
     "\x1c", "\x85", "\xa0", "\u2003", "\u3000", "[", "]", "\n\nRuntime: agent=x",
     "[Mon 2026-11-30 02:27 UTC] "]), max_size=40).map("".join)


@settings(max_examples=500, deadline=None)
@given(text=TEXT, step=st.integers(1, 9))
def test_collapsed_in_slices_is_split_and_joined_whole(text: str, step: int) -> None:
    assert "".join(collapsed(text, step)) == " ".join(text.split())


def _key(tag: bytes, text: str) -> int | None:
    return int.from_bytes(hashlib.blake2b(tag + text.encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "big") if text else None


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_keys_are_those_of_the_text_collapsed_whole(text: str) -> None:
    whole = " ".join(strip_user_prefix(text.lstrip()).split())
    assert normalise_user_text(text) == whole
    assert user_text_key(text) == _key(b"u", whole)
    assert summary_key(text) == _key(b"s", " ".join(text.split()))


def test_a_long_text_is_keyed_without_a_list_of_its_words() -> None:
    text = "[Mon 2026-11-30 02:27 UTC] " + "a few short words, " * 300_000  # 5.7 MB
    expected = _key(b"u", " ".join(strip_user_prefix(text).split()))
    tracemalloc.start()
    try:
        key = user_text_key(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert key == expected
    # Split whole, the 1.2 million words alone weigh ~70 MB (12 times the text); in slices,
    # the text without its prefix (a copy) and a slice's words.
    assert peak < 2 * len(text), peak
