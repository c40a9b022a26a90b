"""``tailfloor inspect SESSION --last-request``: the newest request a running tailfloor sent
upstream for a session, as its inspector keeps it, in the terminal.

It asks the admin listener for the session page's JSON twin (the same facts as the page).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from proxy.inspector.facts import broke_text, floor_text, recovery_text

__all__ = ["run_last_request"]

TEXT_SHOWN = 300  # characters of a message's text in the terminal


def run_last_request(session: str, admin: str, token_file: Path | None, as_json: bool,
                     out: TextIO) -> int:
    url = f"{admin.rstrip('/')}/tailfloor/ui/sessions/{quote(session, safe='')}?format=json"
    headers = {"Accept": "application/json"}
    if token_file is not None:
        try:
            headers["Authorization"] = "Bearer " + token_file.read_text().strip()
        except OSError as exc:
            print(f"tailfloor: cannot read {token_file}: {exc.strerror}", file=sys.stderr)
            return 2
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=30) as response:
            facts = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        reason = {404: "this tailfloor keeps no request of that session",
                  401: "the admin listener asks for its token (--admin-token-file)"}.get(
            exc.code, f"HTTP {exc.code}")
        print(f"tailfloor: {reason} ({admin})", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"tailfloor: cannot ask {admin}: {exc}", file=sys.stderr)
        return 2
    requests = facts["session"]["requests"]
    if not requests:
        print("tailfloor: no request kept for that session", file=sys.stderr)
        return 1
    newest = requests[0]
    if as_json:
        json.dump(newest, out, indent=2)
        out.write("\n")
        return 0
    _show(newest, facts, out)
    return 0


def _show(r: dict[str, Any], facts: dict[str, Any], out: TextIO) -> None:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["at"]))
    out.write(f"request {r['request_id']} at {when} UTC on replica {facts['replica']}\n")
    out.write(f"{r['route']} {r['model']}: {r['status']}, x-tailfloor: {r['verdict']}\n")
    out.write(f"session {r['session_id'] or r['named_session'] or '-'} "
              f"(identified by {r['method'] or '-'})\n")
    out.write(f"floor: {floor_text(r['floor'])}\n")
    recovery = recovery_text(r["recovery"])
    if recovery:
        out.write(f"recovery: {recovery}\n")
    for a in r["attempts"]:
        first = "" if a["first_chunk"] is None else f", first chunk {a['first_chunk']:.3f} s"
        out.write(f"attempt {a['number']}: {a['status'] or a['error']} in "
                  f"{a['latency']:.3f} s{first}\n")
    broke = broke_text(r["attempts"], r.get("stream", True))
    if broke:
        out.write(f"answer broke off: {broke}\n")
    tokens = r["tokens"]
    parts = ", ".join(f"{k} {v}" for k, v in tokens["by_provenance"].items() if v)
    out.write(f"about {tokens['estimated']} tokens of window {r['window'] or '?'}: {parts}\n")
    out.write(f"\n== {len(r['messages'])} messages as sent ==\n")
    for m in r["messages"]:
        line = f"[{m['index']}] {m['role']} {m['provenance']}"
        if m.get("session"):
            line += f" from {m['session']}"
        if m["provenance"] == "summary":
            line += f" by {m.get('author')} for {m.get('replaced')} messages"
        line += f", {m['bytes']} bytes, {m['hash']}"
        if m["tools"]:
            line += f", tools {', '.join(m['tools'])}"
        out.write(line + "\n")
        text = m.get("text")
        if text:
            flat = " ".join(text.split())
            out.write("    " + (flat if len(flat) <= TEXT_SHOWN
                                else flat[:TEXT_SHOWN] + "...") + "\n")
    if not facts["content"]:
        out.write("\n(message text is shown only when tailfloor runs with --inspect-content)\n")
