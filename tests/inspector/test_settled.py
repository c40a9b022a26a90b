"""What the inspector keeps of a finished request holds none of the request's headers: the
credential a client sent is not reachable from the inspector's store at all (walked object
by object), and without ``--inspect-content`` no message text reaches a page or its JSON."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

from tests.inprocess import InProcessProxy, inproc  # noqa: F401  (a fixture)
from tests.inspector.client import chat, session_json
from tests.inspector.test_http import CANARY, hostile_conversation

Make = Callable[..., InProcessProxy]
KEY_CANARY = "sk-kept-canary-0099"


def reachable(root: object, limit: int = 2_000_000) -> Iterator[object]:
    """Every object reachable from ``root`` by references (breadth first, each once)."""
    seen = {id(root)}
    frontier = [root]
    while frontier and len(seen) < limit:
        nxt = []
        for obj in frontier:
            yield obj
            for child in gc.get_referents(obj):
                if id(child) not in seen and not isinstance(child, type):
                    seen.add(id(child))
                    nxt.append(child)
        frontier = nxt


def test_no_header_of_a_request_is_reachable_from_the_inspector(inproc: Make) -> None:  # noqa: F811
    proxy = inproc()
    for turn in range(3):
        chat(proxy, hostile_conversation(), session=f"s-kept-{turn}",
             headers={"Authorization": f"Bearer {KEY_CANARY}", "x-api-key": KEY_CANARY})
    store = proxy.state.inspector
    assert store is not None and sum(len(r.requests) for r in store.sessions()) == 3
    found_text = False
    for obj in reachable(store):
        if isinstance(obj, str):
            assert KEY_CANARY not in obj, "a credential is reachable from the inspector"
            found_text = found_text or CANARY in obj
        elif isinstance(obj, bytes):
            assert KEY_CANARY.encode() not in obj
        else:
            assert type(obj).__name__ not in ("CIMultiDict", "CIMultiDictProxy",
                                              "RawRequestMessage"), type(obj)
    assert found_text  # the walk did reach the kept messages (referenced, never shown)
    page = session_json(proxy, "s-kept-1")["session"]
    assert CANARY not in str(page)
    messages = page["requests"][0]["messages"]
    assert [m["role"] for m in messages][:2] == ["system", "user"]
    assert all("text" not in m and len(m["hash"]) == 10 for m in messages)
