"""The inspector over HTTP: where it answers, what it keeps out, its token, and provenance
checked against what the fake upstream received."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from proxy.cli.main import build_parser
from proxy.cli.sessions import run_inspect
from tests.fake_behaviour import SUMMARY_MARKER, AgentBehaviour
from tests.fake_upstream import FakeUpstream
from tests.floor.synthetic import system
from tests.floor.test_floor_e2e import setup as floor_setup
from tests.floor.test_floor_tenants import VICTIM, hello, rules_dir, send, victim_session
from tests.inprocess import InProcessProxy, inproc  # noqa: F401  (a fixture)
from tests.inspector.client import chat, fetch, message_hash, session_json, session_url
from tests.recovery.conversation import history
from tests.recovery.conversation import post as recovery_post
from tests.recovery.conversation import start as recovery_start

Make = Callable[..., InProcessProxy]
CANARY = "canary-7f3a91-never-shown"
TOOL_CANARY = "canary-args-55c1"



def last_request(*args: str) -> tuple[int, str]:
    """``tailfloor inspect ... --last-request``: its exit status and what it printed."""
    out = io.StringIO()
    status = run_inspect(build_parser().parse_args(["inspect", *args, "--last-request"]), out)
    return status, out.getvalue()


def hostile_conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": f"system {CANARY}"},
        {"role": "user", "content": [{"type": "text", "text": f"user {CANARY}"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "read_file", "arguments": f'{{"p": "{TOOL_CANARY}"}}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"tool {CANARY}"},
        {"role": "user", "content": f"<script>{CANARY}</script>"},
    ]


def test_the_proxy_port_never_serves_the_inspector(inproc: Make) -> None:  # noqa: F811
    proxy = inproc()
    chat(proxy, [{"role": "user", "content": "hello"}], session="s-port")
    for path in ("/tailfloor/ui", "/tailfloor/ui/sessions/s-port",
                 "/tailfloor/ui/static/inspector.js"):
        status, _, _ = fetch(proxy.url + path)
        assert status == 404, path
        status, headers, _ = fetch(proxy.admin_url + path)
        assert status == 200, path
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert headers["Referrer-Policy"] == "no-referrer"


def test_without_content_no_message_text_is_shown(inproc: Make) -> None:  # noqa: F811
    proxy = inproc()
    chat(proxy, hostile_conversation(), session="s-quiet")
    status, _, page = fetch(session_url(proxy, "s-quiet"))
    assert status == 200
    _, _, listing = fetch(proxy.admin_url + "/tailfloor/ui")
    _, _, listing_json = fetch(proxy.admin_url + "/tailfloor/ui?format=json")
    twin = session_json(proxy, "s-quiet")
    for shown in (page, listing, listing_json, orjson.dumps(twin)):
        assert CANARY.encode() not in shown and TOOL_CANARY.encode() not in shown
    assert b"--inspect-content" in page
    messages = twin["session"]["requests"][0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[2]["tools"] == ["read_file"] and b"read_file" in page
    assert all("text" not in m and len(m["hash"]) == 10 for m in messages)
    assert twin["content"] is False


def test_with_content_text_is_shown_escaped(inproc: Make) -> None:  # noqa: F811
    proxy = inproc("--inspect-content")
    chat(proxy, hostile_conversation(), session="s-loud")
    _, _, page = fetch(session_url(proxy, "s-loud"))
    assert f"&lt;script&gt;{CANARY}&lt;/script&gt;".encode() in page
    assert f"<script>{CANARY}".encode() not in page
    assert TOOL_CANARY.encode() in page
    twin = session_json(proxy, "s-loud")
    assert twin["session"]["requests"][0]["messages"][4]["text"] == f"<script>{CANARY}</script>"
    # the Accept header asks for the same twin
    _, headers, body = fetch(session_url(proxy, "s-loud"), {"Accept": "application/json"})
    assert headers["Content-Type"].startswith("application/json")
    assert orjson.loads(body)["session"]["id"] == "s-loud"


def test_an_unknown_session_is_a_404_page(inproc: Make) -> None:  # noqa: F811
    proxy = inproc()
    status, headers, page = fetch(session_url(proxy, "<nope>"))
    assert status == 404 and headers["Content-Type"].startswith("text/html")
    assert b"&lt;nope&gt;" in page and b"<nope>" not in page
    status, _, body = fetch(session_url(proxy, "nope") + "?format=json")
    assert status == 404 and orjson.loads(body)["error"] == "no such session"


def test_zero_requests_turns_the_inspector_off(inproc: Make) -> None:  # noqa: F811
    proxy = inproc("--inspect-requests", "0")
    assert proxy.state.inspector is None
    assert fetch(proxy.admin_url + "/tailfloor/ui")[0] == 404


def test_the_token_guards_every_admin_route_but_the_probes(inproc: Make,  # noqa: F811
                                                          tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token-0123\n")
    proxy = inproc(env={"TAILFLOOR_ADMIN_TOKEN_FILE": str(token_file)})
    ui = proxy.admin_url + "/tailfloor/ui"
    assert fetch(proxy.admin_url + "/healthz")[0] == 200
    assert fetch(proxy.admin_url + "/readyz")[0] == 200
    for path in ("/tailfloor/ui", "/metrics", "/tailfloor/sessions",
                 "/tailfloor/ui/static/inspector.js"):
        assert fetch(proxy.admin_url + path)[0] == 401, path
    assert fetch(ui, {"Authorization": "Bearer wrong"})[0] == 401
    assert fetch(ui + "?token=wrong")[0] == 401
    assert fetch(ui, {"Authorization": "Bearer first-token-0123"})[0] == 200
    # a ?token= visit sets the cookie and sends the browser on without the token
    status, headers, _ = fetch(ui + "?q=main&token=first-token-0123")
    assert status == 303 and headers["Location"] == "/tailfloor/ui?q=main"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "first-token-0123" not in cookie
    value = cookie.split(";", 1)[0]
    assert fetch(ui, {"Cookie": value})[0] == 200
    assert fetch(ui, {"Cookie": "tailfloor_admin=forged"})[0] == 401
    # a rotated token: the old one and its cookie stop working
    token_file.write_text("second-token-4567\n")
    os.utime(token_file, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert fetch(ui, {"Authorization": "Bearer first-token-0123"})[0] == 401
    assert fetch(ui, {"Cookie": value})[0] == 401
    assert fetch(ui, {"Authorization": "Bearer second-token-4567"})[0] == 200
    chat(proxy, [{"role": "user", "content": "hello"}], session="s-token")
    assert last_request("s-token", "--admin", proxy.admin_url)[0] == 1
    status, shown = last_request("s-token", "--admin", proxy.admin_url,
                                 "--admin-token-file", str(token_file))
    assert status == 0 and "[0] user agent" in shown
    assert last_request("s-none", "--admin", proxy.admin_url,
                        "--admin-token-file", str(token_file))[0] == 1


def _hashes(messages: list[dict[str, Any]]) -> list[str]:
    return [message_hash(m) for m in messages]


def test_restored_messages_are_marked_as_the_upstream_received_them(
        fake: FakeUpstream, tmp_path: Path) -> None:
    fake.reset()
    fake.behaviour = AgentBehaviour()
    sessions, rules, body = floor_setup(tmp_path, "enforce")
    proxy = InProcessProxy(fake, "--sessions", str(sessions), "--rules", str(rules))
    try:
        verdict = chat(proxy, body["messages"], **{k: v for k, v in body.items()
                                                   if k not in ("messages", "stream", "model")})
        restored = int(verdict.split("restored=", 1)[1].split(";")[0].split()[0])
        assert restored > 0
        sent = orjson.loads(fake.chat_requests()[-1].body)["messages"]
        listing = orjson.loads(fetch(proxy.admin_url + "/tailfloor/ui?format=json")[2])
        (row,) = listing["sessions"]
        assert row["floors"] == 1
        newest = session_json(proxy, row["id"])["session"]["requests"][0]
        marks = [m["provenance"] for m in newest["messages"]]
        assert [m["hash"] for m in newest["messages"]] == _hashes(sent)
        own = body["messages"]
        assert marks.count("restored") == restored == newest["floor"]["restored"]
        for message, mark in zip(sent, marks, strict=True):
            if mark != "summary":  # the floor adds a line to the agent's summary
                assert (message in own) == (mark == "agent"), (mark, message)
        summary = marks.index("summary")
        assert "keep going" in orjson.dumps(sent[summary]).decode()
        assert newest["messages"][summary]["author"] == "agent"
        assert marks[summary + 1:summary + 1 + restored] == ["restored"] * restored
        by = newest["tokens"]["by_provenance"]
        assert by["restored"] > 0 and by["agent"] > 0
    finally:
        fake.behaviour = None
        proxy.stop()


def test_a_recovered_overflow_shows_two_attempts_and_tailfloors_summary(
        clean_fake: FakeUpstream, tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=9000)
    messages = [*history("a", 8, 700), {"role": "user", "content": "what now?"}]
    proxy = recovery_start(clean_fake, tmp_path)
    try:
        status, _, headers = recovery_post(proxy, {
            "model": "fake-model", "messages": messages, "max_completion_tokens": 256,
            "user": "u"})
        assert status == 200 and headers["x-tailfloor"] == "compacted:overflow"
        listing = orjson.loads(fetch(proxy.admin_url + "/tailfloor/ui?format=json")[2])
        (row,) = listing["sessions"]
        assert row["compactions"] == 1 and row["overflows"] == 1
        newest = session_json(proxy, row["id"])["session"]["requests"][0]
        assert len(newest["attempts"]) == 2
        assert newest["attempts"][0]["status"] == 400 and newest["attempts"][1]["status"] == 200
        retry = orjson.loads(clean_fake.chat_requests()[-1].body)["messages"]
        assert [m["hash"] for m in newest["messages"]] == _hashes(retry)
        summaries = [m for m in newest["messages"] if m["provenance"] == "summary"]
        assert len(summaries) == 1 and summaries[0]["author"] == "tailfloor"
        assert SUMMARY_MARKER in orjson.dumps(retry[summaries[0]["index"]]).decode()
        assert summaries[0]["replaced"] == newest["recovery"]["replaced"] > 0
        _, _, page = fetch(session_url(proxy, row["id"]))
        assert b"Summary by tailfloor, standing for" in page
    finally:
        proxy.stop()


def test_messages_the_previous_request_sent_are_folded_as_unchanged(
        inproc: Make) -> None:  # noqa: F811
    proxy = inproc("--inspect-content")
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"},
             {"role": "assistant", "content": "1"}, {"role": "user", "content": "two"}]
    chat(proxy, first, session="s-runs")
    chat(proxy, [*first, {"role": "assistant", "content": "2"},
                 {"role": "user", "content": "three"}], session="s-runs")
    newest, older = session_json(proxy, "s-runs")["session"]["requests"]
    assert [m["unchanged"] for m in newest["messages"]] == [True] * 4 + [False] * 2
    assert not any(m["unchanged"] for m in older["messages"])
    _, _, page = fetch(session_url(proxy, "s-runs"))
    text = page.decode()
    run = text.split("<details class=\"unchanged\">", 1)[1].split("</details>", 1)[0]
    assert "4 unchanged" in run
    assert run.count("data-provenance=\"agent\" data-role=") == 4


def test_carried_messages_name_the_session_they_came_from(clean_fake: FakeUpstream,
                                                         tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    victim = victim_session(root)
    proxy = InProcessProxy(clean_fake, "--sessions", str(root), "--rules",
                           str(rules_dir(tmp_path)))
    try:
        send(proxy, victim)
        raw, verdict = send(proxy, hello(system()))
        assert verdict.startswith("carry; carried="), verdict
        carried = int(verdict.split("carried=", 1)[1].split(";")[0].split()[0])
        sent = orjson.loads(clean_fake.chat_requests()[-1].body)["messages"]
        own = orjson.loads(raw)["messages"]
        settled = orjson.loads(fetch(proxy.admin_url + "/tailfloor/ui?format=json")[2])
        rows = {r["id"]: r for r in settled["sessions"]}
        new = next(r for sid, r in rows.items() if sid != VICTIM)
        assert new["carries"] == 1 and rows[VICTIM]["carries"] == 0
        newest = session_json(proxy, new["id"])["session"]["requests"][0]
        assert [m["hash"] for m in newest["messages"]] == _hashes(sent)
        marks = [m["provenance"] for m in newest["messages"]]
        assert marks.count("carried") == carried == newest["floor"]["carried"]
        assert newest["floor"]["carried_from"] == VICTIM
        for message, fact in zip(sent, newest["messages"], strict=True):
            assert (message in own) == (fact["provenance"] == "agent"), fact
            if fact["provenance"] == "carried":
                assert fact["session"] == VICTIM
        _, _, page = fetch(session_url(proxy, new["id"]))
        assert page.count(f"from session <code>{VICTIM}</code>".encode()) == carried
        # the same facts in the terminal
        status, shown = last_request(new["id"], "--admin", proxy.admin_url)
        assert status == 0 and f"x-tailfloor: {verdict}" in shown
        assert sum(line.startswith("[") and f"carried from {VICTIM}," in line
                   for line in shown.splitlines()) == carried
        assert "--inspect-content" in shown
    finally:
        proxy.stop()


def test_large_requests_through_the_proxy_stay_within_the_budget(inproc: Make  # noqa: F811
                                                                ) -> None:
    budget = 4 * 1024 * 1024
    proxy = inproc("--inspect-memory-bytes", str(budget))
    big = "B" * (256 * 1024)
    for n in range(40):
        chat(proxy, [{"role": "user", "content": f"{n} {big}"}], session=f"s-big-{n}")
    store = proxy.state.inspector
    assert store is not None
    assert store.held <= budget
    kept = [s.session_id for s in store.sessions()]
    assert 0 < len(kept) < 40 and kept[0] == "s-big-39"
    # each kept request is counted at least as the client's body, parsed and sent
    assert all(e.bytes >= 3 * len(big) for s in store.sessions() for e in s.requests)
