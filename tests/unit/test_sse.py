"""The stream scanner: usage from SSE split anywhere, hidden usage, event boundaries."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.server.sse import StreamScanner, read_body_usage
from proxy.wire.stream_usage import with_stream_usage
from proxy.wire.usage import Usage, UsageAdjustment
from tests.fake_upstream import Reply, _sse_chunks

USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
         "prompt_tokens_details": {"cached_tokens": 40},
         "completion_tokens_details": {"reasoning_tokens": 5}}


def stream_bytes(include_usage: bool = True) -> bytes:
    return b"".join(_sse_chunks("m", Reply(usage=USAGE, text="hello world"), include_usage))


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_usage_is_found_wherever_the_chunks_split(cuts: list[int]) -> None:
    data = stream_bytes()
    scanner = StreamScanner()
    relayed = b"".join(scanner.feed(chunk) for chunk in split_at(data, cuts))
    assert relayed == data
    assert scanner.usage == Usage(100, 20, 120, 40, 5)
    assert scanner.usage.input_tokens == 60
    assert scanner.saw_done


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_hidden_usage_mode_gives_the_stream_the_client_asked_for(cuts: list[int]) -> None:
    scanner = StreamScanner(hide_usage=True)
    relayed = b"".join(scanner.feed(chunk) for chunk in split_at(stream_bytes(), cuts))
    relayed += scanner.flush()
    assert relayed == stream_bytes(include_usage=False)
    assert scanner.usage is not None and scanner.usage.prompt_tokens == 100
    assert scanner.events == stream_bytes().count(b"\n\n")  # each event seen once, whole


def test_hidden_usage_mode_with_one_byte_pieces() -> None:
    scanner = StreamScanner(hide_usage=True)
    data = stream_bytes()
    relayed = b"".join(scanner.feed(data[i:i + 1]) for i in range(len(data)))
    assert relayed + scanner.flush() == stream_bytes(include_usage=False)
    assert scanner.events == data.count(b"\n\n")


def test_missing_usage_leaves_none() -> None:
    scanner = StreamScanner()
    scanner.feed(stream_bytes(include_usage=False))
    assert scanner.usage is None and scanner.saw_done


def test_event_boundary_tracking() -> None:
    scanner = StreamScanner()
    assert scanner.at_event_boundary
    scanner.feed(b'data: {"choices":[]}')
    assert not scanner.at_event_boundary
    scanner.feed(b"\n")
    assert not scanner.at_event_boundary
    scanner.feed(b"\n")
    assert scanner.at_event_boundary


def test_error_event_is_noticed() -> None:
    scanner = StreamScanner()
    scanner.feed(b'data: {"error":{"message":"boom","code":"x"}}\n\n')
    assert scanner.error == {"message": "boom", "code": "x"}


def test_usage_from_body() -> None:
    body = orjson.dumps({"usage": USAGE})
    assert read_body_usage(body) == (Usage(100, 20, 120, 40, 5), body, None)
    assert read_body_usage(b'{"choices":[]}') == (None, b'{"choices":[]}', None)
    assert read_body_usage(b"not json") == (None, b"not json", None)
    stopped = b'{"choices":[{"finish_reason":"length"}]}'
    assert read_body_usage(stopped) == (None, stopped, "length")


def test_adjusted_usage_in_body_and_stream() -> None:
    adjust = UsageAdjustment(added=30, removed=0, window=75)
    usage, body, _ = read_body_usage(orjson.dumps({"id": "x", "usage": USAGE}), adjust)
    assert usage == Usage(100, 20, 120, 40, 5)  # metrics keep the real figures
    assert orjson.loads(body)["usage"]["prompt_tokens"] == 70
    assert orjson.loads(body)["usage"]["total_tokens"] == 90
    capped = UsageAdjustment(added=0, removed=500, window=128).apply(USAGE)
    assert capped["prompt_tokens"] == 127 and capped["total_tokens"] == 147
    scanner = StreamScanner(adjust=UsageAdjustment(added=90))
    out = scanner.feed(stream_bytes()) + scanner.flush()
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    assert events[-1]["usage"]["prompt_tokens"] == 10
    assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 10
    assert scanner.usage is not None and scanner.usage.prompt_tokens == 100


def test_with_stream_usage_appends_without_reserialising() -> None:
    raw = b'{"model": "m", "stream": true}  \n'
    out = with_stream_usage(raw, orjson.loads(raw))
    assert out == b'{"model": "m", "stream": true,"stream_options":{"include_usage":true}}'
    assert with_stream_usage(b"{}", {}) == b'{"stream_options":{"include_usage":true}}'
    raw = b'{"stream":true,"stream_options":{"continuous_usage_stats":true}}'
    merged = orjson.loads(with_stream_usage(raw, orjson.loads(raw)))
    assert merged["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


def test_with_stream_usage_keeps_what_tailfloor_rewrote() -> None:
    """The body going out may be a rewrite of the client's (a lowered output limit, a
    compaction): only its stream_options member changes, never back to the client's body."""
    client = {"model": "m", "stream": True, "max_tokens": 9000,
              "stream_options": {"include_usage": False},
              "messages": [{"role": "user", "content": "a long history"}]}
    rewritten = (b'{"model": "m", "stream": true, "max_tokens": 100, '
                 b'"stream_options": {"include_usage": false}, '
                 b'"messages": [{"role": "user", "content": "the summary"}]}')
    out = with_stream_usage(rewritten, client)
    assert out == rewritten.replace(b'{"include_usage": false}', b'{"include_usage":true}')


