"""Headers on the way to the upstream and back, and the request head every upstream call
is framed with."""

from __future__ import annotations

import re
from collections.abc import Mapping

from multidict import CIMultiDict

from proxy.errors import InvalidHeader, InvalidTarget

__all__ = ["AGENT_KEY_HEADER", "HOP_BY_HOP", "build_head", "forward_headers",
           "response_headers"]

# RFC 9110 section 7.6.1 connection-specific fields, plus the framing fields aiohttp recomputes.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
})
# tailfloor's own credential: proves the agent to tailfloor, never goes further.
AGENT_KEY_HEADER = "x-tailfloor-agent-key"


# What must never reach an upstream head: a line break would end the head or start another
# request on a pooled connection; a space or control character would split the request line.
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")
_METHOD = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}$")


def build_head(method: str, target: str, host: str, headers: Mapping[str, str],
               framing: str, *, traceparent: str | None = None) -> bytes:
    """The request head for the upstream, refused (``InvalidTarget`` / ``InvalidHeader``)
    when a part would put CR, LF or NUL into it. Every request to the upstream is framed
    here, so no route can bypass the check.

    Header values travel as their original bytes (aiohttp decodes them as UTF-8 with
    ``surrogateescape``, which this reverses), so a non-ASCII value is forwarded unchanged.
    ``traceparent``: tailfloor's own, new on every request, so it is kept out of the headers
    whose block is cached (it would make every set distinct).
    """
    if not _METHOD.match(method):
        raise InvalidTarget("the request method is not an HTTP token")
    if _BAD_TARGET.search(target):
        raise InvalidTarget("the request target holds a control character or space")
    items = tuple(headers.items())
    block = _blocks.get(items)
    if block is None:
        block = _header_block(headers)
        if len(block) <= _BLOCK_BYTES_KEPT:  # a client's huge headers are not kept
            if len(_blocks) >= _BLOCKS_KEPT:
                _blocks.clear()
            _blocks[items] = block
    if traceparent is not None:
        if not _TRACEPARENT.match(traceparent):
            raise InvalidHeader("the value of header 'traceparent' is not a trace context")
        framing = f"traceparent: {traceparent}\r\n{framing}"
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{block}{framing}\r\n"
    return head.encode("utf-8", "surrogateescape")


# An agent sends the same headers request after request: each distinct set is framed and
# checked once. Bounded; the values may be credentials, held only as long as the process.
_BLOCKS_KEPT = 1024
_BLOCK_BYTES_KEPT = 8192  # so the cache holds 8 MiB of header text at most (plus its keys)
_blocks: dict[tuple[tuple[str, str], ...], str] = {}


def _header_block(headers: Mapping[str, str]) -> str:
    """The header lines, each checked for CR, LF and NUL."""
    lines = [f"{name}: {value}\r\n" for name, value in headers.items()]
    block = "".join(lines)
    # Each line ends in exactly one CR LF: any other CR or LF came from a name or value.
    if block.count("\r") != len(lines) or block.count("\n") != len(lines) or "\x00" in block:
        bad = next(name for name, value in headers.items()
                   if any(c in name or c in value for c in "\r\n\x00"))
        # Only the name: a value may be a credential.
        raise InvalidHeader(f"the value of header {bad!r} holds CR, LF or NUL")
    return block


def forward_headers(
    headers: Mapping[str, str], *, identity_encoding: bool = False,
    decoded_body: bool = False,
) -> CIMultiDict[str]:
    """Request headers for the upstream: everything but hop-by-hop fields (and the body's
    ``Content-Encoding`` when tailfloor sends the body decoded)."""
    named_in_connection = {
        token.strip().lower() for token in headers.get("Connection", "").split(",") if token
    }
    if decoded_body:
        named_in_connection.add("content-encoding")
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in HOP_BY_HOP or lowered in named_in_connection \
                or lowered == AGENT_KEY_HEADER:
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


