"""A minimal HTTP/1.1 load generator on raw asyncio streams, so the client's own cost is small
and identical for every target it measures."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import orjson

BODY = orjson.dumps({"model": "fake-model", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say hello."}]})
STREAM_BODY = orjson.dumps({"model": "fake-model", "stream": True,
                            "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": "stream please"}]})


# One key for every target: the fake upstream ignores it, LiteLLM's proxy requires its master key.
API_KEY = "sk-" + "7" * 48


CHAT_PATH = b"/v1/chat/completions"
# The same conversation in the other two dialects tailfloor translates.
RESPONSES_BODY = orjson.dumps({"model": "fake-model", "input": [
    {"role": "developer", "content": "You are a helpful assistant."},
    {"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}]})
MESSAGES_BODY = orjson.dumps({"model": "fake-model", "max_tokens": 64,
                              "system": "You are a helpful assistant.", "messages": [
                                  {"role": "user", "content": [
                                      {"type": "text", "text": "Say hello."}]}]})


def _agent_body() -> bytes:
    """A request of an agent's size, made up with the sizes of a captured OpenClaw 2026.9
    request: a 40 KB system prompt, 12 tools (11 KB of schemas), a user turn with OpenClaw's
    time prefix, one tool call and its result."""
    rules = "\n".join(f"{n}. When the task touches area {n}, read its notes first, keep the "
                      f"change small, and say what was checked before finishing." for n in
                      range(1, 420))
    tools = [{"type": "function", "function": {
        "name": f"tool_{n}", "description": f"Tool {n}: " + "does one careful thing. " * 14,
        "parameters": {"type": "object", "required": ["path"], "properties": {
            name: {"type": "string", "description": f"The {name} this call works on."}
            for name in ("path", "pattern", "content", "mode", "cwd", "limit")}}}}
        for n in range(12)]
    return orjson.dumps({"model": "fake-model", "stream": False, "tools": tools, "messages": [
        {"role": "system", "content": "You are a personal assistant running inside an agent "
                                      "runtime.\n" + rules[:40_000]},
        {"role": "user", "content": "[Mon 2026-11-30 02:27 UTC] List the files, then say hi."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0a1b2c3d4e5f", "type": "function",
             "function": {"name": "tool_1", "arguments": '{"path": "."}'}}]},
        {"role": "tool", "tool_call_id": "call_0a1b2c3d4e5f",
         "content": "\n".join(f"file_{n}.txt" for n in range(200))},
        {"role": "user", "content": "[Mon 2026-11-30 02:28 UTC] Thanks. Now say hello."}]})


AGENT_BODY = _agent_body()
ROUTES = {"chat_completions": (CHAT_PATH, BODY), "responses": (b"/v1/responses", RESPONSES_BODY),
          "messages": (b"/v1/messages", MESSAGES_BODY),
          "agent_sized_chat": (CHAT_PATH, AGENT_BODY)}


def request_bytes(body: bytes, headers: bytes = b"", path: bytes = CHAT_PATH) -> bytes:
    """One request; ``headers`` are extra header lines, each ending in CRLF."""
    return (b"POST " + path + b" HTTP/1.1\r\nHost: bench\r\n"
            b"Content-Type: application/json\r\nAuthorization: Bearer " + API_KEY.encode() +
            b"\r\n" + headers +
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, round(pct / 100 * (len(sorted_values) - 1)))
    return sorted_values[index]


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = -1
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        lowered = name.strip().lower()
        if lowered == b"content-length":
            length = int(value)
        elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return await reader.readexactly(length)
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def measure_latency(port: int, body: bytes, concurrency: int, total: int, *,
                          headers: bytes = b"", seconds: float | None = None,
                          path: bytes = CHAT_PATH) -> list[float]:
    """``total`` requests on ``concurrency`` connections, back to back (or fewer if
    ``seconds`` runs out first); the latency of each."""
    payload = request_bytes(body, headers, path)
    latencies: list[float] = []
    deadline = None if seconds is None else time.perf_counter() + seconds

    async def worker(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        clock = time.perf_counter
        for _ in range(count):
            if deadline is not None and clock() > deadline:
                break
            started = clock()
            writer.write(payload)
            try:
                await _read_response(reader)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise
                # The server closed a kept-alive connection between two requests (its cap
                # of requests per connection): the next connection, not a measurement.
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                continue
            latencies.append(clock() - started)
        writer.close()

    await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
    return latencies


async def measure_throughput(port: int, body: bytes, concurrency: int, seconds: float,
                             headers: bytes = b"") -> tuple[float, int]:
    """Completed requests per second, and how many connections the target dropped."""
    payload = request_bytes(body, headers)
    done = 0
    dropped = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, dropped
        while time.perf_counter() < deadline:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                while time.perf_counter() < deadline:
                    writer.write(payload)
                    await _read_response(reader)
                    done += 1
            except (asyncio.IncompleteReadError, ConnectionError):
                dropped += 1
            finally:
                writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started), dropped


@dataclass
class StreamResult:
    first_chunk: float = 0.0
    chunk_delays: list[float] = field(default_factory=list)
    events: int = 0
    merged_reads: int = 0
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    text: str = ""  # the content deltas that were not time stamps, joined
    error_events: int = 0  # events that carry an "error" (an answer cut off says so)


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status code and headers (names lowered; a repeated one keeps the last value)."""
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def measure_stream(port: int, body: bytes = STREAM_BODY, headers: bytes = b"",
                         ) -> StreamResult:
    """One streaming request; each event carries the time the upstream wrote it (a content
    delta that is not a number is kept in ``text``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    result = StreamResult()
    started = time.perf_counter()
    writer.write(request_bytes(body, headers))
    result.status, result.headers = parse_head(await reader.readuntil(b"\r\n\r\n"))
    if "chunked" not in result.headers.get("transfer-encoding", "").lower():
        # An error answer (or a peer that does not stream): read it whole, count no event.
        length = int(result.headers.get("content-length", "0") or 0)
        result.text = (await reader.readexactly(length)).decode(errors="replace")
        writer.close()
        return result
    texts: list[str] = []
    buffer = b""
    pending = b""
    done = False
    while not done:
        data = await reader.read(65536)
        if not data:
            break
        now_wall = time.time()
        if not result.first_chunk:
            result.first_chunk = time.perf_counter() - started
        buffer += data
        events_in_read = 0
        # Undo chunked framing as far as it is complete.
        while True:
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                break
            size = int(buffer[:line_end].split(b";")[0], 16)
            if len(buffer) < line_end + 2 + size + 2:
                break
            pending += buffer[line_end + 2:line_end + 2 + size]
            buffer = buffer[line_end + 2 + size + 2:]
            if size == 0:
                done = True
                break
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            events_in_read += 1
            result.events += 1
            if event.startswith(b"data: {"):
                try:
                    parsed = orjson.loads(event[6:])
                except orjson.JSONDecodeError:  # an event cut off by the upstream, then ended
                    continue
                if "error" in parsed:
                    result.error_events += 1
                for choice in parsed.get("choices") or []:
                    stamp = (choice.get("delta") or {}).get("content")
                    if stamp:
                        try:
                            result.chunk_delays.append(now_wall - float(stamp))
                        except ValueError:
                            texts.append(stamp)
        if events_in_read > 1:
            result.merged_reads += 1
    writer.close()
    result.text = "".join(texts)
    return result
