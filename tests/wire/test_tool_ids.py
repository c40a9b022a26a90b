"""Every wire form of a tool-call id maps to the one key (the property the floor's anchor,
the content index and the compaction fingerprints all rely on)."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from proxy.floor.restore import wire_key
from proxy.recovery.message_chain import message_fingerprint
from proxy.transcripts.entries import tool_call_key
from proxy.wire.tool_ids import call_id_key, openclaw_form, pi_form, wire_forms

ID_CHARS = st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:+")


def _agrees(call_id: str) -> bool:
    """The documented domain: at most 40 characters before "|", or at least 32 letters and
    digits among the first 40; and no "|" unless that part alone has 32 of them."""
    part = call_id.split("|", 1)[0]
    alnum_head = sum(c.isalnum() for c in part[:40])
    if "|" in call_id and sum(c.isalnum() for c in part) < 32:
        return False
    return len(part) <= 40 or alnum_head >= 32


@given(st.text(ID_CHARS, min_size=1, max_size=64),
       st.one_of(st.none(), st.text(ID_CHARS, min_size=1, max_size=20)))
def test_every_form_has_the_same_key(head: str, tail: str | None) -> None:
    call_id = head if tail is None else f"{head}|{tail}"
    assume(any(c.isalnum() for c in head))
    assume(_agrees(call_id))
    key = call_id_key(call_id)
    for form in wire_forms(call_id):
        assert call_id_key(form) == key, form
        assert tool_call_key(form) == tool_call_key(call_id)
    calls = [{"id": f, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
             for f in wire_forms(call_id)]
    prints = {message_fingerprint({"role": "assistant", "content": None, "tool_calls": [c]})
              for c in calls}
    assert len(prints) == 1
    keys = {wire_key({"role": "tool", "tool_call_id": f, "content": "x"})
            for f in wire_forms(call_id)}
    assert len(keys) == 1


def test_the_forms_of_real_ids() -> None:
    long_id = "call_" + "a1b2" * 10  # 45 characters: Pi cuts it to 40, OpenClaw drops "_"
    forms = wire_forms(long_id)
    assert pi_form(long_id) == long_id[:40] and openclaw_form(long_id) == long_id.replace("_", "")
    assert {call_id_key(f) for f in forms} == {call_id_key(long_id)}
    responses = "call_0efe83d3d93349ad|fc_68f0e5b0c2d48190a1b2c3d4e5f60718"
    assert pi_form(responses) == "call_0efe83d3d93349ad"
    assert call_id_key(responses) == "call0efe83d3d93349ad"
