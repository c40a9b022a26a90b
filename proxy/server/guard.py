"""The last guard around every route: an exception nothing else expected becomes an
OpenAI-shaped 500 carrying the request id, logged once with its traceback and counted.

Client mistakes never get here (they are ``Rejected`` answers); neither do a client leaving
(``CancelledError``, ``ConnectionError``) nor aiohttp's own HTTP exceptions. Once an answer's
head has gone out (``start_answer``) a second answer cannot be sent: the error goes on to
aiohttp, which logs it once with its traceback and closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from proxy.errors import error_body
from proxy.logs import REQUEST_ID
from proxy.server.state import STATE_KEY

__all__ = ["ANSWER_STARTED", "last_guard", "start_answer"]

ANSWER_STARTED = web.RequestKey("tailfloor.answer_started", bool)
_log = logging.getLogger("tailfloor")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def start_answer(response: web.StreamResponse, request: web.Request,
                       on_failure: Callable[[], None] | None = None) -> None:
    """Send the answer's head: from here on an error cannot become another answer. When
    sending it fails (the client left), ``on_failure`` drops what the answer was reading."""
    try:
        await response.prepare(request)
    except BaseException:
        if on_failure is not None:
            on_failure()
        raise
    request[ANSWER_STARTED] = True


@web.middleware
async def last_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (web.HTTPException, asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        request.app[STATE_KEY].metrics.internal_errors.inc()
        if request.get(ANSWER_STARTED):
            raise  # aiohttp logs it with its traceback and closes the connection
        request_id = REQUEST_ID.get()
        # The path only: a query may carry a credential.
        _log.exception("unexpected error answering %s %s", request.method, request.path)
        return web.Response(
            status=500, content_type="application/json",
            body=error_body(f"tailfloor failed to handle this request (request id "
                            f"{request_id}); it has been logged", "server_error",
                            "internal_error"),
            headers={"x-tailfloor-request-id": request_id})
