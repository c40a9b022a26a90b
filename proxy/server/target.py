"""The client's request target, made safe to forward. Pure.

aiohttp hands the request line's target over as text (``utf-8``, ``surrogateescape``) and
also offers a *decoded* query string; only the raw form may reach the upstream, or ``%0d%0a``
in a query becomes a real line break in the upstream head. ``parse_target`` takes the raw
target and returns the path and query the upstream gets, still percent-encoded as the client
sent them:

- absolute form (``POST http://host/v1/... HTTP/1.1``): only its path and query are used;
  the asterisk form (``OPTIONS *``) is refused;
- a fragment is dropped (it never belongs in a request target);
- bytes outside printable ASCII are percent-encoded (their original bytes), except control
  characters and spaces, which are refused: they could split the upstream request line;
- a ``.`` or ``..`` segment, in any spelling (``%2e%2e``, ``%252e%252e`` for a gateway that
  decodes twice, hidden behind an encoded ``/`` or ``\\``, or followed by ``;`` path
  parameters as Tomcat reads them) is refused, and so is a path whose percent-encoded bytes
  are not UTF-8 (overlong ``%c0%ae``): an upstream that resolves such a segment could be
  reached above its base path (``/tenant-a/v1`` is a boundary);
- an ``/agents/<id>/`` prefix is stripped and its id returned (an invalid id is refused).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from proxy.errors import InvalidTarget
from proxy.values import frozen_value

__all__ = ["Target", "parse_target", "route_path"]

_ABSOLUTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")
_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")
# Printable ASCII but the space: what a request target may hold as is.
_PLAIN = frozenset(range(0x21, 0x7F))
_FORBIDDEN = frozenset(range(0x00, 0x21)) | {0x7F}


@frozen_value
class Target:
    """Where a request goes: ``path`` and ``query`` as the upstream should see them."""

    path: str  # percent-encoded, starts with "/", agent prefix removed
    query: str  # percent-encoded, without the "?"; "" when there is none
    agent: str | None  # from an /agents/<id>/ prefix

    @property
    def path_and_query(self) -> str:
        return self.path + "?" + self.query if self.query else self.path


def _ascii(part: str, what: str) -> str:
    """``part`` with every byte outside printable ASCII percent-encoded; control characters
    and spaces refused."""
    if part.isascii() and part.isprintable() and " " not in part:
        return part
    out: list[str] = []
    for byte in part.encode("utf-8", "surrogateescape"):
        if byte in _FORBIDDEN:
            raise InvalidTarget(f"the request {what} holds a control character or space "
                                f"(0x{byte:02x})")
        out.append(chr(byte) if byte in _PLAIN else f"%{byte:02X}")
    return "".join(out)


def _climbs(path: str) -> bool:
    """Whether any segment is ``.`` or ``..`` once decoded (up to three times; ``%2f`` and
    ``\\`` as ``/``; ``;`` parameters ignored), or decodes to bytes that are not UTF-8."""
    for segment in path.split("/"):
        if "." not in segment and "%" not in segment:
            continue
        decoded = segment
        for _round in range(3):
            try:
                decoded = unquote(decoded, errors="strict")
            except UnicodeDecodeError:
                return True
            pieces = decoded.replace("\\", "/").split("/")
            if any(piece.split(";", 1)[0] in (".", "..") for piece in pieces):
                return True
            if "%" not in decoded:
                break
    return False


def route_path(path: str) -> str:
    """The form of a path used to pick a route: ``//`` collapsed, a trailing ``/`` and an
    encoded ``/`` read as the upstream may read them, so ``/v1//chat/completions/`` is
    still the chat route (the upstream gets the path as sent)."""
    decoded = path.replace("%2F", "/").replace("%2f", "/")
    while "//" in decoded:
        decoded = decoded.replace("//", "/")
    return decoded.rstrip("/") or "/"


def parse_target(raw: str) -> Target:
    """The forwardable form of a raw request target; raises ``InvalidTarget``."""
    if not raw.startswith("/"):
        found = _ABSOLUTE.match(raw)
        if found is None:
            raise InvalidTarget("the request target must be a path (origin form) or an "
                                "absolute URL")
        raw = raw[found.end():]
        if not raw.startswith("/"):
            raw = "/" + raw
    raw = raw.split("#", 1)[0]
    path, _, query = raw.partition("?")
    path = _ascii(path, "path")
    query = _ascii(query, "query")
    if _climbs(path):
        raise InvalidTarget("the request path holds a '.' or '..' segment")
    agent = None
    if path.startswith("/agents/"):
        name, slash, tail = path[len("/agents/"):].partition("/")
        if slash:
            agent = unquote(name)
            if not _AGENT_ID.match(agent):
                raise InvalidTarget("the agent id of an /agents/<id>/ prefix must be 1-128 "
                                    "letters, digits or ._:@- characters")
            path = "/" + tail
    return Target(path=path, query=query, agent=agent)
