"""Driving the real OpenClaw gateway (2026.9.6, node 24 from PyPI), installed by ``.ci/test``
under ``.ci-cache/openclaw``. A missing install fails the test that needs it with the command
to fix it, never a skip.

Turns go through the gateway's own OpenAI-compatible endpoint (``/v1/chat/completions`` on the
gateway port, the same agent run as ``openclaw agent``), one HTTP request a turn with the
session key in ``x-openclaw-session-key``: no CLI process per turn. Gateway methods without an
HTTP form (``sessions.reset``) go through ``openclaw gateway call``. Each agent of the gateway
has its own provider whose base URL is tailfloor's ``/agents/<id>/v1``, so one gateway runs the
default configuration and the one with affinity headers side by side.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.agents.pi_agent import ROOT, _node24
from tests.agents.snippets import provider, provider_shown, url_at
from tests.conftest import free_port

OPENCLAW_VERSION = "2026.9.6"
SNIPPET = "openclaw-provider.json"  # the README's provider: every agent's starts from it
ENTRY = ROOT / ".ci-cache/openclaw/node_modules/openclaw/openclaw.mjs"
TOKEN = "local-test-token"
# OpenClaw's fixed prompt (40 KB of system prompt, 10 KB of tools) is ~16k tokens by its
# estimate; 28000 leaves room for a few long turns before it compacts (captures README).
CONTEXT_WINDOW = 28000
# A key shaped like each vendor's (an Anthropic key must not look like an OAuth token).
KEYS = {"openai-completions": "sk-fake-local", "openai-responses": "sk-fake-local-responses",
        "anthropic-messages": "sk-ant-api03-fake-local"}


@dataclass(frozen=True)
class Agent:
    """One agent of the gateway: its id and whether its model sends affinity headers."""

    id: str
    affinity: bool = False


def _model(agent: Agent, model_id: str, reasoning: bool = False) -> dict[str, Any]:
    model: dict[str, Any] = {
        "id": model_id, "name": model_id, "reasoning": reasoning, "input": ["text"],
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        "contextWindow": CONTEXT_WINDOW, "maxTokens": 1024}
    if agent.affinity:
        model["compat"] = {"sendSessionAffinityHeaders": True}
    return model


def base_url(api: str, proxy_url: str, agent: str) -> str:
    """The provider ``baseUrl`` for ``api``: the README's, at ``proxy_url`` for ``agent``.
    OpenClaw's OpenAI SDKs append ``/chat/completions`` or ``/responses`` to it, its
    Anthropic SDK ``/v1/messages`` (so no ``/v1`` of its own)."""
    url = url_at(provider_shown(SNIPPET)["baseUrl"], proxy_url, agent)
    return url.removesuffix("/v1") if api == "anthropic-messages" else url


def _provider(agent: Agent, api: str, proxy_url: str,
              models: list[dict[str, Any]]) -> dict[str, Any]:
    """The README's provider for ``agent``, speaking ``api`` (the README shows chat
    completions; the dialect tests change only that)."""
    shown = provider_shown(SNIPPET)
    return {**provider(shown, base_url=base_url(api, proxy_url, agent.id), api_key=KEYS[api],
                       models=models), "api": api}


def config(port: int, proxy_url: str, workspace: Path, agents: list[Agent], *,
           idle_minutes: int = 0, models: tuple[str, ...] = (),
           api: str = "openai-completions", reasoning: bool = False) -> dict[str, Any]:
    """The gateway's openclaw.json: one provider per agent, reaching tailfloor through the
    agent's own path prefix, offering ``fake-model`` (every agent's own) and ``models``, in
    ``api`` (``openai-completions``, ``openai-responses``, ``anthropic-messages``)."""
    reset: dict[str, Any] = ({"mode": "idle", "idleMinutes": idle_minutes} if idle_minutes
                             else {"mode": "none"})
    return {
        "gateway": {"mode": "local", "port": port, "bind": "loopback",
                    "auth": {"mode": "token", "token": TOKEN},
                    "http": {"endpoints": {"chatCompletions": {"enabled": True}}}},
        "agents": {
            "defaults": {
                "model": {"primary": f"p-{agents[0].id}/fake-model"},
                "workspace": str(workspace),
                "compaction": {"mode": "default", "keepRecentTokens": 2000,
                               "memoryFlush": {"enabled": False}}},
            "list": [{"id": a.id, "default": i == 0,
                      "model": {"primary": f"p-{a.id}/fake-model"}}
                     for i, a in enumerate(agents)]},
        "models": {"mode": "merge", "providers": {
            f"p-{a.id}": _provider(a, api, proxy_url, [_model(a, m, reasoning)
                                                       for m in ("fake-model", *models)])
            for a in agents}},
        "session": {"reset": reset},
        "logging": {"file": str(workspace.parent / "openclaw.log")},
    }


TEMPLATES = ENTRY.parent / "docs/reference/templates"
# What a completed first run leaves in the workspace: the persona files from OpenClaw's own
# templates, an IDENTITY.md filled in, and the memory directory. BOOTSTRAP.md is absent, so
# OpenClaw records the setup as complete at start and never sends the file: its whole text
# (8.5 KB) rode in every system prompt until OpenClaw removed it mid-run, and the prompt
# shrank under the test's feet.
PERSONA_FILES = ("AGENTS.md", "SOUL.md", "USER.md")
IDENTITY = """# IDENTITY.md - Who Am I?

