"""A request whose floor holds skips the pin index only when its lineage pins nothing: a pin
the user types after the session's pins were read, a pin the lineage inherits, and a pin a
request shows before its transcript does are each in the request once a compaction takes
them, while the floor still holds.

The oracle is the text the floor's decision sends, compared with what the user wrote.
"""

from __future__ import annotations

from proxy.transcripts.catalog import Catalog
from tests.floor.synthetic import Transcript, chat, conversation, put, request_for
from tests.pins.test_pin_edits import pins_sent
from tests.pins.test_pins import PIN, floor_of, pinned_session


def _summarized(t: Transcript) -> None:
    """The agent compacts, keeping enough raw messages that the floor (6) holds."""
    t.compaction("## Goal\nedit the docs", t.message_ids()[-12])
    t.user("after compaction")


def test_a_pin_typed_after_the_pins_were_read_is_kept() -> None:
    catalog = Catalog()
    t = Transcript("bbbb2222-late")
    t.user("hello")
    t.assistant("hi")
    conversation(t, 10)
    put(catalog, t)
    floor = floor_of(catalog)
    first = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(first.body) == [], first.verdict  # read: nothing pinned yet
    t.user(PIN)
    put(catalog, t)
    typed = floor.decide(chat(request_for(catalog, t.session_id)), {})  # the turn's request
    assert "pinned" not in typed.verdict, typed.verdict  # raw in it: nothing added
    t.assistant("understood")
    conversation(t, 10)
    _summarized(t)
    put(catalog, t)
    decision = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(decision.body) == [PIN], decision.verdict


def test_an_inherited_pin_stays_on_every_request_of_the_next_session() -> None:
    catalog = Catalog()
    old = pinned_session("bbbb2222-old3")
    put(catalog, old)
    new = Transcript("bbbb2222-new3")
    new.clock = old.clock + 100
    new.user("start over")
    new.assistant("ok")
    conversation(new, 12)
    put(catalog, new, created=new.clock)
    floor = floor_of(catalog)
    sent = []
    for turn in range(4):
        decision = floor.decide(chat(request_for(catalog, new.session_id)), {})
        sent.append(pins_sent(decision.body))
        new.user(f"one more thing {turn}")
        new.assistant("sure")
        put(catalog, new, created=new.clock)
    assert sent[1:] == [[PIN]] * 3, sent  # the first may be told apart by its identification


def test_a_pin_the_request_shows_before_its_transcript_is_kept() -> None:
    """The agent's request holds the new pin raw before the watcher has read it: the
    session's requests keep reading the index until the transcript holds it."""
    catalog = Catalog()
    t = Transcript("bbbb2222-lag1")
    t.user("hello")
    t.assistant("hi")
    conversation(t, 10)
    put(catalog, t)
    floor = floor_of(catalog)
    floor.decide(chat(request_for(catalog, t.session_id)), {})
    ahead = request_for(catalog, t.session_id, extra=[{"role": "user", "content": PIN}])
    floor.decide(chat(ahead), {})  # the catalog does not hold the pin yet
    t.user(PIN)
    t.assistant("understood")
    conversation(t, 10)
    put(catalog, t)
    floor.decide(chat(request_for(catalog, t.session_id)), {})  # no user text after the reply
    _summarized(t)
    put(catalog, t)
    decision = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(decision.body) == [PIN], decision.verdict


def test_a_point_back_pin_typed_after_the_pins_were_read_is_kept() -> None:
    catalog = Catalog()
    t = Transcript("bbbb2222-late2")
    t.user("hello")
    t.assistant("hi")
    conversation(t, 10)
    t.user("What is the plan?")
    t.assistant("Plan: docs first, then the tag.")
    put(catalog, t)
    floor = floor_of(catalog, pin_assistant=True)
    assert pins_sent(floor.decide(chat(request_for(catalog, t.session_id)), {}).body) == []
    t.user("!pin ^")
    put(catalog, t)
    floor.decide(chat(request_for(catalog, t.session_id)), {})  # the turn's request
    t.assistant("pinned")
    conversation(t, 10)
    _summarized(t)
    put(catalog, t)
    decision = floor.decide(chat(request_for(catalog, t.session_id)), {})
    assert pins_sent(decision.body) == ["Plan: docs first, then the tag."], decision.verdict
