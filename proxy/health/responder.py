"""The health process itself: answers ``/healthz`` and ``/readyz`` on a socket the proxy bound,
from what the proxy's event loop answers it (proxy/health/verdict.py).

The proxy starts it with three descriptors: the listening socket, the write end of the pipe
its questions go down, and the read end of the pipe the loop answers on, whose write end
only the proxy holds. When that pipe ends (the proxy stopped, or died however it died) this
process exits. Small on purpose: the standard library's ``selectors`` and nothing that
imports more, so it holds ~10 MB and starts in tens of milliseconds; it waits with no timer
while nobody probes.

Hostile clients: a request head is read for at most ``HEAD_DEADLINE`` seconds and
``HEAD_LIMIT`` bytes; past ``MAX_CONNECTIONS`` open connections the oldest is answered if
its request has come, else closed, so idle connections held open cannot keep a probe out;
at most ``ACCEPTS_A_ROUND`` connections are taken before the open ones are read, so a flood
of new ones cannot push out a probe that has sent its request. One answer per connection,
then its end; what the client sends after its head is read and let go until it closes the
connection, for at most ``LINGER`` seconds. No request, however malformed, ends the process."""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import socket
import sys
import time

from proxy.health.verdict import HEALTHZ, READYZ, Heard, answer, probed_path

__all__ = ["main", "serve"]

MAX_CONNECTIONS = 64
HEAD_LIMIT = 8192
HEAD_DEADLINE = 2.0
READY_WAIT = 1.0  # seconds /readyz waits for the loop's answer before it uses what it knows
ACCEPTS_A_ROUND = 16
# After its answer, a connection is read and let go of what it sends for up to ``LINGER``
# seconds and ``UNREAD_LIMIT`` bytes, or until the client closes it: closed with bytes
# unread, a socket answers with a reset, which can overtake the answer itself.
LINGER = 1.0
UNREAD_LIMIT = 65536
READS_A_ROUND = 16
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


def _send_answer(sock: socket.socket, status: int, text: str, head_only: bool) -> None:
    body = text.encode()
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain; "
            f"charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    # A few hundred bytes: a fresh socket's send buffer takes them whole. Then the answer's
    # end, while the socket stays open to read what the client still sends.
    with contextlib.suppress(OSError):
        sock.send(head.encode() + (b"" if head_only else body))
        sock.shutdown(socket.SHUT_WR)


def _discard(sock: socket.socket, room: int) -> tuple[int, bool]:
    """Reads what has come, at most ``room`` bytes in ``READS_A_ROUND`` reads, and lets it
    go: how much, and whether the client's end came (or the connection broke)."""
    read = 0
    for _ in range(READS_A_ROUND):
        try:
            piece = sock.recv(min(4096, room - read))  # never blocks: raises when none
        except (BlockingIOError, InterruptedError):
            return read, False
        except OSError:
            return read, True
        if not piece:
            return read, True
        read += len(piece)
        if read >= room:
            break
    return read, False


