"""Driving the real Pi coding agent (``@mariozechner/pi-coding-agent``) in print mode.

``.ci/test`` installs the pinned version under ``.ci-cache/pi``; ``PI_CLI`` points elsewhere.
A missing install fails the test that needs it with the command to fix it, never a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PI_VERSION = "0.73.1"
DEFAULT_CLI = ROOT / ".ci-cache/pi/node_modules/@mariozechner/pi-coding-agent/dist/cli.js"


def pi_cli() -> Path:
    cli = Path(os.environ.get("PI_CLI", DEFAULT_CLI))
    if not cli.exists() or shutil.which("node") is None:
        raise RuntimeError(
            f"the Pi agent is not installed at {cli} (or node is missing): run "
            f"`npm install --prefix .ci-cache/pi @mariozechner/pi-coding-agent@{PI_VERSION}` "
            "or `bash .ci/test`, which does it")
    return cli


@dataclass
class PiAgent:
    """One Pi installation home (models, settings) and one session directory."""

    home: Path
    base_url: str
    context_window: int = 6000
    max_tokens: int = 1024
    reserve_tokens: int = 1500
    keep_recent_tokens: int = 1200
    affinity_headers: bool = False

    def __post_init__(self) -> None:
        self.agent_dir = self.home / "agent"
        self.sessions = self.home / "sessions"
        self.work = self.home / "work"
        for directory in (self.agent_dir, self.sessions, self.work):
            directory.mkdir(parents=True, exist_ok=True)
        (self.work / "README.md").write_text("# a project\n")
        model: dict[str, object] = {
            "id": "fake-model", "name": "Fake Model", "reasoning": False, "input": ["text"],
            "contextWindow": self.context_window, "maxTokens": self.max_tokens,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}
        if self.affinity_headers:
            model["compat"] = {"sendSessionAffinityHeaders": True}
        (self.agent_dir / "models.json").write_text(json.dumps({"providers": {"fakeup": {
            "baseUrl": self.base_url, "api": "openai-completions", "apiKey": "sk-fake-local",
            "models": [model]}}}))
        (self.agent_dir / "settings.json").write_text(json.dumps({
            "defaultProvider": "fakeup", "defaultModel": "fake-model", "quietStartup": True,
            "enableInstallTelemetry": False,
            "compaction": {"enabled": True, "reserveTokens": self.reserve_tokens,
                           "keepRecentTokens": self.keep_recent_tokens},
            "retry": {"enabled": True, "maxRetries": 1, "baseDelayMs": 200}}))

    def turn(self, message: str, *, new_session: bool = False, timeout: float = 60) -> str:
        """One prompt in print mode; continues the newest session unless ``new_session``."""
        argv = ["node", str(pi_cli()), "--session-dir", str(self.sessions)]
        if not new_session and any(self.sessions.glob("*.jsonl")):
            argv.append("-c")
        argv += ["-p", message]
        env = {**os.environ, "PI_CODING_AGENT_DIR": str(self.agent_dir), "PI_OFFLINE": "1"}
        result = subprocess.run(argv, cwd=self.work, env=env, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"pi exited {result.returncode}: {result.stderr[-2000:]}")
        return result.stdout

    def session_files(self) -> list[Path]:
        return sorted(self.sessions.glob("*.jsonl"))

    def entries(self, path: Path | None = None) -> list[dict[str, object]]:
        target = path or self.session_files()[-1]
        return [json.loads(line) for line in target.read_text().splitlines() if line.strip()]
