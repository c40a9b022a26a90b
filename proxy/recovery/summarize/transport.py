"""The summarizer's one-method seam, over the proxy's own upstream client.

Summaries are made by the upstream the agent talks to, with the agent's own credentials: the
headers of the request being recovered travel with the summarization call (minus the ones that
describe the agent's body or ask for a stream), so no key of tailfloor's is ever needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from multidict import CIMultiDict

from proxy.upstream.headers import forward_headers
from proxy.upstream.pool import Upstream, UpstreamResponse

__all__ = ["UpstreamSummaryTransport", "summarizer_headers"]

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
                       timeout: float) -> tuple[int, bytes]:  # noqa: ASYNC109
        response: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(timeout):
                response = await self._upstream.send("POST", CHAT_PATH, "",
                                                     CIMultiDict(headers), body)
                answer = await response.read()
        except BaseException:
            if response is not None:
                response.close()
            raise
        return response.status, answer
