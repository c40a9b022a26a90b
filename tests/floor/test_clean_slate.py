"""A clean slate when the user asks for one: a new session whose first user message starts
with ``--clean`` gets no carry, on its first request and later ones, the marker is out of
what goes upstream and nothing else of the message changes; without the marker the same
request carries (the control). In-process, on the floor's own decisions; the oracle is the
test's transcript and request."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.floor.clean_slate import marked_clean, without_marker
from proxy.policy.pin_patterns import ENVELOPE
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import Holder, chat, request_for, rules
from tests.floor.test_floor_tenants import VICTIM, before_reset, reset_session

FIRST = "Start afresh: write the release notes."


def new_session(first: str, *later: str) -> dict[str, Any]:
    body = request_for(Catalog(), "none")
    body["messages"] = [body["messages"][0], {"role": "user", "content": first}]
    for text in later:
        body["messages"] += [{"role": "assistant", "content": "ok"},
                             {"role": "user", "content": text}]
    return body


@pytest.mark.parametrize("later", [(), ("and a second turn",)])
def test_the_marker_asks_for_nothing_and_leaves_the_message(later: tuple[str, ...]) -> None:
    catalog = reset_session()
    floor = FloorHarness(Holder(rules(n=8)), TokenCounter(), catalog, single_tenant=True)
    floor.decide(chat(before_reset(catalog)), {})  # the session's own prompt is recorded
    control = floor.decide(chat(new_session(FIRST, *later)), {"x-tailfloor-session": VICTIM})
    assert control.kind == "carry", control.verdict
    body = new_session("--clean " + FIRST, *later)
    decision = floor.decide(chat(body), {"x-tailfloor-session": VICTIM})
    assert decision.verdict == "none; reason=clean_slate", decision.verdict
    sent = orjson.loads(decision.body)["messages"]
    expected = [dict(m) for m in body["messages"]]
    expected[1]["content"] = FIRST
    assert sent == expected  # only the marker went; no carried message


def test_the_marker_behind_openclaw_s_timestamp_and_in_parts() -> None:
    stamp = "[Wed 2026-12-02 17:10 UTC] "
    assert marked_clean(stamp + "--clean hi", "--clean")
    assert not marked_clean("--cleanup the repo", "--clean")
    assert not marked_clean("please --clean", "--clean")
    assert without_marker({"role": "user", "content": stamp + "--clean hi"}, "--clean") == {
        "role": "user", "content": stamp + "hi"}
    parts = {"role": "user", "content": [{"type": "text", "text": "--clean\nhi"},
                                         {"type": "text", "text": "--clean stays"}]}
    assert without_marker(parts, "--clean")["content"] == [
        {"type": "text", "text": "hi"}, {"type": "text", "text": "--clean stays"}]


def _marked_by_regex(text: str, marker: str | None) -> bool:
    """marked_clean as it was before its substring test."""
    if not marker:
        return False
    body = ENVELOPE.sub("", text.lstrip(), count=1)
    return body == marker or body.startswith(marker + " ") or body.startswith(marker + "\n")


_PIECES = st.sampled_from(["--clean", "--clean ", "--cl", "ean", " ", "\n", "hi",
                           "[Wed 2026-12-02 17:10 UTC] ", "[Wed 2026-12-02 17:10 UTC]", "!"])


@given(st.lists(_PIECES, max_size=6).map("".join),
       st.sampled_from(["--clean", "", "[", " x", "--clean now"]) | st.none())
def test_the_substring_test_decides_as_the_regex_did(text: str, marker: str | None) -> None:
    assert marked_clean(text, marker) == _marked_by_regex(text, marker)


def test_an_empty_marker_turns_it_off_and_shadow_mode_sends_the_original() -> None:
    catalog = reset_session()
    off = FloorHarness(Holder(rules(n=8, clean_slate_marker=None)), TokenCounter(), catalog,
                       single_tenant=True)
    off.decide(chat(before_reset(catalog)), {})
    decision = off.decide(chat(new_session("--clean " + FIRST)), {"x-tailfloor-session": VICTIM})
    assert decision.kind == "carry"
    shadow = FloorHarness(Holder(rules(n=8, mode="shadow")), TokenCounter(), catalog,
                          single_tenant=True)
    raw = new_session("--clean " + FIRST)
    decision = shadow.decide(chat(raw), {"x-tailfloor-session": VICTIM})
    assert decision.body == orjson.dumps(raw)
