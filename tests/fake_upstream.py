"""A scripted OpenAI-compatible upstream for tests and benchmarks (loopback only).

It speaks chat completions (``/v1/chat/completions``) and, from the same script, the OpenAI
Responses and Anthropic Messages dialects (``/v1/responses``, ``/v1/messages``; see
``fake_dialects``).

It records every request it receives and answers from a script: tests push ``Reply`` objects
onto ``FakeUpstream.script``; with the script empty it answers a short text, or a tool call
when the latest user text says ``USE_TOOL``. It also runs standalone
(``python tests/fake_upstream.py --port 18181``) and then takes its script over HTTP:
``POST /_control/script`` with a JSON list of replies (``?replace=1``: instead of what is
queued), ``GET /_control/log``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
from aiohttp import web

try:
    from tests import fake_behaviour as fb
    from tests import fake_dialects as fd
    from tests.fake_chat import _completion, _sse_chunks
except ModuleNotFoundError:  # run as a script: python tests/fake_upstream.py
    import fake_behaviour as fb  # type: ignore[no-redef,import-not-found,unused-ignore]
    import fake_dialects as fd  # type: ignore[no-redef,import-not-found,unused-ignore]
    from fake_chat import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        _completion,
        _sse_chunks,
    )


@dataclass
class Reply:
    """One scripted answer. ``chunks`` overrides the generated SSE events when given; with
    an error ``status`` (chat route), they are the error body, written as they come.

    ``usage`` is in the chat shape (converted for the other dialects) or a dialect's own;
    ``finish="length"`` is the output cap (``length``, Responses ``incomplete`` with
    ``max_output_tokens``, Anthropic ``max_tokens``); ``reasoning`` adds a Responses reasoning
    item or an Anthropic thinking block; ``stream_error`` (dialects only) ends the stream with
    the dialect's error event after the text (Responses: ``response.failed``, or ``error`` with
    ``stream_error_event="error"``)."""

    status: int = 200
    text: str = "Hello from the fake upstream."
    error: dict[str, Any] | None = None
    raw_body: bytes | None = None
    tool_call: dict[str, Any] | None = None
    usage: dict[str, Any] | None = field(default_factory=lambda: {
        "prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 2}})
    chunks: list[bytes] | None = None
    delay_before_headers: float = 0.0
    delay_between_chunks: float = 0.0
    close_after_chunks: int | None = None
    usage_in_every_chunk_null: bool = True
    pieces: int = 3
    # Replace "__TS__" in each event with the wall-clock time it is written (benchmarks).
    stamp: bool = False
    finish: str | None = None
    reasoning: str | None = None
    stream_error: dict[str, Any] | None = None
    stream_error_event: str = "response.failed"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reply:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if isinstance(known.get("raw_body"), str):
            known["raw_body"] = known["raw_body"].encode()
        if "chunks" in known and known["chunks"] is not None:
            known["chunks"] = [c.encode() for c in known["chunks"]]
        return cls(**known)


@dataclass
class Received:
    """One request as the fake parsed it; every request parsed on a connection is one."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    disconnected: bool = False
    completed: bool = False
    raw_path: str = ""  # the request target exactly as it arrived
    peer: int = 0  # the client port: requests with the same peer shared a connection
    at: float = 0.0  # wall-clock time the whole request had arrived

    def json(self) -> Any:
        return orjson.loads(self.body)


