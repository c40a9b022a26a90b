"""The trace of a floor restore on a live Pi session, as a real OTLP/HTTP receiver gets it.

Pi compacts, then asks a question; tailfloor restores raw messages under Pi's summary. The
oracles are the test's own: the trace is the one the fake upstream was told in its
``traceparent`` (the attempt span is the upstream's parent), the restored count is recounted
from Pi's transcript (the raw messages before Pi's ``firstKeptEntryId`` that the upstream
received), the token counts are what the fake upstream answered, and neither Pi's key nor its
words appear in any byte the receiver got. In Pi's default configuration it names no
session (no ``gen_ai.conversation.id``); with its affinity headers the id is its session's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agents.live_proxy import watched_proxy
from tests.agents.pi_agent import PI_LATEST, PI_VERSION
from tests.agents.pi_rpc import PiRpc
from tests.agents.sizing import PiPrompts
from tests.agents.snippets import provider_shown, url_at
from tests.agents.test_pi_live_floor import (
    AFTER,
    RULES,
    TEXT_TURNS,
    compacting_pi,
    entry_raw,
    pi_request_raw,
    session_id_of,
    transcript_raw,
)
from tests.evidence import Evidence
from tests.fake_behaviour import AgentBehaviour, is_summarization, size_usage
from tests.fake_upstream import FakeUpstream
from tests.otlp_receiver import OtlpReceiver, attributes

SERVER, CLIENT = 2, 3  # the protobuf's SpanKind values
PI_KEY = "sk-fake-local"  # the key the Pi provider of these tests sends


@pytest.fixture
def traced(fake: FakeUpstream) -> Iterator[tuple[FakeUpstream, OtlpReceiver]]:
    """The fake upstream and a receiver the proxy will export to."""
    found = OtlpReceiver()
    yield fake, found
    found.stop()


def pi_kept_from(path: Path) -> int:
    """How many raw messages of the transcript come before Pi's last ``firstKeptEntryId``
    (what Pi's summary replaced), counted the way ``transcript_raw`` counts them."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    compaction = [e for e in entries if e.get("type") == "compaction"][-1]
    first = [e.get("id") for e in entries].index(compaction["firstKeptEntryId"])
    return sum(1 for e in entries[:first] if entry_raw(e) is not None)


def restored_by_count(body: dict[str, Any], transcript: Path) -> int:
    """The request's raw messages (after system prompt and summary) that Pi had summarized
    away: their place in the transcript is before Pi's first kept entry."""
    theirs = transcript_raw(transcript)
    ours = pi_request_raw(body["messages"][2:])
    upto = max(i for i, m in enumerate(theirs) if m == ours[-1]) + 1
    assert ours == theirs[upto - len(ours):upto], "the request is not the transcript's tail"
    return max(0, pi_kept_from(transcript) - (upto - len(ours)))


@pytest.mark.parametrize("case", [(PI_VERSION, False), (PI_LATEST, True)],
                         ids=["pi-default", "pi-latest-affinity"])
def test_a_floor_restore_on_a_live_pi_session_is_on_its_trace(
        traced: tuple[FakeUpstream, OtlpReceiver], tmp_path: Path, case: tuple[str, bool],
        pi_prompt: PiPrompts, evidence: Evidence) -> None:
    fake, receiver = traced
    version, affinity = case
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "200",
           "OTEL_METRIC_EXPORT_INTERVAL": "300"}
    rules = tmp_path / "rules"
    proxy, root = watched_proxy(fake, tmp_path, RULES.format(n=8), evidence, env=env)
    evidence.add("otlp-spans.txt", lambda: "\n".join(str(s) for s in receiver.spans()))
    fake.reset()
    fake.behaviour = AgentBehaviour()
    # the README's URL (its agent prefix names the agent on the spans), at this proxy
    pi = compacting_pi(tmp_path / "pi", root / "run",
                       url_at(provider_shown("pi-models.json")["baseUrl"], proxy.url), version,
                       pi_prompt, affinity=affinity)
    rpc = PiRpc(pi)
    try:
        assert any(rpc.prompt(message) for message in TEXT_TURNS), "Pi never compacted"
        rpc.prompt(AFTER)
    finally:
        rpc.close()
        fake.behaviour = None
    try:
        received = fake.chat_requests()
        after = next(r for r in received if AFTER in json.dumps(orjson.loads(r.body)
                                                                ["messages"][-1])
                     and not is_summarization(orjson.loads(r.body)["messages"]))
        body = orjson.loads(after.body)
        transcript = pi.session_files()[-1]
        restored = restored_by_count(body, transcript)
        assert restored > 0, "the floor restored nothing: nothing for the trace to show"

        _, trace_id, parent, _ = after.headers["traceparent"].split("-")
        attempt = receiver.wait(lambda: next((s for s in receiver.spans()
                                              if s.span_id.hex() == parent), None))
        server = receiver.wait(lambda: next((s for s in receiver.spans()
                                             if s.span_id == attempt.parent_span_id), None))
        spans = [s for s in receiver.spans() if s.trace_id.hex() == trace_id]
        assert attempt.kind == CLIENT and server.kind == SERVER
        assert {s.trace_id.hex() for s in spans} == {trace_id}
        assert len(spans) == 2, [s.name for s in spans]  # no retry, no summarizer call

        on_server = attributes(server.attributes)
        assert on_server["tailfloor.floor.kind"] == "floor", on_server
        assert on_server["tailfloor.floor.restored"] == restored
        assert on_server["tailfloor.agent"] == "pi"
        assert on_server["http.response.status_code"] == 200

        on_attempt = attributes(attempt.attributes)
        assert attempt.name == "chat fake-model"
        # The fake answers a usage sized from the body it received.
        assert on_attempt["gen_ai.usage.input_tokens"] == size_usage(body, "")["prompt_tokens"]
        assert on_attempt["gen_ai.request.stream"] is bool(body.get("stream"))
        assert "gen_ai.conversation.compacted" not in on_attempt  # Pi compacted, not us
        if affinity:
            assert on_server["gen_ai.conversation.id"] == session_id_of(transcript)
            assert on_attempt["gen_ai.conversation.id"] == session_id_of(transcript)
        else:
            assert "gen_ai.conversation.id" not in on_server
            assert "gen_ai.conversation.id" not in on_attempt

        sent = b"".join(receiver.raw)
        assert PI_KEY.encode() not in sent
        assert AFTER.encode() not in sent and TEXT_TURNS[0].encode() not in sent
        assert str(rules).encode() not in sent
    finally:
        proxy.stop()
