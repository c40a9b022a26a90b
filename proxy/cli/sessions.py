"""``tailfloor sessions`` and ``tailfloor inspect``: look at the transcripts tailfloor reads.

Both read the transcripts once (read-only) and exit; they need no running server.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any, TextIO
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from proxy.settings import DEFAULT_ADMIN_LISTEN
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.discovery import default_roots
from proxy.transcripts.records import SessionRecord
from proxy.transcripts.render import RenderOptions
from proxy.transcripts.service import ErrorLog
from proxy.transcripts.tracker import Tracker

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    sessions = subparsers.add_parser(
        "sessions", help="list the agent sessions found in the transcripts",
        description="List every session found under the transcript roots: agent, session "
                    "key, id, source/era, message count, last update, predecessor.")
    _common(sessions)
    sessions.set_defaults(run=run_sessions)
    inspect = subparsers.add_parser(
        "inspect", help="show what the model sees for a session now",
        description="Show a session's context view (the messages the agent itself would "
                    "send now, system prompt excluded) and its last N raw messages.")
    inspect.add_argument("session", metavar="SESSION",
                         help="session id (or a unique prefix of one) or OpenClaw session key")
    inspect.add_argument("--last", type=int, default=10, metavar="N",
                         help="raw messages to show at the end (default 10)")
    inspect.add_argument("--request", type=Path, default=None, metavar="FILE",
                         help="instead: show the rewrite this request (a chat body, or "
                              '{"path", "headers", "body"}) would get as a request of SESSION')
    inspect.add_argument("--rules", type=Path, default=None, metavar="DIR",
                         help="with --request: the rules directory (default: built-in rules)")
    inspect.add_argument("--last-request", action="store_true",
                         help="instead: the newest request a running tailfloor sent upstream "
                              "for SESSION (its inspector's facts, from the admin listener)")
    inspect.add_argument("--admin", default="http://" + DEFAULT_ADMIN_LISTEN, metavar="URL",
                         help="with --last-request: the admin listener (default "
                              f"http://{DEFAULT_ADMIN_LISTEN})")
    inspect.add_argument("--admin-token-file", type=Path, default=None, metavar="FILE",
                         help="with --last-request: the admin listener's token")
    _common(inspect)
    inspect.set_defaults(run=run_inspect)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", action="append", default=None, metavar="PATH",
                        help="transcript root; repeatable (default: the usual OpenClaw and "
                             "Pi locations)")
    parser.add_argument("--json", action="store_true", help="JSON output")
    parser.add_argument("--tz", default=None, metavar="ZONE",
                        help="timezone OpenClaw stamps user text in (default: this host's)")


def _load(ns: argparse.Namespace) -> tuple[Catalog, ErrorLog] | None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="tailfloor: %(message)s")
    roots = [Path(p).expanduser() for p in ns.sessions] if ns.sessions else default_roots(
        os.environ, Path.home())
    tz: tzinfo = datetime.now().astimezone().tzinfo or UTC
    if ns.tz:
        try:
            tz = ZoneInfo(ns.tz)
        except (ZoneInfoNotFoundError, ValueError):
            print(f"tailfloor: unknown timezone {ns.tz!r}", file=sys.stderr)
            return None
    catalog = Catalog(render_options=RenderOptions(tz=tz))
    errors = ErrorLog()
    Tracker(roots, catalog, errors, full=True).scan()
    return catalog, errors


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _line(r: SessionRecord) -> str:
    pred = f"{r.predecessor} ({r.link})" if r.predecessor else "-"
    return (f"{r.agent_id or '-'}\t{r.session_key or '-'}\t{r.session_id}\t"
            f"{r.source}/{r.info.era}{' ended' if r.info.ended else ''}\t"
            f"{r.message_count}\t{_when(r.updated)}\t{pred}")


def run_sessions(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    loaded = _load(ns)
    if loaded is None:
        return 2
    catalog, _errors = loaded
    records = catalog.sessions()
    if ns.json:
        json.dump([r.summary() for r in records], out, indent=2)
        out.write("\n")
        return 0
    out.write("agent\tkey\tsession\tsource/era\tmessages\tupdated\tpredecessor\n")
    for r in records:
        out.write(_line(r) + "\n")
    return 0


def _find(catalog: Catalog, wanted: str) -> SessionRecord | list[str]:
    exact = catalog.get(wanted) or catalog.by_key(wanted)
    if exact is not None:
        return exact
    hits = [r for r in catalog.sessions() if r.session_id.startswith(wanted)]
    if len(hits) == 1:
        return hits[0]
    return [r.session_id for r in hits] or [s for s in catalog.key_scopes(wanted)]


def _show(msg: dict[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, list):
        content = "\n".join(str(p.get("text", p.get("type"))) for p in content)
    text = str(content) if content is not None else ""
    calls = msg.get("tool_calls")
    if calls:
        text += "".join(f"\n-> {c['function']['name']}({c['function']['arguments']}) "
                        f"[{c['id']}]" for c in calls)
    if msg.get("tool_call_id"):
        text = f"[{msg['tool_call_id']}] {text}"
    return f"{msg.get('role')}: {text}"


def run_inspect(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if ns.last_request:
        from proxy.cli.last_request import run_last_request

        return run_last_request(ns.session, ns.admin, ns.admin_token_file, ns.json, out)
    loaded = _load(ns)
    if loaded is None:
        return 2
    catalog, _errors = loaded
    found = _find(catalog, ns.session)
    if not isinstance(found, SessionRecord):
        detail = f" (candidates: {', '.join(found)})" if found else ""
        print(f"tailfloor: no single session matches {ns.session!r}{detail}", file=sys.stderr)
        return 1
    if ns.request is not None:
        return _preview(ns, catalog, found, out)
    context = catalog.context(found.session_id) or []
    last = catalog.tail(found.session_id, max(ns.last, 0))
    if ns.json:
        json.dump({"session": found.summary(), "context": context,
                   "last": [{"entry_id": t.entry_id, "timestamp": t.timestamp, "role": t.role,
                             "messages": list(t.messages)} for t in last]}, out, indent=2)
        out.write("\n")
        return 0
    out.write(_line(found) + "\n")
    if found.compaction:
        out.write(f"last compaction {found.compaction.entry_id} at "
                  f"{_when(found.compaction.timestamp)}, first kept entry "
                  f"{found.compaction.first_kept_id}\n")
    for reset in found.resets:
        out.write(f"reset {reset.entry_id} at {_when(reset.timestamp)} ({reset.reason})\n")
    out.write(f"\n== context: {len(context)} messages the model sees now ==\n")
    for i, msg in enumerate(context, 1):
        out.write(f"[{i}] {_show(msg)}\n")
    out.write(f"\n== last {len(last)} raw messages ==\n")
    for t in last:
        shown = "; ".join(_show(m) for m in t.messages) or f"{t.role}: (not sent)"
        out.write(f"{_when(t.timestamp)} {t.entry_id} {shown}\n")
    return 0


def _preview(ns: argparse.Namespace, catalog: Catalog, found: SessionRecord,
             out: TextIO) -> int:
    from proxy.floor.preview import preview_request
    from proxy.policy.files import RulesHolder
    from proxy.policy.parse import RulesError
    from proxy.tokens import TokenCounter

    try:
        request = json.loads(Path(ns.request).read_text())
        rules = RulesHolder.open(ns.rules).rules
    except (OSError, ValueError) as exc:
        print(f"tailfloor: cannot read {ns.request}: {exc}", file=sys.stderr)
        return 2
    except RulesError as exc:
        print(f"tailfloor: {exc}", file=sys.stderr)
        return 2
    if not isinstance(request, dict):
        print(f"tailfloor: {ns.request} does not hold a JSON object", file=sys.stderr)
        return 2
    data, text = preview_request(catalog, rules, TokenCounter(), found.session_id, request)
    if ns.json:
        json.dump(data, out, indent=2)
        out.write("\n")
    else:
        out.write(text if text.endswith("\n") else text + "\n")
    return 0
