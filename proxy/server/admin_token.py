"""The admin listener's optional access token (``--admin-token-file``).

Every admin route but the probes asks for ``Authorization: Bearer <token>`` or the cookie a
``?token=`` visit sets (then the visit is sent on without the token, so it stays out of the
address bar and the history). The cookie holds a value derived from the token, never the
token, and a changed token file makes every old cookie worthless. Compared in constant time;
the file is read again when it changes (a rotated Secret).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = ["COOKIE", "AdminToken", "token_guard"]

log = logging.getLogger("tailfloor")
COOKIE = "tailfloor_admin"
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminToken:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._token = b""
        self._cookie = ""
        self.current()
        if not self._token:
            raise ValueError(f"{path} holds no token")

    def current(self) -> bytes:
        """The token, read again when the file changed; the last good one while it cannot
        be read or is empty (a Secret being rewritten)."""
        try:
            stat = os.stat(self.path)
            seen = (stat.st_mtime_ns, stat.st_size)
            if seen != self._seen:
                token = self.path.read_bytes().strip()
                self._seen = seen
                if token:
                    self._token = token
                    self._cookie = hmac.new(token, b"tailfloor admin cookie",
                                            hashlib.sha256).hexdigest()
        except OSError as exc:
            log.warning("cannot read --admin-token-file (%s); the last token stays in force",
                        exc.strerror or exc)
        return self._token

    def cookie(self) -> str:
        self.current()
        return self._cookie

    def admits(self, request: web.Request) -> bool:
        token = self.current()
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token):
            return True
        cookie = request.cookies.get(COOKIE)
        return cookie is not None and hmac.compare_digest(cookie.encode(),
                                                          self._cookie.encode())


def token_guard(token: AdminToken) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or token.admits(request):
            return await handler(request)
        given = request.query.get("token")
        if given is not None and hmac.compare_digest(given.encode(), token.current()):
            rest = request.rel_url.with_query(
                [(k, v) for k, v in request.query.items() if k != "token"])
            response = web.Response(status=303, headers={"Location": str(rest),
                                                         "Referrer-Policy": "no-referrer"})
            response.set_cookie(COOKIE, token.cookie(), httponly=True, samesite="Strict",
                                path="/")
            return response
        return web.Response(
            status=401, text="401: this admin listener asks for its token: "
                             "Authorization: Bearer <token>, or open a page once with "
                             "?token=<token>\n",
            headers={"WWW-Authenticate": 'Bearer realm="tailfloor admin"',
                     "Referrer-Policy": "no-referrer"})

    return guard
