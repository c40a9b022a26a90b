"""``tailfloor inspect SESSION --request FILE``: what the floor would do to a request."""

from __future__ import annotations

import json

import orjson

from proxy.floor.preview import preview_request
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from tests.floor.synthetic import Transcript, conversation, put, request_for, rules


def test_preview_shows_the_restored_messages() -> None:
    catalog = Catalog()
    t = Transcript("prev-0001")
    conversation(t, 12)
    t.compaction("## Goal\nsummary", t.message_ids()[-4])
    t.user("now")
    put(catalog, t)
    body = request_for(catalog, t.session_id)
    # A recorded request (path, headers, body) of an agent that sends no identity.
    recorded = {"path": "/v1/chat/completions", "headers": {"User-Agent": "x"}, "body": body}
    data, text = preview_request(catalog, rules(n=10), TokenCounter(), t.session_id, recorded)
    assert data["kind"] == "floor" and data["identification"] == "header"
    assert data["verdict"] == f"floor; restored={data['added_messages']}"
    origins = [row["origin"] for row in data["messages"]]
    assert origins.count("added") >= data["added_messages"] >= 10 - 4
    assert origins[1] == "note"  # the summary with its added sentence
    assert origins[-1] == "request"
    json.dumps(data)  # JSON-ready
    assert text.splitlines()[0] == f"session {t.session_id}: {data['verdict']}"
    assert sum(1 for line in text.splitlines() if line.startswith("+")) == origins.count("added")
    # A plain chat body works too; an unknown session leaves the request alone.
    plain, _ = preview_request(catalog, rules(n=10), TokenCounter(), "missing", body)
    assert plain["kind"] == "none"
    assert plain["bytes"]["rewritten"] == len(orjson.dumps(body))
