"""The upstream side: where a client path goes, which headers travel, and the pooled client.

Upstream base URLs usually carry a path (``https://api.openai.com/v1``,
``https://openrouter.ai/api/v1``, ``http://vllm:8000/v1``) while OpenAI SDK users put ``/v1``
in their own ``base_url``. Both forms are accepted: a client path's leading ``/v1`` is replaced
by the upstream's base path, which defaults to ``/v1`` when the upstream URL has none.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.errors import UpstreamTimeout, UpstreamUnavailable

# RFC 9110 section 7.6.1 connection-specific fields, plus the framing fields aiohttp recomputes.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
})


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    origin: str
    base_path: str

    @classmethod
    def parse(cls, url: str) -> UpstreamTarget:
        parts = urlsplit(url)
        base = parts.path.rstrip("/") or "/v1"
        return cls(origin=f"{parts.scheme}://{parts.netloc}", base_path=base)

    def path_for(self, client_path: str) -> str:
        if client_path == "/v1" or client_path.startswith("/v1/"):
            client_path = client_path[3:]
        return self.base_path + client_path


def forward_headers(
    headers: Mapping[str, str], *, identity_encoding: bool = False,
) -> CIMultiDict[str]:
    """Request headers for the upstream: everything but hop-by-hop fields."""
    named_in_connection = {
        token.strip().lower() for token in headers.get("Connection", "").split(",") if token
    }
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in HOP_BY_HOP or lowered in named_in_connection:
            continue
        out.add(name, value)
    if identity_encoding:
        # The chat route reads the stream (usage, errors), so it asks for it uncompressed.
        out["Accept-Encoding"] = "identity"
    return out


def response_headers(headers: Mapping[str, str], *, keep_length: bool) -> CIMultiDict[str]:
    """Upstream response headers for the client."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in HOP_BY_HOP and not (keep_length and lowered == "content-length"):
            continue
        out.add(name, value)
    return out


def _broken(exc: BaseException) -> UpstreamUnavailable:
    return UpstreamUnavailable(f"the upstream connection broke: {type(exc).__name__}")


class UpstreamResponse:
    """An upstream answer whose headers have arrived; the body is read or iterated once."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: CIMultiDictProxy[str] = response.headers

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except TimeoutError as exc:
            raise UpstreamTimeout("the upstream stopped sending mid-answer") from exc
        except aiohttp.ClientError as exc:
            raise _broken(exc) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive. Raises UpstreamTimeout / UpstreamUnavailable mid-way."""
        content = self._response.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    return
                yield chunk
        except TimeoutError as exc:
            raise UpstreamTimeout("the upstream went silent mid-stream") from exc
        except aiohttp.ClientError as exc:
            raise _broken(exc) from exc

    @property
    def complete(self) -> bool:
        return self._response.content.is_eof()

    def close(self) -> None:
        """Drop the connection: used when the answer was not read to its end."""
        self._response.close()

    def release(self) -> None:
        self._response.release()


class Upstream:
    """A keep-alive connection pool to one upstream origin."""

    def __init__(self, url: str, connect_timeout: float, read_timeout: float) -> None:
        self.target = UpstreamTarget.parse(url)
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=0, keepalive_timeout=60, enable_cleanup_closed=True,
            ttl_dns_cache=60)
        self._session = aiohttp.ClientSession(
            base_url=None, connector=connector, timeout=self._timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(), raise_for_status=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self, method: str, client_path: str, query: str, headers: CIMultiDict[str],
        body: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse:
        """Send a request and wait for the response headers."""
        assert self._session is not None, "Upstream.start() was not awaited"
        url = self.target.origin + self.target.path_for(client_path)
        if query:
            url += "?" + query
        try:
            response = await self._session.request(
                method, URL(url, encoded=True), headers=headers, data=body, allow_redirects=False,
                compress=None, chunked=None)
        except TimeoutError as exc:
            raise UpstreamTimeout("the upstream did not answer in time") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnavailable(
                f"cannot connect to the upstream: {exc.os_error.strerror or exc}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(
                f"the upstream connection failed: {type(exc).__name__}") from exc
        return UpstreamResponse(response)