def test_hidden_usage_mode_still_reads_what_it_does_not_parse() -> None:
    # Events without a usage object, an error or a finish reason pass unparsed: the end
    # marker and the last event's facts are still read, every usage:null still cut.
    scanner = StreamScanner(hide_usage=True)
    out = b"".join(scanner.feed(c) for c in split_at(stream_bytes(), [7, 50, 51, 300]))
    out += scanner.flush()
    assert scanner.saw_done and scanner.finish_reason == "stop"
    assert scanner.usage == Usage.from_dict(USAGE)
    assert b'"usage":null' not in out and out.endswith(b"data: [DONE]\n\n")


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30), st.booleans())
def test_facts_and_event_boundary_wherever_the_chunks_split(cuts: list[int],
                                                             adjusted: bool) -> None:
    """After every piece, ``at_event_boundary`` says whether the bytes fed so far end between
    two events (worked out here from those bytes: no part of an event relayed, or held back
    in whole-event mode), and the stream's facts are the ones it holds, in either mode the
    relay runs the scanner in."""
    data = stream_bytes()
    scanner = StreamScanner(adjust=UsageAdjustment(added=1) if adjusted else None)
    relayed = fed = b""
    for piece in split_at(data, cuts):
        relayed += scanner.feed(piece)
        fed += piece
        assert scanner.at_event_boundary == (not fed or fed.endswith(b"\n\n"))
    relayed += scanner.flush()
    assert scanner.saw_done and scanner.finish_reason == "stop" and scanner.model == "m"
    assert scanner.usage == Usage(100, 20, 120, 40, 5)
    if not adjusted:
        assert relayed == data


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_whole_event_mode_finds_crlf_and_lf_event_ends_wherever_the_chunks_split(
        cuts: list[int]) -> None:
    """Events ended by CRLF CRLF (allowed by SSE) are still whole events when the relay
    works on events: every event seen once, the usage-only one hidden, facts read."""
    lf = stream_bytes()
    crlf = lf.replace(b"\n", b"\r\n")
    for data in (lf, crlf):
        scanner = StreamScanner(hide_usage=True)
        relayed = b"".join(scanner.feed(piece) for piece in split_at(data, cuts))
        relayed += scanner.flush()
        assert scanner.events == lf.count(b"\n\n")
        assert scanner.saw_done and scanner.usage == Usage(100, 20, 120, 40, 5)
        assert relayed.replace(b"\r\n", b"\n") == stream_bytes(include_usage=False)
