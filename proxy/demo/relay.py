"""A recording relay between tailfloor and the local model: what the model received, for the
demo to show. Standard library only (a thread per request), loopback only, one answer read
whole before it is passed on: the demo sends no streaming requests."""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Received", "Relay"]

_HOP = frozenset({"content-length", "transfer-encoding", "connection", "host"})


@dataclass(frozen=True, slots=True)
class Received:
    path: str
    body: bytes
    status: int
    answer: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def error_message(self) -> str | None:
        """The model server's own error text, when it refused the request."""
        if self.status < 400:
            return None
        try:
            error = json.loads(self.answer).get("error") or {}
        except ValueError:
            return self.answer[:200].decode(errors="replace")
        return f"{error.get('type')}: {error.get('message')}"


class Relay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.received: list[Received] = []
        self._lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                relay._forward(self, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                relay._forward(self, self.rfile.read(length))

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the demo prints what matters itself

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
        upstream = http.client.HTTPConnection("127.0.0.1", self.target_port, timeout=600)
        try:
            upstream.request(handler.command, handler.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            answer = response.read()
            if handler.path.endswith("/chat/completions"):
                # recorded before the answer leaves: the client may look right after
                with self._lock:
                    self.received.append(Received(handler.path, body, response.status, answer))
            handler.send_response(response.status)
            for name, value in response.getheaders():
                if name.lower() not in _HOP:
                    handler.send_header(name, value)
            handler.send_header("Content-Length", str(len(answer)))
            handler.end_headers()
            handler.wfile.write(answer)
        finally:
            upstream.close()

    def take(self) -> list[Received]:
        """The chat requests received since the last call."""
        with self._lock:
            taken, self.received = self.received, []
        return taken

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
