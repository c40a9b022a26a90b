"""The context view of Pi 1.x sessions that use what the format gained since 0.73, checked
against Pi's own next request.

Pi 1.6 writes ``usage`` entries (cache warming), ``context_edit`` entries (a failed attempt
omitted from the context), system-role messages and compactions with a ``systemMessage`` on
its own (the recorded captures replay those). Replacing edits and retain-none compactions come
from extensions, so the test writes them into a session Pi recorded, the way Pi's session
manager appends them, and lets Pi continue that session: the request Pi sends, minus its
system prompt and the new prompt, is the oracle for ``tailfloor inspect``'s context.
"""

from __future__ import annotations

import io
import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.cli.main import build_parser
from tests.agents.pi_agent import PI_LATEST, PiAgent, release
from tests.fake_behaviour import AgentBehaviour, is_summarization
from tests.fake_upstream import FakeUpstream

Entry = dict[str, Any]


class Session:
    """A Pi session file the test appends entries to, as Pi's session manager does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Entry] = [json.loads(x) for x in path.read_text().splitlines()]

    def find(self, role: str, text: str = "") -> Entry:
        return next(e for e in self.entries if e.get("type") == "message"
                    and e["message"]["role"] == role and text in json.dumps(e["message"]))

    def append(self, entry_type: str, **fields: Any) -> Entry:
        entry = {"type": entry_type, "id": secrets.token_hex(4), "parentId": self.entries[-1]["id"],
                 "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds")
                 .replace("+00:00", "Z"), **fields}
        self.entries.append(entry)
        with self.path.open("a") as out:
            out.write(json.dumps(entry) + "\n")
        return entry


def _edits(s: Session) -> None:
    tool = s.find("toolResult")
    first = s.find("user", "first turn")
    reply = s.find("assistant", "Fake reply")
    s.append("usage", kind="cache_warm", provider="fakeup", model="fake-model",
             usage={"input": 0, "output": 1, "cacheRead": 900, "cacheWrite": 0,
                    "totalTokens": 901, "cost": {"input": 0, "output": 0, "cacheRead": 0,
                                                 "cacheWrite": 0, "total": 0}})
    s.append("context_edit", targetId=tool["id"], replacement={"content": "first edit"})
    # The latest edit of a target wins; Pi stores string content of a tool result as a block.
    s.append("context_edit", targetId=tool["id"],
             replacement={"content": [{"type": "text", "text": "(output pruned)"}]})
    s.append("context_edit", targetId=first["id"],
             replacement={"content": "The first turn, as an extension rewrote it."})
    s.append("context_edit", targetId=reply["id"], replacement=None)


def _retain_none(s: Session) -> None:
    system = s.find("system")["message"]
    own = secrets.token_hex(4)
    entry = s.append("compaction", summary="Everything so far, summarised by an extension.",
                     firstKeptEntryId=own, tokensBefore=900, fromHook=True,
                     systemMessage={**system, "timestamp": 1796000000000})
    # The id is chosen first so the entry can name itself, as Pi's appendCompaction does.
    entry["id"] = own
    s.path.write_text("".join(json.dumps(e) + "\n" for e in s.entries))
    s.append("message", message={"role": "user", "content": [
        {"type": "text", "text": "A turn after the retain-none compaction."}],
        "timestamp": 1796000001000})
    s.append("message", message={
        "role": "assistant", "content": [{"type": "text", "text": "Noted."}],
        "api": "openai-completions", "provider": "fakeup", "model": "fake-model",
        "usage": {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 2,
                  "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0,
                           "total": 0}},
        "stopReason": "stop", "timestamp": 1796000002000})


def _kept_system(s: Session) -> None:
    """A compaction whose kept range holds a system message and an edited, an omitted and an
    older compaction's entries: Pi drops kept system messages for the checkpoint's."""
    tool = s.find("toolResult")
    call = s.find("assistant", "toolCall")
    system = s.find("system")["message"]
    s.append("compaction", summary="An older summary.", firstKeptEntryId=call["id"],
             tokensBefore=700)
    s.append("message", message={**system, "sections": {"extra": "<extra>more</extra>"}})
    s.append("context_edit", targetId=tool["id"], replacement={"content": "short output"})
    s.append("compaction", summary="The newest summary.", firstKeptEntryId=call["id"],
             tokensBefore=800, systemMessage=system)


VARIANTS = {"edits": _edits, "retain_none": _retain_none, "kept_system": _kept_system}
# What Pi's request shows of each variant (found in the request, not in our view): the
# entries really took effect.
SHOWN = {"edits": (["(output pruned)", "as an extension rewrote it"],
                   ["first edit", "Fake reply #1", "Hello, a first turn."]),
         "retain_none": (["summarised by an extension", "after the retain-none"],
                         ["Hello, a first turn.", "A third turn."]),
         "kept_system": (["The newest summary.", "short output"],
                         ["An older summary.", "Hello, a first turn.", "<extra>"])}


def _inspect(root: Path, session_id: str) -> list[dict[str, Any]]:
    ns = build_parser().parse_args(["inspect", session_id, "--sessions", str(root), "--json"])
    out = io.StringIO()
    assert ns.run(ns, out) == 0
    context: list[dict[str, Any]] = json.loads(out.getvalue())["context"]
    return context


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_inspect_context_is_pis_next_request(fake: FakeUpstream, tmp_path: Path,
                                             variant: str) -> None:
    fake.reset()
    fake.behaviour = AgentBehaviour()
    try:
        pi = PiAgent(tmp_path / "pi", fake.url + "/v1", pi=release(PI_LATEST))
        pi.turn("Hello, a first turn.")
        pi.turn("USE_TOOL:bash run a command")
        pi.turn("A third turn.")
        (path,) = pi.session_files()
        session = Session(path)
        VARIANTS[variant](session)
        ours = _inspect(pi.sessions, session.entries[0]["id"])
        before = len(fake.chat_requests())
        pi.turn("The prompt after the edits.")
        sent = [orjson.loads(r.body) for r in fake.chat_requests()[before:]]
        (request,) = [b for b in sent if not is_summarization(b["messages"])]
    finally:
        fake.behaviour = None
    theirs = request["messages"]
    assert theirs[0]["role"] in ("system", "developer")
    assert theirs[-1]["role"] == "user"
    assert ours == theirs[1:-1]
    wire = json.dumps(theirs[1:])
    present, absent = SHOWN[variant]
    assert all(text in wire for text in present)
    assert not any(text in wire for text in absent)