- **Name:** Testbot
- **Creature:** a test agent
- **Vibe:** terse
- **Emoji:** 🧪
"""


def bootstrapped_workspace(workspace: Path) -> None:
    """Fill ``workspace`` as OpenClaw leaves it after its bootstrap run."""
    workspace.mkdir(parents=True, exist_ok=True)
    for name in PERSONA_FILES:
        text = (TEMPLATES / name).read_text()
        if text.startswith("---\n"):  # front matter: OpenClaw strips it when it writes one
            text = text.split("\n---\n", 1)[1].lstrip()
        (workspace / name).write_text(text)
    (workspace / "IDENTITY.md").write_text(IDENTITY)
    (workspace / "memory").mkdir(exist_ok=True)


def workspace_files(workspace: Path) -> dict[str, int]:
    """Every file of the workspace (outside .git) with its size: what the prompt may hold."""
    return {str(p.relative_to(workspace)): p.stat().st_size for p in sorted(workspace.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(workspace).parts}


# Fixed places OpenClaw writes whatever HOME and TMPDIR say: its lock files and the directory
# of its default log (created at start even when logging.file points elsewhere).
FIXED_DIRS = (Path(f"/tmp/openclaw-state-locks-{os.getuid()}"), Path("/tmp/openclaw"))


class Gateway:
    """A running ``openclaw gateway`` with its own HOME (state in HOME/.openclaw) and log
    file. What appeared in OpenClaw's fixed /tmp directories while it ran is removed when it
    stops."""

    def __init__(self, home: Path, proxy_url: str, agents: list[Agent], *,
                 idle_minutes: int = 0, models: tuple[str, ...] = (),
                 api: str = "openai-completions", reasoning: bool = False) -> None:
        node = _node24()
        if not ENTRY.exists() or not Path(node).exists():
            raise RuntimeError(f"OpenClaw {OPENCLAW_VERSION} is not installed at {ENTRY} (or "
                               f"node 24 at {node}): run `bash .ci/test`, which installs it")
        self.home = home
        self.state = home / ".openclaw"
        self.state.mkdir(parents=True, exist_ok=True)
        self.workspace = home / "project"
        # The default agent works in the workspace itself, every other in a directory of its
        # own under it (OpenClaw seeds each on its first run).
        for i, agent in enumerate(agents):
            bootstrapped_workspace(self.workspace if i == 0 else self.workspace / agent.id)
        self.workspace_at_start = workspace_files(self.workspace)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.state / "openclaw.json").write_text(json.dumps(
            config(self.port, proxy_url, home / "project", agents, idle_minutes=idle_minutes,
                   models=models, api=api, reasoning=reasoning), indent=1))
        self.env = {**os.environ, "HOME": str(home),
                    "PATH": f"{Path(node).parent}:{os.environ.get('PATH', '')}",
                    "OPENCLAW_GATEWAY_TOKEN": TOKEN}
        self.node = node
        self._fixed_before = {d: set(d.iterdir()) if d.is_dir() else None for d in FIXED_DIRS}
        self.log_path = home / "gateway.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [node, str(ENTRY), "gateway", "run", "--port", str(self.port), "--bind", "loopback",
             "--auth", "token", "--token", TOKEN],
            cwd=home / "project", env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited early:\n{self.logs()[-4000:]}")
            try:
                request = urllib.request.Request(
                    self.url + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the gateway did not become ready:\n{self.logs()[-4000:]}")

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def turn(self, agent: str, key: str, text: str, model: str = "",
             timeout: float = 240) -> dict[str, Any]:
        """One user turn of session ``key`` (with ``model``, another of the agent's provider's
        models); the gateway's whole answer (an OpenAI completion, or its error body)."""
        body = json.dumps({"model": f"openclaw/{agent}",
                           "messages": [{"role": "user", "content": text}]}).encode()
        request = urllib.request.Request(
            self.url + "/v1/chat/completions", data=body, method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json",
                     "x-openclaw-session-key": key,
                     **({"x-openclaw-model": f"p-{agent}/{model}"} if model else {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer: dict[str, Any] = json.load(response)
        except urllib.error.HTTPError as error:
            answer = {"status": error.code, "error": error.read().decode(errors="replace")}
        return answer

    def call(self, method: str, params: dict[str, Any]) -> str:
        """A gateway RPC through the CLI (a node process of its own: seconds)."""
        done = subprocess.run(
            [self.node, str(ENTRY), "gateway", "call", method, "--params", json.dumps(params),
             "--json", "--url", f"ws://127.0.0.1:{self.port}", "--token", TOKEN],
            cwd=self.home / "project", env=self.env, capture_output=True, timeout=180, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"gateway call {method} failed: {done.stdout!r} {done.stderr!r}")
        return done.stdout.decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        ours = self._database_hashes()
        for directory, before in self._fixed_before.items():
            if not directory.is_dir():
                continue
            for path in set(directory.iterdir()) - (before or set()):
                # A lock file names the database it guards (the first 8 hex digits of the
                # SHA-256 of its real path, OpenClaw's state-database coordinator): one of
                # another test's gateway, running beside this one, is in use. Removing it
                # once made that gateway fail a turn ("another OpenClaw process owns
                # state-lifecycle").
                if directory == FIXED_DIRS[0] and not any(f".{h}." in path.name for h in ours):
                    continue
                path.unlink(missing_ok=True)
            if before is None and not any(directory.iterdir()):
                directory.rmdir()

    def _database_hashes(self) -> set[str]:
        return {hashlib.sha256(str(db.resolve()).encode()).hexdigest()[:8]
                for db in self.home.rglob("*.sqlite")}

    def session_id(self, agent: str, key: str) -> str:
        """The session id OpenClaw's store has for ``key`` now (read-only)."""
        db = sqlite3.connect(f"file:{self.state}/agents/{agent}/agent/openclaw-agent.sqlite"
                             "?mode=ro", uri=True, timeout=10)
        try:
            row = db.execute("SELECT current_session_id FROM session_nodes WHERE session_key=?",
                             (key,)).fetchone()
        finally:
            db.close()
        return str(row[0]) if row else ""
