"""The sidecar pod for real: build the image, render the chart's sidecar Deployment, run it with
``podman kube play`` beside a fake agent and a fake upstream, and talk through the sidecar."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.deploy import live
from tests.deploy.podman import (
    BASE_IMAGE,
    IMAGE,
    build_image,
    ensure_base_image,
    environment,
    podman,
)
from tests.deploy.tools import CHART, env_of, find_tool, run

HERE = Path(__file__).parent
UPSTREAM_PORT = 18181


def values(scripts: Path, state: Path, host_port: int) -> dict[str, Any]:
    repo, tag = IMAGE.rsplit(":", 1)
    base_repo, base_tag = BASE_IMAGE.rsplit(":", 1)
    scripts_mount = {"name": "scripts", "mountPath": "/scripts", "readOnly": True}
    return {
        "mode": "sidecar",
        "tailfloor": {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "upstream": f"http://127.0.0.1:{UPSTREAM_PORT}",
            "hostPort": host_port, "hostIP": "127.0.0.1",
            "logFormat": "text",
            "rules": {"files": {"policy.toml": "[defaults]\nmin_tail_messages = 12\n"}},
        },
        "agent": {
            "name": "agent",
            "image": {"repository": base_repo, "tag": base_tag, "pullPolicy": "Never"},
            "command": ["/usr/bin/python3", "/scripts/fake_agent.py"],
            "baseUrlEnv": "OPENAI_BASE_URL",
            "env": [{"name": "AGENT_STATE_DIR", "value": "/state"}],
            "stateVolume": {"name": "agent-state", "mountPath": "/state",
                            "volume": {"hostPath": {"path": str(state), "type": "Directory"}}},
            "extraVolumeMounts": [scripts_mount],
        },
        # The project's fake upstream needs aiohttp and orjson: the tailfloor image has both.
        "extraContainers": [{
            "name": "upstream",
            "image": IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/opt/tailfloor/bin/python", "-m", "tests.fake_upstream",
                        "--port", str(UPSTREAM_PORT)],
            "workingDir": "/scripts",
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}},
            # The agent's volume mounted read-only, to show why tailfloor's mount is not.
            "volumeMounts": [scripts_mount, {"name": "agent-state", "mountPath": "/state-ro",
                                             "readOnly": True}],
        }],
        "extraVolumes": [{"name": "scripts",
                          "hostPath": {"path": str(scripts), "type": "Directory"}}],
    }


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("pod")
    timings: dict[str, float] = {}
    started = time.monotonic()
    find_tool("podman")
    timings.update(ensure_base_image())
    timings["build"] = build_image()

    scripts = tmp / "scripts"
    scripts.mkdir()
    shutil.copy(HERE / "fake_agent.py", scripts / "fake_agent.py")
    (scripts / "tests").mkdir()
    # The fake upstream and every module it imports (its dialects among them).
    for source in [HERE.parent / "__init__.py", *sorted(HERE.parent.glob("fake_*.py"))]:
        shutil.copy(source, scripts / "tests" / source.name)
    for path in scripts.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    state = tmp / "state"
    state.mkdir()
    # The pod runs as uid 10001; a hostPath keeps the host's ownership.
    os.chmod(state, 0o777)
    scripts.chmod(0o755)

    host_port = live.free_port()
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(values(scripts, state, host_port)))
    release = f"pt{os.getpid()}"
    rendered = run([find_tool("helm"), "template", release, str(CHART), "-f", str(values_file),
                    "--show-only", "templates/configmaps.yaml",
                    "--show-only", "templates/deployment.yaml"]).stdout
    manifest = tmp / "pod.yaml"
    manifest.write_text(rendered)
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")

    play_started = time.monotonic()
    url = f"http://127.0.0.1:{host_port}"
    try:
        podman("kube", "play", str(manifest), timeout=180)
        # podman names a Deployment's pods <name>-pod-<index>.
        pods = podman("pod", "ps", "--format", "{{.Name}}", "--filter",
                      f"name={deployment['metadata']['name']}-pod").split()
        assert len(pods) == 1, pods
        pod_name = pods[0]
        live.wait_for(lambda: live.http_get(url + "/readyz", timeout=1) is not None, 60,
                      "the tailfloor sidecar to answer /readyz on its hostPort",
                      lambda: pod_logs(pod_name))
        timings["play_to_ready"] = time.monotonic() - play_started
        yield {"url": url, "pod": pod_name, "deployment": deployment, "timings": timings,
               "started": started, "manifest": manifest, "state": state}
    finally:
        down_started = time.monotonic()
        podman("kube", "down", str(manifest), timeout=120, check=False)
        timings["down"] = time.monotonic() - down_started
        timings["total"] = time.monotonic() - started
        print("\npod test timings (s): " + json.dumps({k: round(v, 1)
                                                       for k, v in timings.items()}))


def pod_logs(pod_name: str) -> str:
    names = podman("ps", "-a", "--format", "{{.Names}}", "--filter", f"pod={pod_name}").split()
    return "\n".join(f"--- {n} ---\n" + podman("logs", n, check=False)[-2000:]
                     for n in names if not n.endswith("-infra"))


def agent_result(pod: dict[str, Any]) -> dict[str, Any]:
    container = f"{pod['pod']}-agent"
    found: dict[str, Any] = {}

    def printed() -> bool:
        for line in podman("logs", container, check=False).splitlines():
            if line.startswith("AGENT-RESULT "):
                found.update(json.loads(line.removeprefix("AGENT-RESULT ")))
                return True
        return False

    live.wait_for(printed, 60, "the fake agent's result",
                  lambda: pod_logs(pod["pod"]))
    return found


def test_agent_reaches_the_model_through_the_sidecar(pod: dict[str, Any]) -> None:
    result = agent_result(pod)
    spec = pod["deployment"]["spec"]["template"]["spec"]
    port = next(c for c in spec["containers"] if c["name"] == "tailfloor")["ports"][0][
        "containerPort"]
    agent_env = env_of(next(c for c in spec["containers"] if c["name"] == "agent"))
    assert agent_env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/agents/main/v1"
    assert result["base_url"] == agent_env["OPENAI_BASE_URL"]
    assert result.get("status") == 200, result
    assert result["answer"]["choices"][0]["message"]["content"] == (
        "Hello from the fake upstream.")
    assert result["stream_done"] is True, result
    # The agent's transcript landed on the volume tailfloor mounts too.
    assert "transcript_error" not in result, result
    assert (pod["state"] / "agents" / "main" / "sessions" / "s1.jsonl").exists()


def test_request_from_outside_and_metrics(pod: dict[str, Any]) -> None:
    agent_result(pod)

    client = openai.OpenAI(base_url=pod["url"] + "/agents/probe/v1", api_key="sk-test",
                           max_retries=0, timeout=10)
    answer = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "Hello from the fake upstream."

    text = live.http_get(pod["url"] + "/metrics").decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in live.text_string_to_metric_families(text) for s in f.samples}

    def total(name: str, **labels: str) -> float:
        return sum(v for (n, lbl), v in samples.items()
                   if n == name and labels.items() <= dict(lbl).items())

    # Two requests from the agent (plain and streamed) and one from the test.
    assert total("tailfloor_requests_total", route="chat_completions", model="fake-model",
                 code="200") == 3
    assert total("tailfloor_tokens_total", agent="main", type="input") > 0
    assert total("tailfloor_tokens_total", agent="probe", type="output") > 0


def test_sidecar_runs_locked_down(pod: dict[str, Any]) -> None:
    container = f"{pod['pod']}-tailfloor"
    inspect = json.loads(podman("container", "inspect", container))[0]
    host = inspect["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert inspect["Config"]["User"].split(":")[0] == "10001"
    assert podman("exec", container, "id", "-u").strip() == "10001"
    denied = run([find_tool("podman"), "exec", container, "touch", "/opt/x"], check=False,
                 env=environment())
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr
    # TMPDIR is writable, and the rules ConfigMap is a directory with its file.
    podman("exec", container, "sh", "-c", "touch /tmp/ok && test -f /tmp/ok")
    listing = podman("exec", container, "ls", "/etc/tailfloor/rules")
    assert "policy.toml" in listing.split()
    # The transcripts volume is the agent's state volume.
    assert podman("exec", container, "ls", "/transcripts/agents/main/sessions").split() == [
        "s1.jsonl"]


READ_WAL = ("import sqlite3, sys; db = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True); "
            "print(db.execute('select count(*) from transcript_events').fetchone()[0])")


def test_sqlite_wal_database_is_readable_through_the_sidecar_mount(pod: dict[str, Any]) -> None:
    """The agent wrote a WAL-mode database and closed it. Through a read-only mount SQLite
    cannot create the -shm index and fails; through tailfloor's mount (read-write, opened with
    mode=ro) it reads the rows."""
    result = agent_result(pod)
    assert result["wal_database"] == "/state/wal-check.sqlite"
    python = "/opt/tailfloor/bin/python"
    read_only = run([find_tool("podman"), "exec", f"{pod['pod']}-upstream", python, "-c",
                     READ_WAL, "/state-ro/wal-check.sqlite"], check=False, env=environment())
    assert read_only.returncode != 0
    assert "unable to open database file" in read_only.stderr
    rows = podman("exec", f"{pod['pod']}-tailfloor", python, "-c", READ_WAL,
                  "/transcripts/wal-check.sqlite")
    assert rows.strip() == "1"
