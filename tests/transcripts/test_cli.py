"""``tailfloor sessions`` and ``tailfloor inspect`` over the recorded transcripts."""

from __future__ import annotations

import io
import json
from pathlib import Path

from proxy.cli.main import build_parser, main
from tests.transcripts.conftest import OC9_MAIN, OC9_NEXT


def _run(argv: list[str]) -> tuple[int, str]:
    ns = build_parser().parse_args(argv)
    out = io.StringIO()
    code = ns.run(ns, out)
    return code, out.getvalue()


def test_sessions_lists_every_source(roots: dict[str, Path]) -> None:
    args = [a for r in roots.values() for a in ("--sessions", str(r))]
    code, text = _run(["sessions", *args])
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("agent\tkey\tsession")
    assert len(lines) == 1 + 6
    row = next(line for line in lines if line.split("\t")[2] == OC9_NEXT)
    assert row.split("\t")[3] == "openclaw-sqlite/openclaw-2026.9"
    assert row.endswith(f"{OC9_MAIN} (session_windows)")
    code, text = _run(["sessions", "--json", *args])
    data = json.loads(text)
    assert {d["source"] for d in data} == {"pi", "openclaw-jsonl", "openclaw-sqlite"}
    assert all(d["message_count_complete"] for d in data)


def test_inspect_shows_context_and_tail(roots: dict[str, Path]) -> None:
    code, text = _run(["inspect", OC9_MAIN[:8], "--sessions", str(roots["oc9"]),
                       "--tz", "UTC", "--last", "2", "--json"])
    assert code == 0
    data = json.loads(text)
    assert data["session"]["session_id"] == OC9_MAIN
    assert data["context"][-1]["role"] == "assistant"
    assert data["context"][-2]["content"].startswith("[Mon 2026-11-30 02:30 UTC] resetnow")
    assert [t["role"] for t in data["last"]] == ["user", "assistant"]
    code, text = _run(["inspect", "agent:main:main", "--sessions", str(roots["oc9"]),
                       "--tz", "UTC"])
    assert code == 0 and OC9_NEXT in text.splitlines()[0]
    assert "== context: 4 messages" in text


def test_inspect_unknown_and_ambiguous(roots: dict[str, Path]) -> None:
    code = main(["inspect", "nope", "--sessions", str(roots["oc9"])])
    assert code == 1
    # the key exists in two installations: refuse to pick one
    code = main(["inspect", "agent:main:main", "--sessions", str(roots["oc9"]),
                 "--sessions", str(roots["oc7"])])
    assert code == 1
