"""Once a request is over, the inspector lets go of it: within a moment its kept form holds
no trail (so none of the request's headers, its credential included) and, without
``--inspect-content``, no message text, only roles, sizes, tool names and hashes; the pages
still show those."""

from __future__ import annotations

import time
from collections.abc import Callable

from proxy.inspector.digest import MessageDigest
from proxy.server.inspector_sink import SETTLE_AFTER
from tests.inprocess import InProcessProxy, inproc  # noqa: F401  (a fixture)
from tests.inspector.client import chat, session_json
from tests.inspector.test_http import CANARY, hostile_conversation

Make = Callable[..., InProcessProxy]
KEY_CANARY = "sk-settle-canary-0099"


def kept(proxy: InProcessProxy) -> list[object]:
    store = proxy.state.inspector
    assert store is not None
    return [entry.report for record in store.sessions() for entry in record.requests]


def wait_settled(proxy: InProcessProxy) -> list[object]:
    deadline = time.monotonic() + 20 * SETTLE_AFTER + 5
    while True:
        reports = kept(proxy)
        if reports and all(r._trail is None for r in reports):  # type: ignore[attr-defined]
            return reports
        assert time.monotonic() < deadline, "kept requests were never settled"
        time.sleep(0.05)


def test_without_content_nothing_of_the_text_or_the_key_stays(inproc: Make) -> None:  # noqa: F811
    proxy = inproc()
    for turn in range(3):
        chat(proxy, hostile_conversation(), session=f"s-settle-{turn}",
             headers={"Authorization": f"Bearer {KEY_CANARY}"})
    for report in wait_settled(proxy):
        made = report()  # type: ignore[operator]
        assert made.body is None
        assert made.messages and all(isinstance(m, MessageDigest) for m in made.messages)
        assert CANARY not in repr(made) and KEY_CANARY not in repr(made)
        assert [m.role for m in made.messages] == ["system", "user", "assistant", "tool",
                                                   "user"]
        assert made.messages[2].tools == ("read_file",)
    page = session_json(proxy, "s-settle-1")["session"]
    messages = page["requests"][0]["messages"]
    assert [m["role"] for m in messages][:2] == ["system", "user"]
    assert all("text" not in m and len(m["hash"]) == 10 for m in messages)


def test_with_content_the_text_stays_but_not_the_trail(inproc: Make) -> None:  # noqa: F811
    proxy = inproc("--inspect-content")
    chat(proxy, hostile_conversation(), session="s-content",
         headers={"Authorization": f"Bearer {KEY_CANARY}"})
    [report] = wait_settled(proxy)
    made = report()  # type: ignore[operator]
    assert made.body is None and KEY_CANARY not in repr(made)
    assert CANARY in repr(made.messages)
    page = session_json(proxy, "s-content")["session"]
    assert any(CANARY in m.get("text", "") for m in page["requests"][0]["messages"])
