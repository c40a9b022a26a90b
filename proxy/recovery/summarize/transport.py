"""The summarizer's one-method seam, over the proxy's own upstream client.

Summaries are made by the upstream the agent talks to, with the agent's own credentials: the
headers of the request being recovered travel with the summarization call (minus the ones that
describe the agent's body or ask for a stream), so no key of tailfloor's is ever needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import orjson
from multidict import CIMultiDict

from proxy.upstream.headers import forward_headers
from proxy.upstream.pool import Upstream, UpstreamResponse
from proxy.wire.dialect import Dialect

__all__ = ["DialectSummaryTransport", "UpstreamSummaryTransport", "summarizer_headers"]

CHAT_PATH = "/v1/chat/completions"
_DROPPED = frozenset({"content-encoding", "content-type", "content-length", "accept"})


def summarizer_headers(client_headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers for a non-streaming summarization call."""
    out = {name: value for name, value in forward_headers(client_headers,
                                                            identity_encoding=True).items()
           if name.lower() not in _DROPPED}
    out["Accept"] = "application/json"
    return out


class UpstreamSummaryTransport:
    """``SummarizerTransport`` that POSTs to the upstream's chat completions."""

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream

    async def complete(self, body: bytes, headers: Mapping[str, str],
                       timeout: float, path: str = CHAT_PATH,  # noqa: ASYNC109
                       ) -> tuple[int, bytes]:
        response: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(timeout):
                response = await self._upstream.send("POST", path, "",
                                                     CIMultiDict(headers), body)
                answer = await response.read()
        except BaseException:
            if response is not None:
                response.close()
            raise
        return response.status, answer


class DialectSummaryTransport:
    """The summarizer's chat call made in the recovered request's own dialect (to the same
    upstream, with the same credentials), its answer read back as a chat completion."""

    def __init__(self, inner: UpstreamSummaryTransport, dialect: Dialect) -> None:
        self._inner = inner
        self._dialect = dialect

    async def complete(self, body: bytes, headers: Mapping[str, str],
                       timeout: float) -> tuple[int, bytes]:  # noqa: ASYNC109
        request = self._dialect.summary_request(orjson.loads(body))
        status, answer = await self._inner.complete(orjson.dumps(request), headers, timeout,
                                                    path=self._dialect.path)
        return status, self._dialect.summary_answer(answer) if status == 200 else answer
