"""The inspector's HTML, rendered on the server from the facts (``proxy.inspector.facts``).

Everything in a request is hostile: every string goes through ``_e`` (html.escape, quotes
too) and nothing from a request ever reaches a URL but a session id, percent-encoded. The
pages work without JavaScript (folding is ``<details>``); the script and the style sheet
are files on the admin listener, so the pages' Content-Security-Policy forbids anything
inline. Pure: no I/O.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote

from proxy.inspector.facts import (
    CLEAN_SLATE_TEXT,
    PROVENANCES,
    broke_text,
    floor_text,
    recovery_text,
)

__all__ = ["UI", "not_found_page", "session_page", "sessions_page"]

UI = "/tailfloor/ui"
LONG_CHARS = 2000  # a message longer than this is folded behind its first PREVIEW_CHARS
PREVIEW_CHARS = 400
MIN_UNCHANGED_RUN = 2
_BROKE_MARK = " <span class=\"broke\">answer broke off</span>"
_CONTENT_OFF = ("Message text is not kept. Start tailfloor with <code>--inspect-content</code> "
                "(or <code>TAILFLOOR_INSPECT_CONTENT=true</code>) to see it; until then "
                "each message shows its role, where it came from, its size, tool names and "
                "a short hash.")


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _path(session_id: str) -> str:
    """A session id as a URL path segment (whatever it holds)."""
    return quote(session_id.encode("utf-8", "replace"), safe="")


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + " UTC"


def _page(title: str, replica: str, body: str) -> str:
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{_e(title)} · tailfloor</title>"
        f"<link rel=\"stylesheet\" href=\"{UI}/static/inspector.css\">"
        f"<script src=\"{UI}/static/inspector.js\" defer></script></head><body>"
        f"<header><a href=\"{UI}\">tailfloor inspector</a>"
        f"<span class=\"replica\" data-replica=\"{_e(replica)}\">replica {_e(replica)}</span>"
        f"</header><main>{body}</main></body></html>")


def sessions_page(facts: dict[str, Any]) -> str:
    rows = []
    for s in facts["sessions"]:
        search = " ".join(_e(v) for v in (s["id"], s["agent"], s["source"])).lower()
        rows.append(
            f"<tr data-session=\"{_e(s['id'])}\" data-search=\"{search}\">"
            f"<td>{_e(s['agent'] or '-')}</td><td>{_e(s['source'] or '-')}</td>"
            f"<td class=\"id\"><a href=\"{UI}/sessions/{_path(s['id'])}\">"
            f"{_e(s['id'])}</a></td><td>{_when(s['last_request'])}</td>"
            f"<td>{s['requests_kept']}</td><td>{s['floors']}</td><td>{_carries(s)}</td>"
            f"<td>{s['compactions']}</td><td>{s['overflows']}</td></tr>")
    table = ("<p class=\"empty\">No request kept yet.</p>" if not rows else
             "<div class=\"scroll\"><table id=\"sessions\"><thead><tr><th>agent</th>"
             "<th>source</th><th>session</th><th>last request</th><th>kept</th>"
             "<th>floors</th><th>carries</th><th>compactions</th><th>overflows</th></tr>"
             f"</thead><tbody>{''.join(rows)}</tbody></table></div>")
    body = (f"<h1>Sessions</h1>{_notice(facts)}"
            "<form class=\"filter\" method=\"get\" action=\"\"><label>filter "
            "<input type=\"search\" id=\"filter\" name=\"q\" autocomplete=\"off\" "
            "placeholder=\"agent, source or session id\"></label></form>"
            f"{table}<p class=\"note\">Most recently active first; up to "
            f"{facts['per_session']} requests kept per session on this replica.</p>")
    return _page("sessions", facts["replica"], body)


def _carries(s: dict[str, Any]) -> str:
    if s["clean_slate"]:
        return (f"{s['carries']} <span class=\"clean-slate\" title=\"{CLEAN_SLATE_TEXT}\">"
                "clean slate</span>")
    return str(s["carries"])


def _notice(facts: dict[str, Any]) -> str:
    return "" if facts["content"] else f"<p class=\"notice\">{_CONTENT_OFF}</p>"


def not_found_page(replica: str, session_id: str) -> str:
    body = (f"<h1>No such session</h1><p>This replica keeps no request of session "
            f"<code>{_e(session_id)}</code>. Requests of a session are kept by the replica "
            "that sent them, and only the last few of the most recently active sessions.</p>"
            f"<p><a href=\"{UI}\">All sessions</a></p>")
    return _page("not found", replica, body)


def session_page(facts: dict[str, Any]) -> str:
    s = facts["session"]
    head = (f"<h1>Session <code class=\"id\">{_e(s['id'])}</code></h1>{_notice(facts)}"
            f"<p class=\"meta\">agent {_e(s['agent'] or '-')} · identified by "
            f"{_e(s['source'] or '-')} · {s['requests_kept']} of {s['requests_seen']} requests "
            f"kept · {s['floors']} floors · {s['carries']} carries · {s['compactions']} "
            f"compactions · {s['overflows']} overflows</p>"
            + (f"<p class=\"clean-slate\">Clean slate: {CLEAN_SLATE_TEXT}.</p>"
               if s["clean_slate"] else "")
            + "<p class=\"legend\">" + "".join(
                f"<span class=\"key\" data-provenance=\"{p}\">{p}</span>"
                for p in PROVENANCES) + "</p>")
    requests = "".join(_request(r, open_=i == 0) for i, r in enumerate(s["requests"]))
    return _page(f"session {s['id']}", facts["replica"], head + requests)


def _request(r: dict[str, Any], open_: bool) -> str:
    floor, recovery = r["floor"], r["recovery"]
    summary = (f"<summary><span class=\"when\">{_when(r['at'])}</span> "
               f"<span class=\"status\">{r['status']}</span> {_e(r['route'])} "
               f"{_e(r['model'])} <span class=\"verdict\">{_e(r['verdict'])}</span>"
               f"{_BROKE_MARK if r['attempts'] and r['attempts'][-1]['broke'] else ''}"
               "</summary>")
    facts = [
        ("request", r["request_id"]), ("route", r["route"]),
        ("stream", "yes" if r["stream"] else "no"), ("session identified by", r["method"]),
        ("session the agent named", r["named_session"]),
        ("floor", floor_text(floor)), ("recovery", recovery_text(recovery)),
        ("window", r["window"]), ("estimated tokens", r["tokens"]["estimated"]),
        ("usage the upstream reported", _usage_line(r["usage"])),
        ("finish", r["finish_reason"]),
        ("answer broke off", broke_text(r["attempts"], r["stream"])),
        ("time", f"{r['seconds']:.3f} s, {r['proxy_seconds'] * 1000:.1f} ms of it tailfloor's"),
    ]
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts if v not in (None, ""))
    return (f"<details class=\"request\" data-request=\"{_e(r['request_id'])}\""
            f"{' open' if open_ else ''}>{summary}{_bar(r)}<dl>{dl}</dl>"
            f"{_attempts(r['attempts'])}<h3>Messages as sent ({len(r['messages'])})</h3>"
            "<button type=\"button\" class=\"unfold-all\" hidden>unfold all</button>"
            f"<ol class=\"messages\">{''.join(_messages(r['messages']))}</ol></details>")


def _usage_line(usage: dict[str, Any] | None) -> str | None:
    if usage is None:
        return None
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in usage.items() if v is not None)


def _bar(r: dict[str, Any]) -> str:
    """Tokens by provenance against the window: SVG shapes, since the policy allows no
    inline style."""
    tokens = r["tokens"]["by_provenance"]
    total = r["tokens"]["estimated"]
    scale = max(r["window"] or 0, total, 1)
    x, rects, legend = 0.0, [], []
    for provenance in PROVENANCES:
        n = tokens[provenance]
        if not n:
            continue
        width = 1000 * n / scale
        rects.append(f"<rect class=\"p-{provenance}\" x=\"{x:.2f}\" y=\"0\" "
                     f"width=\"{width:.2f}\" height=\"12\"><title>{provenance}: {n} tokens"
                     "</title></rect>")
        legend.append(f"<span class=\"key\" data-provenance=\"{provenance}\">{provenance} "
                      f"{n}</span>")
        x += width
    against = f"of a {r['window']}-token window" if r["window"] else "(window unknown)"
    return (f"<figure class=\"bar\">{_svg(rects, 'tokens by provenance against the window')}"
            f"{_svg(_shares(tokens, total), 'the request by provenance')}"
            f"<figcaption>about {total} tokens {against}: {' '.join(legend)}</figcaption>"
            "</figure>")


def _shares(tokens: dict[str, int], total: int) -> list[str]:
    """The request itself, each provenance's share of it (the window's bar can be a sliver)."""
    x, rects = 0.0, []
    for provenance in PROVENANCES:
        if tokens[provenance]:
            width = 1000 * tokens[provenance] / max(total, 1)
            rects.append(f"<rect class=\"p-{provenance}\" x=\"{x:.2f}\" y=\"0\" "
                         f"width=\"{width:.2f}\" height=\"12\"></rect>")
            x += width
    return rects


def _svg(rects: list[str], label: str) -> str:
    return (f"<svg viewBox=\"0 0 1000 12\" preserveAspectRatio=\"none\" role=\"img\" "
            f"aria-label=\"{label}\">{''.join(rects)}</svg>")


def _attempts(attempts: Sequence[dict[str, Any]]) -> str:
    if not attempts:
        return "<p>No upstream attempt.</p>"
    rows = "".join(
        f"<tr data-attempt=\"{a['number']}\"><td>{a['number']}</td><td>{_e(a['status'])}</td>"
        f"<td>{_e(a['error'] or a['broke'] or '')}</td><td>{a['latency'] * 1000:.0f} ms</td>"
        f"<td>{_ms(a['first_chunk'])}</td>"
        f"<td>{'yes' if a['compacted'] else ''}</td></tr>" for a in attempts)
    return ("<div class=\"scroll\"><table class=\"attempts\"><thead><tr><th>attempt</th>"
            "<th>status</th><th>error</th><th>latency</th><th>first chunk</th>"
            f"<th>compacted</th></tr></thead><tbody>{rows}</tbody></table></div>")


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.0f} ms"


def _messages(messages: Sequence[dict[str, Any]]) -> Iterator[str]:
    """Each message in order; a run of messages the previous request sent as well, folded."""
    i = 0
    while i < len(messages):
        j = i
        while j < len(messages) and messages[j]["unchanged"]:
            j += 1
        if j - i >= MIN_UNCHANGED_RUN:
            inner = "".join(_message(m) for m in messages[i:j])
            yield (f"<li class=\"run\"><details class=\"unchanged\"><summary>{j - i} unchanged"
                   f" (as in the request before)</summary><ol>{inner}</ol></details></li>")
            i = j
        else:
            yield _message(messages[i])
            i += 1


def _message(m: dict[str, Any]) -> str:
    provenance = m["provenance"]
    head = [f"<span class=\"n\">#{m['index']}</span>", f"<b>{_e(m['role'])}</b>",
            f"<span class=\"key\" data-provenance=\"{_e(provenance)}\">{_e(provenance)}</span>"]
    if m.get("session"):
        head.append(f"from session <code>{_e(m['session'])}</code>")
    head.append(f"{m['bytes']} bytes, ~{m['tokens']} tokens")
    if m["tools"]:
        head.append("tools " + ", ".join(f"<code>{_e(t)}</code>" for t in m["tools"]))
    head.append(f"<code class=\"hash\">{_e(m['hash'])}</code>")
    replaced = ""
    if provenance == "summary":
        span = m.get("replaced_span")
        stands = (f"{m['replaced']} messages" if m.get("replaced") is not None
                  else "the earlier messages the agent compacted")
        replaced = (f"<p class=\"replaced\">Summary by {_e(m.get('author') or '-')}, standing "
                    f"for {_e(stands)}"
                    + (f" ({_e(span[0])} to {_e(span[1])})" if span else "") + ".</p>")
    return (f"<li class=\"message\" data-provenance=\"{_e(provenance)}\" "
            f"data-role=\"{_e(m['role'])}\" data-index=\"{m['index']}\">"
            f"<div class=\"head\">{' · '.join(head)}</div>{replaced}{_text(m)}</li>")


def _text(m: dict[str, Any]) -> str:
    text = m.get("text")
    if text is None:
        return ""
    if len(text) <= LONG_CHARS:
        return f"<pre class=\"text\">{_e(text)}</pre>"
    return (f"<pre class=\"preview\">{_e(text[:PREVIEW_CHARS])}…</pre>"
            f"<details class=\"long\"><summary>show all {len(text)} characters</summary>"
            f"<pre class=\"text\">{_e(text)}</pre></details>")
