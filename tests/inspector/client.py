"""Small HTTP helpers for the inspector's tests: chat requests to the proxy port, pages and
their JSON twins from the admin listener."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

import orjson

from tests.conftest import settled_metrics


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(NoRedirect)


def fetch(url: str, headers: dict[str, str] | None = None
          ) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with _OPENER.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def chat(proxy: Any, messages: list[dict[str, Any]], session: str | None = None,
         headers: dict[str, str] | None = None, **extra: Any) -> str:
    """One non-streamed chat request; the x-tailfloor verdict."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    if session is not None:
        headers["x-tailfloor-session"] = session
    body = orjson.dumps({"model": "fake-model", "messages": messages, "stream": False,
                         **extra})
    request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=body,
                                     headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        verdict: str = response.headers.get("x-tailfloor", "")
    settled_metrics(proxy)  # the inspector has it once the request is recorded
    return verdict


def session_url(proxy: Any, session: str) -> str:
    return f"{proxy.admin_url}/tailfloor/ui/sessions/{quote(session, safe='')}"


def session_json(proxy: Any, session: str) -> dict[str, Any]:
    status, _, body = fetch(session_url(proxy, session) + "?format=json")
    assert status == 200, body[:300]
    found: dict[str, Any] = orjson.loads(body)
    return found


def message_hash(message: dict[str, Any]) -> str:
    """The inspector's short hash as the README defines it: blake2b (5 bytes) of a message's
    JSON, a text content over 4,096 characters standing as ``<length>:<first 2,048>...<last
    2,048>``."""
    content = message.get("content")
    if isinstance(content, str) and len(content) > 4096:
        message = {**message, "content": f"{len(content)}:{content[:2048]}...{content[-2048:]}"}
    return hashlib.blake2b(orjson.dumps(message), digest_size=5).hexdigest()
