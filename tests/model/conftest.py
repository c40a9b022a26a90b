"""The real model server (llama.cpp with SmolLM2-135M, tests/model_server.py) per test module,
on a free loopback port, behind a recording relay."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, free_port, stop_process, wait_until_ready
from tests.model.relay import RecordingRelay

N_CTX = 1536


class ModelServer:
    def __init__(self, n_ctx: int = N_CTX) -> None:
        self.n_ctx = n_ctx
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkdtemp(prefix="tailfloor-model-")) / "server.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "model_server.py"), "--port", str(self.port),
             "--n-ctx", str(n_ctx)], stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self) -> None:
        wait_until_ready(self.proc, self.url + "/health", self.logs, "the model server",
                         seconds=60, pause=0.1)

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def tokenize(self, text: str) -> int:
        """The server's own token count of ``text``."""
        return len(self._post("/tokenize", {"content": text})["tokens"])

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        """The server's count of a chat request's prompt: its chat template applied, then
        tokenized with the special tokens (what its usage reports as prompt_tokens)."""
        prompt = self._post("/apply-template", {"messages": messages})["prompt"]
        return len(self._post("/tokenize", {"content": prompt, "add_special": True})["tokens"])

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@pytest.fixture(scope="module")
def model_server() -> Iterator[ModelServer]:
    server = ModelServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def relay(model_server: ModelServer) -> Iterator[RecordingRelay]:
    recording = RecordingRelay(model_server.url)
    yield recording
    recording.stop()
