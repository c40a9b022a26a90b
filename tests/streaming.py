"""A streamed chat request sent in a thread of its own, for tests that do something to the
proxy (a signal, a probe) while the stream is in flight."""

from __future__ import annotations

import http.client
import threading

STREAM_CHAT = b'{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def stream_in_background(port: int) -> tuple[threading.Thread, dict[str, bytes]]:
    """The started thread, and where its whole answer lands (``body``) once read."""
    result: dict[str, bytes] = {}

    def stream() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/v1/chat/completions", body=STREAM_CHAT)
        result["body"] = connection.getresponse().read()

    worker = threading.Thread(target=stream)
    worker.start()
    return worker, result
