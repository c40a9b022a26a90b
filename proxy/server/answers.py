"""Answers the exchange gives besides a relayed stream: tailfloor's own errors (in the
request's dialect) and a complete answer too large to hold, passed on as it arrives."""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict

from proxy.errors import ProxyError, to_response_parts
from proxy.server.guard import start_answer
from proxy.upstream.pool import UpstreamResponse
from proxy.values import frozen_value
from proxy.wire.dialect import Dialect

__all__ = ["JSON", "Finished", "error_response", "pass_large"]

JSON = "application/json"


@frozen_value
class Finished:
    """The answer the client gets, and whether a write found the client gone (a 499)."""

    response: web.StreamResponse
    verdict: str = "none"
    client_gone: bool = False


def error_response(exc: ProxyError, request_id: str,
                   dialect: Dialect | None = None) -> web.Response:
    status, body = to_response_parts(exc)
    if dialect is not None:
        body = dialect.error_body(body)
    return web.Response(body=body, status=status, content_type=JSON,
                        headers={"x-tailfloor-request-id": request_id})


async def pass_large(request: web.Request, upstream: UpstreamResponse, head: bytes, *,
                     headers: CIMultiDict[str], verdict: str
                     ) -> tuple[Finished, ProxyError | None]:
    """A complete answer too large to hold: passed on as it arrives, its usage not read; and
    the upstream's failure when it broke mid-answer (the client's answer is cut short)."""
    response = web.StreamResponse(status=upstream.status, headers=headers)
    try:
        await start_answer(response, request)
        await response.write(head)
        async for chunk in upstream.chunks():
            await response.write(chunk)
    except ConnectionError:
        upstream.close()  # the client left: nothing more to send
        return Finished(response, verdict, client_gone=True), None
    except ProxyError as exc:
        upstream.close()
        if request.transport is not None:
            request.transport.close()
        return Finished(response, verdict), exc
    except BaseException:
        upstream.close()
        raise
    upstream.release()
    await response.write_eof()
    return Finished(response, verdict), None
