"""Which chunks the stream scanner reads: the learnt-start search gives the plain regex's
verdict on every chunk (the regexes the scanner used before, kept here as the oracle)."""

from __future__ import annotations

import itertools
import re
from unittest.mock import patch

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.server import sse_interest
from proxy.server.sse import _DIALECT_INTERESTING as DIALECT_PATTERN
from proxy.server.sse import _INTERESTING as PATTERN
from proxy.server.sse import _NEEDLES, StreamScanner
from proxy.server.sse_interest import InterestTest, common_prefix_length
from proxy.wire.anthropic import MESSAGES
from proxy.wire.dialect import Dialect
from proxy.wire.responses import RESPONSES
from proxy.wire.usage import UsageAdjustment
from tests import fake_dialects
from tests.fake_upstream import Reply, _sse_chunks

ORACLE = re.compile(rb'"usage"\s*:\s*\{|"error"\s*:|"finish_reason"\s*:\s*"')
DIALECT_ORACLE = re.compile(
    rb'"usage"\s*:\s*\{|"error"\s*:|"stop_reason"\s*:\s*"|"type"\s*:\s*"error"')
# The dialects' events begin with a needle (``"type"``): the scanner does not use the learnt
# start there, but the search must be right for any pattern and needles.
DIALECT_NEEDLES = (b'"usage"', b'"error"', b'"stop_reason"', b'"type"')
SPACE = [b"", b" ", b"\t", b"\n", b"\r", b"\f", b"\v", b"  "]  # what \s takes in bytes
KEYS = [b"usage", b"error", b"finish_reason", b"stop_reason", b"type", b"id", b"delta",
        b"content", b"choices", b"us", b"finish_reason_x"]
VALUES = [b"null", b'"stop"', b"{}", b'{"prompt_tokens":1}', b'"error"', b"0", b"[]",
          b'"usage"', b'{"type":"error"}']


def real_streams() -> list[list[bytes]]:
    """Events as the fake upstreams write them: chat (with and without usage, a tool call,
    an error finish) and the Responses and Anthropic dialects (with a stream error)."""
    streams = [_sse_chunks("m", Reply(text="hello world, this is text " * 4, pieces=12), True),
               _sse_chunks("m", Reply(text="x" * 40, pieces=8), False),
               _sse_chunks("m", Reply(tool_call={"id": "call_1", "name": "read",
                                                 "arguments": '{"path":"a"}'}), True),
               _sse_chunks("m", Reply(finish="length", pieces=5), True)]
    payload = {"model": "m", "input": "hi", "messages": [{"role": "user", "content": "hi"}]}
    for dialect in (fake_dialects.RESPONSES, fake_dialects.MESSAGES):
        for reply in (Reply(pieces=6), Reply(pieces=4, stream_error={"message": "boom"}),
                      Reply(pieces=3, reasoning="think")):
            streams.append(fake_dialects.events(dialect, payload, reply, "id1"))
    return streams


def respaced(event: bytes, space: bytes, before: bytes) -> bytes:
    """An event with JSON whitespace around its colons (``": "`` as Python writes it, or
    odder) and a CRLF variant of its line ends."""
    spaced = event.replace(b'":', b'"' + before + b":" + space)
    return spaced.replace(b"\n", b"\r\n") if before == b"\r" else spaced


def verdicts(test: InterestTest, oracle: re.Pattern[bytes], chunks: list[bytes]) -> None:
    for chunk in chunks:
        assert test.test(chunk) == (oracle.search(chunk) is not None), chunk


def test_real_streams_and_their_whitespace_variants() -> None:
    for stream, space, before in itertools.product(real_streams(), SPACE, SPACE[:3]):
        chunks = [respaced(event, space, before) for event in stream]
        verdicts(InterestTest(PATTERN, _NEEDLES), ORACLE, chunks)
        verdicts(InterestTest(DIALECT_PATTERN, DIALECT_NEEDLES), DIALECT_ORACLE, chunks)


def test_the_start_of_chat_chunks_is_learnt_and_skipped() -> None:
    """Not a verdict (those are the oracle's): the point of the module, that the search
    starts past the repeated start once two chunks were seen."""
    chunks = _sse_chunks("m", Reply(text="abcdefgh" * 8, pieces=8), True)
    test = InterestTest(PATTERN, _NEEDLES)
    for chunk in chunks[:3]:
        test.test(chunk)
    assert test._size > 0 and chunks[2].startswith(test._start)
    assert chunks[2][test._skip:].startswith(b'"content"')