class _Probes:
    """Open connections, oldest first (accept order, so the first deadline is the nearest):
    those still sending their head, the /readyz probes waiting for the loop, and those
    answered, read until the client closes them (``LINGER``)."""

    def __init__(self, asks: int, stale_after: float) -> None:
        self.selector = selectors.DefaultSelector()
        self.heads: dict[socket.socket, tuple[float, bytearray]] = {}
        # deadline, method, path
        self.waiting: dict[socket.socket, tuple[float, bytes, bytes]] = {}
        self.lingering: dict[socket.socket, tuple[float, int]] = {}  # deadline, bytes read
        self.heard = Heard()
        self.asks = asks
        self.stale_after = stale_after

    def timeout(self) -> float | None:
        deadlines: list[float] = []
        if self.heads:
            deadlines.append(next(iter(self.heads.values()))[0])
        if self.waiting:
            deadlines.append(next(iter(self.waiting.values()))[0])
        if self.lingering:
            deadlines.append(next(iter(self.lingering.values()))[0])
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPTS_A_ROUND):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_DESCRIPTORS:
                    continue  # that connection failed; the next may not
                if not (self.end_oldest_lingering() or self.make_room()):
                    time.sleep(0.05)  # nothing to close: wait, do not spin
                return
            sock.setblocking(False)
            if len(self.heads) >= MAX_CONNECTIONS:
                self.make_room()
            self.heads[sock] = (time.monotonic() + HEAD_DEADLINE, bytearray())
            self.selector.register(sock, selectors.EVENT_READ)

    def make_room(self) -> bool:
        """Close the oldest connection still sending its head (answered first if its request
        has come meanwhile), else answer the oldest waiting /readyz; whether one went."""
        if self.heads:
            oldest = next(iter(self.heads))
            self.read(oldest)
            if oldest in self.heads:
                self.drop(oldest)
            return True
        if self.waiting:
            self._answer_oldest_waiting()
            return True
        return False

    def read(self, sock: socket.socket) -> None:
        if sock in self.lingering:
            self.discard(sock)
            return
        if sock not in self.heads:  # closed earlier in this round
            return
        try:
            piece = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            piece = b""
        if not piece:
            self.drop(sock)
            return
        buffer = self.heads[sock][1]
        searched = max(0, len(buffer) - 3)
        buffer += piece
        end = buffer.find(b"\r\n\r\n", searched)
        if end < 0:
            end = buffer.find(b"\n\n", searched)
        if end < 0 and len(buffer) <= HEAD_LIMIT:
            return
        self.forget(sock)
        if end < 0 or end > HEAD_LIMIT:
            self.reply(sock, 431, "request head too large\n")
        else:
            self.request(sock, bytes(buffer[:end]))

    def request(self, sock: socket.socket, head: bytes) -> None:
        parts = head.split(b"\n", 1)[0].rstrip(b"\r").split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self.reply(sock, 400, "bad request\n")
            return
        method, target = parts[0], parts[1]
        path = probed_path(method, target)
        now = time.monotonic()
        if path is not None and self.heard.ask(now):
            with contextlib.suppress(OSError):  # a full or broken pipe: the loop is behind
                os.write(self.asks, b"?")
        if path == READYZ or (path == HEALTHZ and self.heard.readiness is None):
            if len(self.waiting) >= MAX_CONNECTIONS:  # the oldest answers with what is known
                self._answer_oldest_waiting()
            self.waiting[sock] = (now + READY_WAIT, method, path)
            return
        self.respond(sock, method, target)

    def _answer_oldest_waiting(self) -> None:
        oldest = next(iter(self.waiting))
        _, method, path = self.waiting.pop(oldest)
        self.respond(oldest, method, path)

    def respond(self, sock: socket.socket, method: bytes, target: bytes) -> None:
        status, text = answer(method, target, self.heard, time.monotonic(), self.stale_after)
        self.reply(sock, status, text, head_only=method == b"HEAD")

    def reply(self, sock: socket.socket, status: int, text: str, head_only: bool = False
              ) -> None:
        _send_answer(sock, status, text, head_only)
        read, ended = _discard(sock, UNREAD_LIMIT)
        if ended or read >= UNREAD_LIMIT:
            sock.close()
            return
        if len(self.lingering) >= MAX_CONNECTIONS:
            self.end_oldest_lingering()
        self.lingering[sock] = (time.monotonic() + LINGER, read)
        try:
            self.selector.register(sock, selectors.EVENT_READ)
        except (KeyError, ValueError, OSError):  # cannot be watched: closed now instead
            self.drop(sock)

    def discard(self, sock: socket.socket) -> None:
        deadline, read = self.lingering[sock]
        more, ended = _discard(sock, UNREAD_LIMIT - read)
        if ended or read + more >= UNREAD_LIMIT:
            self.drop(sock)
        else:
            self.lingering[sock] = (deadline, read + more)

    def end_oldest_lingering(self) -> bool:
        if not self.lingering:
            return False
        self.drop(next(iter(self.lingering)))
        return True

    def hear(self, message: bytes) -> None:
        """The loop answered: every probe waiting gets its answer."""
        if self.heard.answered(message):
            while self.waiting:
                sock, (_, method, path) = self.waiting.popitem()
                self.respond(sock, method, path)

    def expire(self) -> None:
        now = time.monotonic()
        while self.heads:
            sock, (deadline, _) = next(iter(self.heads.items()))
            if deadline > now:
                break
            self.forget(sock)
            self.reply(sock, 408, "request head too slow\n")
        while self.waiting:
            sock, (deadline, method, path) = next(iter(self.waiting.items()))
            if deadline > now:
                break
            del self.waiting[sock]
            self.respond(sock, method, path)
        while self.lingering:
            sock, (deadline, _) = next(iter(self.lingering.items()))
            if deadline > now:
                break
            self.drop(sock)

    def forget(self, sock: socket.socket) -> None:
        self.heads.pop(sock, None)
        self.lingering.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(sock)

    def drop(self, sock: socket.socket) -> None:
        self.forget(sock)
        sock.close()


def serve(listener: socket.socket, asks: int, answers: int, stale_after: float) -> None:
    """Answer probes until the pipe ``answers`` ends."""
    probes = _Probes(asks, stale_after)
    listener.setblocking(False)
    os.set_blocking(asks, False)
    probes.selector.register(listener, selectors.EVENT_READ)
    probes.selector.register(answers, selectors.EVENT_READ)
    while True:
        for key, _ in probes.selector.select(probes.timeout()):
            if key.fileobj == answers:
                message = os.read(answers, 4096)
                if not message:
                    return
                probes.hear(message)
                continue
            try:
                if key.fileobj is listener:
                    probes.accept(listener)
                elif isinstance(key.fileobj, socket.socket):
                    probes.read(key.fileobj)
            except Exception:  # a bug one client found must not end the probes' answers
                if isinstance(key.fileobj, socket.socket) and key.fileobj is not listener:
                    probes.drop(key.fileobj)
        probes.expire()


def main(argv: list[str]) -> None:
    """``listener-fd asks-fd answers-fd stale-after-seconds``, as the proxy passes them."""
    # Ctrl-C reaches the whole process group: the proxy drains, then ends the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener_fd, asks, answers = (int(a) for a in argv[:3])
    serve(socket.socket(fileno=listener_fd), asks, answers, float(argv[3]))


if __name__ == "__main__":  # pragma: no cover - the proxy runs it through proxy.server.health
    main(sys.argv[1:])
