"""A tiny OpenAI-compatible upstream using only the standard library.

The deployment tests run it on the loopback and, unchanged, inside a container built from a
bare Debian base (no aiohttp there), so it cannot use the project's dependencies. The model
name scripts the answer:

- ``fail-500``: a 500 OpenAI-shaped error;
- ``break-stream``: a streamed answer whose connection is cut after the first event;
- ``no-usage``: an answer without a usage object;
- ``slow-stream``: a streamed answer with 0.2 s between events (for client disconnects);
- anything else: a short answer with usage (prompt, completion, cached and reasoning tokens).

Run: ``python3 fake_openai.py --host 127.0.0.1 --port 18181``.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
         "prompt_tokens_details": {"cached_tokens": 4},
         "completion_tokens_details": {"reasoning_tokens": 2}}
WORDS = ["Hello", " from", " the", " fake", " upstream."]


def completion(model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "".join(WORDS)}}]}
    if model != "no-usage":
        body["usage"] = USAGE
    return body


def chunk(model: str, delta: dict[str, Any], finish: str | None = None,
          usage: dict[str, Any] | None = None, choices: bool = True) -> bytes:
    body: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                            "created": int(time.time()), "model": model,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
                            if choices else []}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read the proxy's logs, not these."""

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [
                {"id": "fake-model", "object": "model", "owned_by": "tests"}]})
        else:
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error",
                                       "code": None}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        model = str(request.get("model", "fake-model"))
        if model == "fail-500":
            self._json(500, {"error": {"message": "scripted failure", "type": "server_error",
                                       "code": None}})
        elif request.get("stream"):
            self._stream(model, request)
        else:
            self._json(200, completion(model))

    def _stream(self, model: str, request: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [chunk(model, {"role": "assistant", "content": ""})]
        events += [chunk(model, {"content": w}) for w in WORDS]
        events.append(chunk(model, {}, finish="stop"))
        wants_usage = (request.get("stream_options") or {}).get("include_usage")
        if wants_usage and model != "no-usage":
            events.append(chunk(model, {}, usage=USAGE, choices=False))
        events.append(b"data: [DONE]\n\n")
        try:
            for index, event in enumerate(events):
                if model == "slow-stream" and index:
                    time.sleep(0.2)
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
                if model == "break-stream" and index == 1:
                    self.close_connection = True
                    return
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            # The proxy cancelled the request because its client went away.
            self.close_connection = True


def serve(host: str, port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18181)
    ns = parser.parse_args()
    server = serve(ns.host, ns.port)
    print(f"fake upstream on http://{ns.host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
