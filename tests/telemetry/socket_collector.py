"""A collector made of a listening socket and one thread, for the tests that need an answer
no HTTP server library gives (a dribble, a hold on a kept-alive connection): a subclass
answers each accepted connection in ``answer``."""

from __future__ import annotations

import socket
import threading


class SocketCollector:
    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}/v1/traces"
        self.accepted = threading.Event()
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def answer(self, client: socket.socket) -> None:
        """Answer one accepted connection (closed after)."""
        raise NotImplementedError

    def stopped(self, seconds: float) -> bool:
        """Wait ``seconds``; True once the collector is closing."""
        return self._stop.wait(seconds)

    def _serve(self) -> None:
        self._server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            self.accepted.set()
            with client:
                try:
                    self.answer(client)
                except OSError:  # the client went away: the next connection
                    continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()
