"""The inspector's routes on the admin listener: the sessions, one session's kept requests,
their JSON twins, and the page's script and style sheet.

A page is worked out in a worker thread from a snapshot of what the store holds (the store
itself changes only on the event loop), so a large page never holds up a request.
"""

from __future__ import annotations

import socket
from collections import deque
from dataclasses import replace
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from proxy.inspector.facts import session_facts, session_row
from proxy.inspector.pages import UI, not_found_page, session_page, sessions_page
from proxy.inspector.store import InspectorStore, SessionRecord
from proxy.server.state import STATE_KEY, ProxyState

__all__ = ["add_routes", "replica_name"]

# No inline script or style can run; the pages fetch only from this listener.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_STATIC = {"inspector.js": "text/javascript", "inspector.css": "text/css"}


def replica_name(configured: str) -> str:
    """The name the pages give this replica: configured, or the host's (a pod's name)."""
    return configured or socket.gethostname()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get(UI, sessions)
    router.add_get(UI + "/", sessions)
    router.add_get(UI + "/static/{name}", static)
    router.add_get(UI + "/sessions/{session_id:.+}", session)


def _store(state: ProxyState) -> InspectorStore:
    assert state.inspector is not None  # the routes exist only with the inspector on
    return state.inspector


def _wants_json(request: web.Request) -> bool:
    if request.query.get("format") == "json":
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "text/html" not in accept


def _answer(request: web.Request, facts: dict[str, Any], page: str, status: int = 200
            ) -> web.Response:
    if _wants_json(request):
        return web.Response(body=orjson.dumps(facts), status=status,
                            content_type="application/json", headers=_HEADERS)
    return web.Response(body=page.encode("utf-8", "replace"), status=status,
                        content_type="text/html", charset="utf-8", headers=_HEADERS)


def _common(state: ProxyState) -> dict[str, Any]:
    return {"replica": replica_name(state.settings.replica_name),
            "content": state.settings.inspect_content,
            "per_session": state.settings.inspect_requests}


async def sessions(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    facts = {**_common(state), "sessions": [session_row(r) for r in _store(state).sessions()]}
    return _answer(request, facts, sessions_page(facts))


async def session(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    wanted = request.match_info["session_id"]
    record = _store(state).session(wanted)
    common = _common(state)
    if record is None:
        facts = {**common, "error": "no such session", "session_id": wanted}
        return _answer(request, facts, not_found_page(common["replica"], wanted), 404)
    snapshot = replace(record, requests=deque(record.requests))
    facts, page = await state.offload(_session_page, snapshot, common)
    return _answer(request, facts, page)


def _session_page(record: SessionRecord, common: dict[str, Any]
                  ) -> tuple[dict[str, Any], str]:
    facts = {**common, "session": session_facts(record, common["content"])}
    return facts, session_page(facts)


def _static_file(name: str) -> bytes:
    return resources.files("proxy.inspector").joinpath("static", name).read_bytes()


_FILES = {name: _static_file(name) for name in _STATIC}


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _FILES:
        raise web.HTTPNotFound()
    return web.Response(body=_FILES[name], content_type=_STATIC[name], charset="utf-8",
                        headers=_HEADERS)
