"""A stand-in agent for the pod test (standard library only, runs in a bare Debian image).

Like a real agent it writes a session transcript into its state directory and calls its model
through ``OPENAI_BASE_URL``, which the chart points at the tailfloor sidecar on 127.0.0.1.
It prints one ``AGENT-RESULT {json}`` line, then stays up like a long-running agent.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def call(url: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", "Authorization": "Bearer sk-agent"})
    with urllib.request.urlopen(request, timeout=10) as response:
        status: int = response.status
        return status, response.read()


def main() -> None:
    base = os.environ["OPENAI_BASE_URL"]
    state = Path(os.environ.get("AGENT_STATE_DIR", "/state"))
    sessions = state / "agents" / "main" / "sessions"
    result: dict[str, Any] = {"base_url": base}
    try:
        sessions.mkdir(parents=True, exist_ok=True)
        (sessions / "s1.jsonl").write_text(json.dumps(
            {"type": "session", "version": 3, "id": "s1", "timestamp": "2026-01-01T00:00:00Z",
             "cwd": "/"}) + "\n")
        result["transcript"] = str(sessions / "s1.jsonl")
    except OSError as exc:
        result["transcript_error"] = repr(exc)
    # A database in WAL mode, like OpenClaw 2026.9's, closed again: SQLite then removes the
    # -wal and -shm files, and the next reader has to create them.
    database = state / "wal-check.sqlite"
    connection = sqlite3.connect(database)
    connection.execute("pragma journal_mode=wal")
    connection.execute("create table if not exists transcript_events (seq, event_json)")
    connection.execute("insert into transcript_events values (1, '{}')")
    connection.commit()
    connection.close()
    result["wal_database"] = str(database)
    messages = [{"role": "user", "content": "hello from the agent"}]
    for attempt in range(100):
        try:
            status, body = call(base + "/chat/completions",
                                {"model": "fake-model", "messages": messages})
            result.update(status=status, answer=json.loads(body), attempts=attempt + 1)
            status, body = call(base + "/chat/completions",
                                {"model": "fake-model", "messages": messages, "stream": True})
            result["stream_events"] = body.count(b"data: ")
            result["stream_done"] = body.rstrip().endswith(b"data: [DONE]")
            break
        except (urllib.error.URLError, ConnectionError) as exc:
            result["last_error"] = repr(exc)
            time.sleep(0.2)
    print("AGENT-RESULT " + json.dumps(result), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