@st.composite
def json_objects(draw: st.DrawFn) -> bytes:
    pairs = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(SPACE),
                                    st.sampled_from(SPACE), st.sampled_from(VALUES)),
                          min_size=1, max_size=6))
    return b"{" + b",".join(b'"' + key + b'"' + before + b":" + after + value
                            for key, before, after, value in pairs) + b"}"


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    """Chunks that share a start (as a stream's do) and differ after it; the shared part may
    end inside a needle (``"fin``), which some later chunks complete, with any whitespace,
    so a needle can straddle whatever start is learnt."""
    common = b"data: " + draw(json_objects())
    common = common[:draw(st.integers(0, len(common)))]
    needle = draw(st.sampled_from([b'"usage"', b'"error"', b'"finish_reason"',
                                   b'"stop_reason"', b'"type"']))
    cut = draw(st.integers(0, len(needle) - 1))
    common += needle[:cut]
    rests = [needle[cut:] + space + b":" + value for space, value in
             draw(st.lists(st.tuples(st.sampled_from(SPACE), st.sampled_from(VALUES)),
                           max_size=3))]
    tails = draw(st.lists(st.one_of(json_objects(), st.sampled_from(rests or [b"x"])),
                          min_size=1, max_size=8))
    ends = [b"\n\n", b"\r\n\r\n", b"\n"]
    return [common + tail + ends[i % 3] for i, tail in enumerate(tails)]


@settings(max_examples=400, deadline=None)
@given(streams())
def test_generated_chunks_get_the_regex_verdict(chunks: list[bytes]) -> None:
    # Also with any learnt start used, however few quotes it skips.
    for fewest in (sse_interest.MIN_QUOTES, 0):
        with patch.object(sse_interest, "MIN_QUOTES", fewest):
            verdicts(InterestTest(PATTERN, _NEEDLES), ORACLE, chunks)
            verdicts(InterestTest(DIALECT_PATTERN, DIALECT_NEEDLES), DIALECT_ORACLE, chunks)


def test_a_needle_that_straddles_the_learnt_start_is_found() -> None:
    """The start two chunks share may end inside a needle (``"us`` of ``"usage"``, the
    quote of ``"error"``): the search must begin at that needle, not at the start's end."""
    head = b'data: {"a":"1","b":"2","c":"3","d":"4","e":"5",'
    for first, second, later in ((b'"us1":0}', b'"us2":0}', b'"usage":{"prompt_tokens":1}}'),
                                 (b'"x":0}', b'"y":0}', b'"error":{"message":"m"}}'),
                                 (b'"finish_reasoX":0}', b'"finish_reasoY":0}',
                                  b'"finish_reason":"stop"}')):
        test = InterestTest(PATTERN, _NEEDLES)
        test.test(head + first + b"\n\n")
        test.test(head + second + b"\n\n")
        assert test._size > 0 and (head + later).startswith(test._start)
        assert test.test(head + later + b"\n\n")


def test_common_prefix_length() -> None:
    for a, b in itertools.product([b"", b"a", b"ab", b"abc", b"abd", b"b"], repeat=2):
        expected = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                        min(len(a), len(b)))
        assert common_prefix_length(a, b) == expected


def finish_reason(body: bytes) -> str | None:
    found = None
    for line in body.splitlines():
        if line.startswith(b"data: {"):
            choices = orjson.loads(line[6:]).get("choices")
            if choices and choices[0].get("finish_reason") is not None:
                found = choices[0]["finish_reason"]
    return found


def oracle_scanner(**kwargs: object) -> StreamScanner:
    scanner = StreamScanner(**kwargs)  # type: ignore[arg-type]
    pattern = ORACLE if scanner.dialect is None else DIALECT_ORACLE
    scanner._interesting = lambda data: pattern.search(data) is not None
    return scanner


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=100_000), max_size=40),
       st.sampled_from(SPACE), st.sampled_from(SPACE[:3]), st.integers(0, 3))
def test_scanner_reads_what_it_read_before_wherever_the_chunks_split(
        cuts: list[int], space: bytes, before: bytes, mode: int) -> None:
    """The scanner as the relay runs it, fed the streams cut anywhere (so needles split
    across reads): facts and bytes out equal those of the scanner with the plain regex."""
    adjust = UsageAdjustment(added=5)
    for stream in real_streams():
        body = b"".join(respaced(event, space, before) for event in stream)
        dialect: Dialect | None = None
        if b"event: " in body:
            dialect = RESPONSES if b"response." in body else MESSAGES
        kwargs = [{}, {"hide_usage": True}, {"adjust": adjust},
                  {"hide_usage": True, "adjust": adjust}][mode]
        new, old = StreamScanner(**kwargs, dialect=dialect), oracle_scanner(**kwargs,
                                                                            dialect=dialect)
        out_new = b"".join([*map(new.feed, split_at(body, cuts)), new.flush()])
        out_old = b"".join([*map(old.feed, split_at(body, cuts)), old.flush()])
        assert out_new == out_old
        assert (new.usage, new.error, new.finish_reason, new.model, new.saw_done) == (
            old.usage, old.error, old.finish_reason, old.model, old.saw_done)
        # Not a vacuous agreement: the finish reason the events name (when the whitespace
        # is JSON's and no line end, which breaks the event into lines neither can read).
        if dialect is None and {space, before} <= {b"", b" ", b"\t", b"  "}:
            assert new.finish_reason == finish_reason(b"".join(stream))