class FakeUpstream:
    def __init__(self) -> None:
        self.script: deque[Reply] = deque()
        self.received: list[Received] = []
        self.reject_stream_options = False
        # None: fixed replies. Set it to act enough like a model to drive a real agent.
        self.behaviour: fb.AgentBehaviour | None = None
        # Benchmarks that send millions of bytes of hostile bodies: keep the last requests
        # only, without large bodies, and answer whatever JSON came (only its ``stream``
        # read), never a 500 of the fake's own.
        self.lenient = False
        self._calls = 0
        self._replies = 0
        self._answers = 0
        # Real models' tool-call ids are random: ids that repeat across runs would tie one
        # run's requests to another run's sessions (a tool-call id is strong evidence).
        self._salt = os.urandom(4).hex()
        # Bodies are recorded as they arrived (compressed ones too): what a proxy really sent.
        self.app = web.Application(client_max_size=256 * 1024 * 1024,
                                   handler_args={"auto_decompress": False})
        self.app.router.add_post("/_control/script", self._control_script)
        self.app.router.add_get("/_control/log", self._control_log)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner: web.AppRunner | None = None
        self.port = 0
        # The same server on a UNIX socket: what an in-process tailfloor's transport seam
        # connects to (tests/inprocess.py), no TCP port involved.
        self._socket_dir = tempfile.mkdtemp(prefix="fake-upstream-")
        self.unix_path = os.path.join(self._socket_dir, "upstream.sock")

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        await web.UnixSite(self._runner, self.unix_path).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.script.clear()
        self.received.clear()
        self.reject_stream_options = False
        self.behaviour = None
        self._calls = self._replies = self._answers = 0
        self._salt = os.urandom(4).hex()

    def chat_requests(self) -> list[Received]:
        return [r for r in self.received if r.path.endswith("/chat/completions")]

    def dialect_requests(self, dialect: str) -> list[Received]:
        """The requests of ``fd.RESPONSES`` or ``fd.MESSAGES``."""
        return [r for r in self.received if fd.dialect_of(r.path) == dialect]

    async def _control_script(self, request: web.Request) -> web.Response:
        if request.query.get("replace"):
            self.script.clear()  # what an earlier step left unused
        self.script.extend(Reply.from_json(item) for item in await request.json())
        return web.json_response({"queued": len(self.script)})

    async def _control_log(self, request: web.Request) -> web.Response:
        return web.json_response([
            {**asdict(r), "body": r.body.decode("utf-8", "replace")} for r in self.received])

    async def _models(self, request: web.Request) -> web.Response:
        self._record(request, b"").completed = True
        return web.json_response({"object": "list", "data": [
            {"id": "fake-model", "object": "model", "created": 0, "owned_by": "tests"}]})

    def _record(self, request: web.Request, body: bytes) -> Received:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if self.lenient:
            del self.received[:-100]
            body = body if len(body) <= 65536 else b""
        received = Received(request.method, request.path, request.query_string,
                            dict(request.headers), body, raw_path=request.raw_path,
                            peer=peer[1] if peer else 0, at=time.time())
        self.received.append(received)
        return received

    async def _any(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        received = self._record(request, body)
        try:
            delay = request.query.get("fake_delay_ms", "")
            if delay.isdigit():
                await asyncio.sleep(int(delay) / 1000)
            dialect = fd.dialect_of(request.path)
            if dialect is not None:
                response = await self._dialect(request, received, dialect, body)
                received.completed = True
                return response
            if not request.path.endswith("/chat/completions"):
                received.completed = True
                return web.json_response({"path": request.path, "echo": body.decode("utf-8",
                                                                                   "replace")})
            response = await self._chat(request, received, body)
            received.completed = True
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            received.disconnected = True
            raise

    def _payload(self, body: bytes) -> Any:
        payload = orjson.loads(body)
        if not self.lenient:
            return payload
        stream = isinstance(payload, dict) and payload.get("stream") is True
        return {"model": "fake-model", "stream": stream,
                "stream_options": {"include_usage": True}}

    async def _chat(self, request: web.Request, received: Received, body: bytes
                    ) -> web.StreamResponse:
        payload = self._payload(body)
        if self.reject_stream_options and "stream_options" in payload:
            return web.json_response({"error": {
                "message": "Unrecognized request argument supplied: stream_options",
                "type": "invalid_request_error", "param": "stream_options", "code": None}},
                status=400)
        reply = self.script.popleft() if self.script else self._default_reply(payload)
        if reply.delay_before_headers:
            await asyncio.sleep(reply.delay_before_headers)
        if reply.status != 200 and reply.chunks is not None:  # an error body, dribbled
            return await self._stream(request, reply, reply.chunks, status=reply.status,
                                      content_type="application/json")
        if reply.raw_body is not None or reply.error is not None or reply.status != 200:
            body = reply.raw_body if reply.raw_body is not None else orjson.dumps(
                {"error": reply.error or {"message": "scripted failure", "type": "server_error"}})
            return web.Response(body=body, status=reply.status, content_type="application/json")
        model = payload.get("model", "fake-model")
        if not payload.get("stream"):
            return web.Response(body=orjson.dumps(_completion(model, reply)),
                                content_type="application/json")
        options = payload.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        chunks = reply.chunks if reply.chunks is not None else _sse_chunks(
            model, reply, include_usage)
        return await self._stream(request, reply, chunks)

    async def _dialect(self, request: web.Request, received: Received, dialect: str,
                       body: bytes) -> web.StreamResponse:
        payload = self._payload(body)
        reply = self.script.popleft() if self.script else self._default_reply(
            fd.chat_view(payload, dialect))
        if reply.delay_before_headers:
            await asyncio.sleep(reply.delay_before_headers)
        if reply.raw_body is not None or reply.error is not None or reply.status != 200:
            body = reply.raw_body if reply.raw_body is not None else orjson.dumps(
                fd.error_body(dialect, reply.error, reply.status))
            return web.Response(body=body, status=reply.status, content_type="application/json")
        self._answers += 1
        ident = f"fake_{self._answers}_{self._salt}"
        if not payload.get("stream"):
            return web.Response(body=orjson.dumps(fd.final_body(dialect, payload, reply, ident)),
                                content_type="application/json")
        chunks = reply.chunks if reply.chunks is not None else fd.events(
            dialect, payload, reply, ident)
        return await self._stream(request, reply, chunks)

    async def _stream(self, request: web.Request, reply: Reply, chunks: list[bytes], *,
                      status: int = 200, content_type: str = "text/event-stream"
                      ) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={
            "Content-Type": content_type, "Cache-Control": "no-cache"})
        await response.prepare(request)
        for index, chunk in enumerate(chunks):
            if reply.close_after_chunks is not None and index >= reply.close_after_chunks:
                assert request.transport is not None
                request.transport.close()
                return response
            if reply.delay_between_chunks and index:
                await asyncio.sleep(reply.delay_between_chunks)
            stamped = chunk.replace(b"__TS__", b"%.6f" % time.time()) if reply.stamp else chunk
            await response.write(stamped)
        await response.write_eof()
        return response

    def _overflow(self, payload: dict[str, Any], messages: list[dict[str, Any]],
                  summarizing: bool) -> Reply | None:
        """The context-length error the behaviour calls for, if any."""
        behaviour = self.behaviour
        if behaviour is None:
            return None
        words = dict(behaviour.overflow_windows)
        if behaviour.overflow_word:
            words.setdefault(behaviour.overflow_word, behaviour.window_tokens)
        turn = fb.current_turn_text(messages) if words and not summarizing else ""
        for word, window in words.items():
            if word in turn:
                size = fb.size_usage(payload, "")["prompt_tokens"]
                if size > window:
                    return Reply(status=400, error=fb.overflow_error(
                        fb.total_chars(messages), window, size))
        if behaviour.max_chars and (not summarizing or behaviour.strict):
            chars = fb.total_chars(messages)
            if chars > behaviour.max_chars:
                size = fb.size_usage(payload, "")["prompt_tokens"]
                return Reply(status=400, error=fb.overflow_error(
                    chars, behaviour.window_tokens, size))
        return None

    def _default_reply(self, payload: dict[str, Any]) -> Reply:
        messages = payload.get("messages") or []
        last = messages[-1] if messages else {}
        sized = self.behaviour is not None
        summarizing = fb.is_summarization(messages)
        overflow = self._overflow(payload, messages, summarizing)
        if overflow is not None:
            return overflow
        if (payload.get("max_completion_tokens") or payload.get("max_tokens")) == 1:
            reply = Reply(text="O")  # a cache-warming request: one token, then the cap
        elif summarizing:
            # A real model's summary is its own for each conversation: the digest of what it
            # summarized makes the fake's so too (two sessions never share one).
            digest = hashlib.blake2b(orjson.dumps(messages), digest_size=6).hexdigest()
            reply = Reply(text=f"{fb.SUMMARY_TEXT}\n(digest {digest})",
                          delay_before_headers=self.behaviour.summary_delay
                          if self.behaviour is not None else 0.0)
        elif last.get("role") == "tool":
            reply = Reply(text=f"The tool returned: {fb.text_of(last.get('content'))[:200]}")
        elif "USE_TOOL" in (turn := fb.current_turn_text(messages)):
            named = re.search(r"USE_TOOL:(\w+)", turn)
            offered = [t.get("function", {}).get("name") for t in payload.get("tools") or []]
            name = named.group(1) if named else (offered[0] if offered else "bash")
            self._calls += 1
            reply = Reply(text="", tool_call={"id": f"call_fake_{self._calls}_{self._salt}",
                                              "name": name,
                                              "arguments": fb.tool_arguments(
                                                  name, "BIG_OUTPUT" in turn)})
        elif "LONG_REPLY" in turn:
            reply = Reply(text=fb.LONG_TEXT)
        else:
            self._replies += 1
            reply = Reply(text=f"Fake reply #{self._replies}: Hello from the fake upstream."
                          if sized else "Hello from the fake upstream.")
        if sized:
            reply.usage = fb.size_usage(payload, reply.text)
        if self.behaviour is not None and self.behaviour.reasoning:
            reply.reasoning = f"Thinking about the request ({self._calls + self._replies})."
        return reply


async def _main(port: int, agent: bool, max_chars: int, lenient: bool = False) -> None:
    fake = FakeUpstream()
    fake.lenient = lenient
    if agent:
        fake.behaviour = fb.AgentBehaviour(max_chars=max_chars)
    await fake.start(port=port)
    print(f"fake upstream on {fake.url}", flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=18181)
    parser.add_argument("--agent", action="store_true",
                        help="act enough like a model to drive a real agent (see fake_behaviour)")
    parser.add_argument("--max-chars", type=int, default=0,
                        help="with --agent: answer context_length_exceeded above this size")
    parser.add_argument("--lenient", action="store_true",
                        help="answer any JSON, keep only the last requests (benchmarks)")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.port, args.agent, args.max_chars, args.lenient))
