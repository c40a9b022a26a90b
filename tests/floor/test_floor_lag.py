"""Identification when the transcript lags the request by its newest messages.

An agent writes the new user message a few milliseconds before it sends, and the watcher
sees it after the answer: the request's latest user text is then in no transcript yet. The
messages before it are, so they tie the request to its session. Texts are guessable, so they
are weak evidence: they decide only inside a certain tenant, never across tenants, and two
sessions that say the same things stay ambiguous. The oracle is what the decision adds.
"""

from __future__ import annotations

from proxy.floor.decision import Decision
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import Holder, Transcript, chat, put, rules, system

OLD = "01a22a55-0000-7000-8000-0000000000aa"
NEW = "01a22a55-0000-7000-8000-0000000000ab"
OTHER = "01a22a66-0000-7000-8000-0000000000bb"


def stage(catalog: Catalog, *, single_tenant: bool = True) -> FloorHarness:
    return FloorHarness(Holder(rules(n=6)), TokenCounter(), catalog,
                        single_tenant=single_tenant)


def sessions(first_words: str = "hello there") -> tuple[Catalog, Transcript]:
    """An old session, then a new one in the same directory with one exchange so far."""
    catalog = Catalog()
    old = Transcript(OLD)
    for i in range(8):
        old.user(f"old secret {i}")
        old.assistant(f"old answer {i}")
    put(catalog, old)
    new = Transcript(NEW, clock=old.clock + 60)
    new.user(first_words)
    new.assistant("Hello! What shall we work on today in this project?")
    put(catalog, new)
    return catalog, new


def second_request(words: str = "hello there") -> dict[str, object]:
    """The new session's second request; its last user message is not written yet."""
    return {"model": "fake-model", "messages": [
        system(), {"role": "user", "content": [{"type": "text", "text": words}]},
        {"role": "assistant", "content": "Hello! What shall we work on today in this project?"},
        {"role": "user", "content": [{"type": "text", "text": "the turn not written yet"}]}]}


def carried(decision: Decision) -> bool:
    return any("old secret" in str(m.get("content")) for m in decision.added)


def old_session_seen(rewriter: FloorHarness, catalog: Catalog) -> None:
    """The old session's own request went through: its fingerprint is known."""
    old_view = {"model": "fake-model", "messages": [
        system(), *(catalog.context(OLD) or []),
        {"role": "user", "content": [{"type": "text", "text": "one more"}]}]}
    rewriter.decide(chat(old_view), {})


def test_the_messages_before_the_newest_identify_the_session() -> None:
    catalog, _new = sessions()
    rewriter = stage(catalog)
    old_session_seen(rewriter, catalog)
    decision = rewriter.decide(chat(second_request()), {})
    assert decision.kind == "carry" and carried(decision)
    assert (decision.session_id, decision.method) == (NEW, "content")


def test_texts_decide_nothing_across_tenants() -> None:
    catalog, _new = sessions()
    decision = stage(catalog, single_tenant=False).decide(chat(second_request()), {})
    assert decision.kind == "none" and not carried(decision)
    assert decision.method == "untrusted"


def test_two_sessions_saying_the_same_things_stay_ambiguous() -> None:
    catalog, _new = sessions()
    twin = Transcript(OTHER, clock=2_000_000_000.0)
    twin.user("hello there")
    twin.assistant("Hello! What shall we work on today in this project?")
    put(catalog, twin, group="dir-b")
    decision = stage(catalog).decide(chat(second_request()), {})
    assert decision.kind == "none" and not carried(decision)
    assert decision.method == "ambiguous"


def test_a_tool_call_id_outranks_any_number_of_matching_texts() -> None:
    catalog = Catalog()
    mine = Transcript(OLD)
    mine.user("run it")
    _entry, (call,) = mine.tool_calls(["bash"])
    mine.tool_result(call, "done")
    put(catalog, mine)
    echo = Transcript(OTHER)
    for text in ("a", "b", "c"):
        echo.user(f"common {text}")
        echo.assistant(f"common reply {text}")
    put(catalog, echo, group="dir-b")
    body = {"model": "fake-model", "messages": [
        system(),
        *({"role": role, "content": f"common {t}" if role == "user" else f"common reply {t}"}
          for t in ("a", "b", "c") for role in ("user", "assistant")),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call, "content": "done"},
        {"role": "user", "content": "next"}]}
    decision = stage(catalog).decide(chat(body), {})
    assert decision.session_id == OLD and decision.method == "tool_call"
