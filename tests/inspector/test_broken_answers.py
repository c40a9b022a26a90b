"""A streamed answer that broke off, as the inspector shows it: the page says so in words, its
JSON twin and ``tailfloor inspect --last-request`` name how, and a whole answer says nothing.
The oracle is what the client itself read at the end of its stream."""

from __future__ import annotations

import orjson

from tests.conftest import settled_metrics
from tests.fake_upstream import FakeUpstream, Reply
from tests.inprocess import InProcessProxy
from tests.inspector.client import fetch, session_json, session_url
from tests.inspector.test_http import last_request
from tests.telemetry.test_otlp_broken_streams import streamed


def last_event(proxy: InProcessProxy, session: str) -> bytes:
    """A streamed chat request of ``session``, read to its end: its last event."""
    events = streamed(proxy, "/v1/chat/completions",
                      {"model": "fake-model", "stream": True,
                       "messages": [{"role": "user", "content": "hello"}]},
                      {"x-tailfloor-session": session})
    settled_metrics(proxy)  # the inspector has it once the request is recorded
    return events[-1]


def test_a_stream_the_upstream_broke_off_says_so_and_a_whole_one_does_not(
        clean_fake: FakeUpstream) -> None:
    proxy = InProcessProxy(clean_fake)
    try:
        clean_fake.script.append(Reply(close_after_chunks=2))
        ended = last_event(proxy, "s-broken")
        assert orjson.loads(ended[6:])["error"]["code"] == "upstream_mid_stream"
        assert last_event(proxy, "s-whole") == b"data: [DONE]"

        broken = session_json(proxy, "s-broken")["session"]["requests"][0]
        assert broken["status"] == 200 and broken["finish_reason"] is None
        assert [a["broke"] for a in broken["attempts"]] == ["mid_stream"]
        _, _, page = fetch(session_url(proxy, "s-broken"))
        assert b"<dt>answer broke off</dt><dd>the upstream broke off its stream; the client " \
               b"got an error event" in page
        assert b"<td>mid_stream</td>" in page
        # said in the request's one-line summary too, seen before it is unfolded
        summary = page.split(b"<summary>", 1)[1].split(b"</summary>", 1)[0]
        assert b'<span class="broke">answer broke off</span>' in summary
        status, shown = last_request("s-broken", "--admin", proxy.admin_url)
        assert status == 0 and "answer broke off: the upstream broke off its stream" in shown

        whole = session_json(proxy, "s-whole")["session"]["requests"][0]
        assert whole["finish_reason"] == "stop"
        assert [a["broke"] for a in whole["attempts"]] == [None]
        _, _, page = fetch(session_url(proxy, "s-whole"))
        assert b"answer broke off" not in page
        assert "answer broke off" not in last_request("s-whole", "--admin", proxy.admin_url)[1]
    finally:
        proxy.stop()
