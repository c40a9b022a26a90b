"""Posting OTLP/HTTP, watched: one signal's collector over one kept-alive connection
(``Endpoint``), and each signal's failing episodes (``Episodes``): a WARNING when export
starts failing, an INFO when it works again, what could not be sent dropped and counted,
never retried from the request path.

The standard library's ``http.client``, http or https; the body is protobuf
(``application/x-protobuf``), gzipped when OTEL_EXPORTER_OTLP_COMPRESSION asks. Any 2xx is a
success (OTLP/HTTP answers 200 with an ExportServiceResponse whose partial-success counts
are not read); anything else, a timeout or a refused connection, is a failure.

A post is bounded as a whole, not per read: http.client's timeout applies to each socket
operation, so a collector that dribbles its answer a byte at a time would hold the poster
(and a shutdown waiting on it) for as long as it likes. A timer shuts the socket down once
the post's time is up.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from proxy import __version__

__all__ = ["Endpoint", "Episodes"]

log = logging.getLogger("tailfloor.telemetry")


class Episodes:
    """Failing or not, per signal; the poster reports here."""

    def __init__(self, on_dropped: Callable[[str, int], None]) -> None:
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._on_dropped = on_dropped

    def outcome(self, signal: str, ok: bool, items: int, endpoint: str) -> None:
        with self._lock:
            was = signal in self._failing
            if ok:
                self._failing.discard(signal)
            else:
                self._failing.add(signal)
        if not ok:
            self._on_dropped(signal, items)
        if not ok and not was:
            # The endpoint only: its headers may carry a key.
            log.warning("OTLP export of %s to %s failed; requests are not affected, what "
                        "cannot be sent is dropped and counted until it works again",
                        signal, endpoint)
        elif ok and was:
            log.info("OTLP export of %s to %s works again", signal, endpoint)


class Endpoint:
    """One signal's URL. Used from the poster thread only."""

    def __init__(self, url: str, headers: Mapping[str, str], *, compress: bool = False,
                 certificate: str | None = None) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # What a log line may show: no user, password or query (a key may sit there).
        self.shown = f"{parts.scheme}://{self._host}:{self._port}{parts.path or '/'}"
        self._compress = compress
        self._headers = {**headers, "Content-Type": "application/x-protobuf",
                         "User-Agent": f"tailfloor/{__version__} (OTLP/HTTP exporter)"}
        if compress:
            self._headers["Content-Encoding"] = "gzip"
        self._context = ssl.create_default_context(cafile=certificate) if self._https \
            else None
        self._connection: http.client.HTTPConnection | None = None

    def post(self, body: bytes, timeout: float) -> bool:
        """Send one export request; True when the collector took it (2xx)."""
        if timeout <= 0:
            return False
        if self._compress:
            body = gzip.compress(body, compresslevel=6)
        guard = threading.Timer(timeout, self.abort)
        guard.daemon = True
        guard.start()
        try:
            connection = self._connection
            if connection is None:
                connection = self._connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout, context=self._context) \
                    if self._context is not None else \
                    http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            connection.request("POST", self._path, body, self._headers)
            response = connection.getresponse()
            response.read()
        except Exception:  # the episode's failure, never the thread's end: OSError,
            # HTTPException, or a ValueError for a URL or header http.client refuses
            self.close()  # a timeout leaves the connection in an unknown state
            return False
        finally:
            guard.cancel()
        if response.will_close:
            self.close()
        return 200 <= response.status < 300

    def abort(self) -> None:
        """From any thread: end the post under way, if any (its read fails at once)."""
        connection = self._connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # closed meanwhile, or never connected
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
