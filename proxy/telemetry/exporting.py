"""Posting OTLP/HTTP, watched: one signal's collector over one kept-alive connection
(``Endpoint``), and each signal's failing episodes (``Episodes``): a WARNING when export
starts failing, an INFO when it works again, what could not be sent dropped and counted,
never retried from the request path.

HTTP/1.1 written here on a plain or TLS socket (framing.py makes the head once and reads the
answer): a general client parsed each answer's headers into a message object, which cost
more than the export it answered. The body is protobuf (``application/x-protobuf``),
gzipped when OTEL_EXPORTER_OTLP_COMPRESSION asks. Any 2xx is a success (OTLP/HTTP answers 200
with an ExportServiceResponse whose partial-success counts are not read); anything else, a
timeout, a refused connection or an answer framing.py cannot read, is a failure.

A post is bounded as a whole, not per read: a watchdog (watchdog.py) shuts the post's socket
down once the post's time is up (one watchdog thread per endpoint); it is armed for one post
(a number checked under a lock), so an abort that comes too late for its post leaves the
next post's kept-alive socket alone. The connection is made here, so the whole of it is
within the bound: an address in the URL is used as it is; a name is resolved on a thread of
its own, waited for no longer than the post's time (a resolver that hangs leaves that one
thread waiting; while it does, a post that needs a resolution fails at once instead of
starting another); each address's connect() gets what is left of it, and the TLS handshake's
socket is the one the watchdog shuts down. A kept-alive connection the collector closed
while idle is seen before a post is written to it: a new connection, not a failed post.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from proxy import __version__
from proxy.errors import unlinked
from proxy.telemetry.framing import Answer, request_head
from proxy.telemetry.watchdog import Watchdog

__all__ = ["Endpoint", "Episodes"]

log = logging.getLogger("tailfloor.telemetry")
_READ = 16384  # bytes asked of one recv: an answer is a few hundred


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
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # What a log line may show: no user, password or query (a key may sit there).
        self.shown = f"{parts.scheme}://{self._host}:{self._port}{parts.path or '/'}"
        self._compress = compress
        sent = {**headers, "Content-Type": "application/x-protobuf",
                "User-Agent": f"tailfloor/{__version__} (OTLP/HTTP exporter)"}
        if compress:
            sent["Content-Encoding"] = "gzip"
        self._head = request_head(path, self._host, self._port, self._https, sent)
        if self._head is None:  # the URL shown only: a header's value may be a key
            log.warning("OTLP export to %s cannot be made: its URL or a header holds a "
                        "character no request head can carry (a space, a line break)",
                        self.shown)
        self._context = ssl.create_default_context(cafile=certificate) if self._https \
            else None
        self._sock: socket.socket | None = None  # the kept-alive connection
        self._poll: select.poll | None = None  # of it: whether it closed while idle
        self._lock = threading.Lock()  # the post under way and its socket, for the watchdog
        self._posts = 0  # posts begun: the number the watchdog is armed with
        self._under_way: int | None = None
        self._socket: socket.socket | None = None  # the raw socket of the post under way
        self._resolving: threading.Thread | None = None
        self._watchdog = Watchdog(self._abort)
        # An address in the URL needs no resolver: looked up on the spot, never waited on.
        self._numeric = _is_address(self._host)

    def post(self, body: bytes, timeout: float) -> bool:
        """Send one export request; True when the collector took it (2xx)."""
        head = self._head
        if timeout <= 0 or head is None:
            return False
        if self._compress:
            body = gzip.compress(body, compresslevel=6)
        deadline = time.monotonic() + timeout
        sock = self._sock
        with self._lock:
            self._posts += 1
            this = self._under_way = self._posts
            self._socket = sock
        self._watchdog.arm(this, deadline)
        try:
            poller = self._poll
            if sock is not None and poller is not None and poller.poll(0) \
                    and self._gone(sock):
                with self._lock:
                    self._socket = None
                self.close()
                sock = None
            if sock is None:
                sock = self._connect(deadline)
            sock.settimeout(timeout)
            request = (head, str(len(body)).encode(), b"\r\n\r\n", body)
            if self._context is None:
                # The pieces as they are (a batch can be megabytes: not copied again), in
                # one call; the rest of a partial send joined.
                sent = sock.sendmsg(request)
                if sent < len(head) + len(request[1]) + 4 + len(body):
                    sock.sendall(b"".join(request)[sent:])
            else:  # TLS writes what it is given whole
                sock.sendall(b"".join(request))
            answer = Answer()
            recv = sock.recv
            while True:
                data = recv(_READ)
                if not data:
                    answer.closed()  # the end of a body read to the close, or an error
                    break
                if answer.feed(data):
                    break
        except Exception:  # the episode's failure, never the thread's end: OSError (a
            # timeout, a reset, the watchdog's shutdown), the answer's AnswerError
            with self._lock:  # the abort leaves alone a descriptor the close frees
                self._under_way = self._socket = None
            self.close()  # the connection is in an unknown state
            return False
        finally:
            with self._lock:  # from here on, this post's abort does nothing
                self._under_way = self._socket = None
            self._watchdog.disarm(this)
        if not answer.keep_alive:
            self.close()
        return 200 <= answer.status < 300

    def _gone(self, sock: socket.socket) -> bool:
        """The idle connection is readable: closed by the collector, or bytes no request
        asked for; either way not one to post on. Over TLS, a session ticket the collector
        sent after the handshake is read (and the connection kept) too."""
        if self._context is None:
            return True
        try:
            sock.settimeout(0.0)
            sock.recv(1)  # b"": closed; anything else: not asked for
        except ssl.SSLWantReadError:  # only TLS records of its own: still open
            return False
        except OSError:
            pass
        return True

    def _connect(self, deadline: float) -> socket.socket:
        """A new connection, connected (and its TLS handshake done) before ``deadline``."""
        addresses = self._resolve(deadline)
        failure: OSError = OSError(f"no address for {self._host}")
        for family, kind, protocol, _name, address in addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            raw = socket.socket(family, kind, protocol)
            sock: socket.socket = raw
            with self._lock:
                self._socket = raw
            try:
                raw.settimeout(left)
                raw.connect(address)
                if self._context is not None:
                    # The handshake apart, so the watchdog has its socket meanwhile (wrapping
                    # takes the raw socket's descriptor away from it).
                    sock = self._context.wrap_socket(raw, server_hostname=self._host,
                                                     do_handshake_on_connect=False)
                    with self._lock:
                        self._socket = sock
                    sock.do_handshake()
            except (OSError, ValueError) as exc:  # ValueError: a name ssl refuses
                sock.close()
                failure = unlinked(exc) if isinstance(exc, OSError) else OSError(str(exc))
                continue
            self._sock, self._poll = sock, select.poll()
            self._poll.register(sock, select.POLLIN)
            return sock
        try:
            raise failure
        finally:
            del failure  # raised from this frame, it would keep the frame that keeps it

    def _resolve(self, deadline: float) -> list[tuple[Any, ...]]:
        """The host's addresses, waited for until ``deadline`` at most."""
        if self._numeric:
            return list(socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM,
                                           flags=socket.AI_NUMERICHOST))
        if self._resolving is not None and self._resolving.is_alive():
            raise OSError(f"resolving {self._host} still hangs")
        found: list[list[tuple[Any, ...]]] = []
        host, port = self._host, self._port

        def resolve() -> None:
            with contextlib.suppress(OSError, UnicodeError):
                found.append(list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))

        self._resolving = threading.Thread(target=resolve, name="tailfloor-otlp-resolve",
                                           daemon=True)
        self._resolving.start()
        self._resolving.join(max(deadline - time.monotonic(), 0.0))
        if not found:
            raise OSError(f"could not resolve {self._host} in time")
        return found[0]

    def _abort(self, post: int) -> None:
        """The watchdog's: end post ``post`` if it is still under way (its socket's reads and
        writes fail at once), and nothing else."""
        with self._lock:
            if self._under_way != post or self._socket is None:
                return
            with contextlib.suppress(OSError):  # closed meanwhile, or not yet connected
                # The socket's own shutdown, also for TLS: SSLSocket's would drop its state
                # under the thread using it.
                socket.socket.shutdown(self._socket, socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the connection (a collector that closes each one, a failed post)."""
        sock, self._sock, self._poll = self._sock, None, None
        if sock is not None:
            sock.close()

    def end(self) -> None:
        """Close the connection and end the watchdog's thread (at shutdown; a later post
        starts it again)."""
        self.close()
        self._watchdog.stop()


def _is_address(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True
