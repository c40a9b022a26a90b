"""Chunked decoding: any framing an upstream may write, cut anywhere, gives the same body.

The oracle is the list of chunk bodies the test framed itself. Pieces that are each exactly
one whole chunk (how streaming upstreams write their events) take the decoder's short path;
arbitrary cuts take the general walk; both must agree with the oracle and with each other.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.upstream.chunked import ChunkedDecoder, ChunkedError

bodies = st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=8)
# How the size line of each chunk is written: lower or upper hex, leading zeros, an extension.
styles = st.lists(st.sampled_from(["lower", "upper", "zeros", "ext"]), min_size=8, max_size=8)


def size_line(size: int, style: str) -> bytes:
    if style == "upper":
        return b"%X" % size
    if style == "zeros":
        return b"%04x" % size
    if style == "ext":
        return b"%x;name=value" % size
    return b"%x" % size


def framed(chunks: list[bytes], how: list[str]) -> list[bytes]:
    """Each chunk framed alone, then the last chunk and an empty trailer section."""
    styled = zip(chunks, how[:len(chunks)], strict=True)
    return [size_line(len(c), s) + b"\r\n" + c + b"\r\n" for c, s in styled] + [b"0\r\n\r\n"]


def decode(pieces: list[bytes]) -> tuple[bytes, ChunkedDecoder]:
    decoder = ChunkedDecoder()
    out = b"".join(decoder.feed(p) for p in pieces)
    return out, decoder


@settings(max_examples=300, deadline=None)
@given(bodies, styles)
def test_one_whole_chunk_per_piece_gives_each_chunk(chunks: list[bytes], how: list[str]) -> None:
    decoder = ChunkedDecoder()
    pieces = framed(chunks, how)
    for chunk, piece in zip(chunks, pieces[:-1], strict=True):
        assert decoder.feed(piece) == chunk  # one piece, one chunk: nothing held back
    assert decoder.feed(pieces[-1]) == b"" and decoder.ended and not decoder.extra


@settings(max_examples=300, deadline=None)
@given(bodies, styles, st.lists(st.integers(min_value=0, max_value=2_000), max_size=20))
def test_any_cut_gives_the_same_body(chunks: list[bytes], how: list[str],
                                     cuts: list[int]) -> None:
    data = b"".join(framed(chunks, how))
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    pieces = [data[a:b] for a, b in itertools.pairwise(points) if b > a]
    out, decoder = decode(pieces)
    assert out == b"".join(chunks)
    assert decoder.ended and not decoder.extra


@pytest.mark.parametrize("piece", [
    b"5\r\nhelloXX",        # the chunk's data not followed by CRLF
    b"zz\r\nhello\r\n",     # a size that is not hex
    b"3\r\nhello\r\n",      # a size shorter than the data before the CRLF
])
def test_a_bad_single_chunk_is_refused_as_before(piece: bytes) -> None:
    with pytest.raises(ChunkedError):
        ChunkedDecoder().feed(piece)


def test_a_piece_of_two_chunks_or_a_partial_chunk_takes_the_general_walk() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"2\r\nab\r\n1\r\nc\r\n") == b"abc"
    assert decoder.feed(b"4\r\nde") == b"de"  # part of a chunk: the rest comes next
    assert decoder.feed(b"fg\r\n") == b"fg"
    assert decoder.feed(b"0\r\n\r\nextra") == b"" and decoder.ended and decoder.extra
