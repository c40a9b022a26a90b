"""The Helm chart: lint, render with every values file, validate against the Kubernetes 1.30
schemas, and check what the rendered pods actually do."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.tools import (
    CHART,
    EXAMPLES,
    ROOT,
    by_kind,
    container,
    env_of,
    find_tool,
    helm_template,
    one,
    render,
    run,
)

SIDECAR = EXAMPLES / "openclaw-sidecar.yaml"
STANDALONE = EXAMPLES / "standalone.yaml"
MONITORING = EXAMPLES / "monitoring.yaml"
YAMLLINT_CONFIG = Path(__file__).with_name("yamllint.yaml")

VARIANTS: dict[str, list[Path]] = {
    "defaults": [],
    "sidecar": [SIDECAR],
    "standalone": [STANDALONE],
    "sidecar-monitoring": [SIDECAR, MONITORING],
    "standalone-monitoring": [STANDALONE, MONITORING],
}


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def test_lint_strict() -> None:
    helm = find_tool("helm")
    run([helm, "lint", "--strict", str(CHART)])
    for files in VARIANTS.values():
        args = [a for f in files for a in ("-f", str(f))]
        run([helm, "lint", "--strict", str(CHART), *args])


def test_yamllint_values_and_examples() -> None:
    files = [CHART / "values.yaml", CHART / "Chart.yaml", *sorted(EXAMPLES.glob("*.yaml"))]
    run([find_tool("yamllint"), "-c", str(YAMLLINT_CONFIG), "--strict",
         *map(str, files)])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_manifests_validate_against_kubernetes_1_30(variant: str,
                                                              tmp_path: Path) -> None:
    rendered = tmp_path / f"{variant}.yaml"
    rendered.write_text(helm_template(VARIANTS[variant]).stdout)
    proc = run([find_tool("kubernetes-validate"), "-k", "1.30.0", "--strict", "--quiet",
                str(rendered)])
    assert "ERROR" not in proc.stdout + proc.stderr
    # Only the Prometheus Operator kinds have no built-in schema; they are checked below.
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.read_text()) if d}
    unchecked = {line.split("kind ")[1].split()[0]
                 for line in (proc.stdout + proc.stderr).splitlines()
                 if "Couldn't find schema" in line}
    assert unchecked <= {"ServiceMonitor", "PrometheusRule"}, unchecked
    assert "Deployment" in kinds
    run([find_tool("yamllint"), "-d", "{extends: relaxed, rules: {line-length: disable, "
         "indentation: {indent-sequences: whatever}}}",
         str(rendered)])


def test_sidecar_shares_the_transcript_volume_with_the_agent() -> None:
    docs = render([SIDECAR])
    spec = pod_spec(docs)
    names = [c["name"] for c in spec["containers"]]
    assert names == ["openclaw", "tailfloor"]
    agent, tailfloor = container(spec, "openclaw"), container(spec, "tailfloor")

    agent_mount = next(m for m in agent["volumeMounts"] if m["name"] == "openclaw-state")
    tf_mount = next(m for m in tailfloor["volumeMounts"] if m["name"] == "openclaw-state")
    assert agent_mount["mountPath"] == env_of(agent)["OPENCLAW_STATE_DIR"]
    # Read-write (SQLite WAL readers map the -shm index) and no subPath (renames are seen).
    assert tf_mount["readOnly"] is False
    assert "subPath" not in tf_mount and "subPath" not in agent_mount
    assert env_of(tailfloor)["TAILFLOOR_SESSIONS"] == tf_mount["mountPath"]

    volume = next(v for v in spec["volumes"] if v["name"] == "openclaw-state")
    claim = volume["persistentVolumeClaim"]["claimName"]
    pvc = one(docs, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == claim
    assert one(docs, "Deployment")["spec"]["strategy"]["type"] == "Recreate"


def test_sidecar_agent_config_points_at_tailfloor_on_loopback() -> None:
    docs = render([SIDECAR])
    spec = pod_spec(docs)
    tailfloor = container(spec, "tailfloor")
    port = tailfloor["ports"][0]["containerPort"]
    assert env_of(tailfloor)["TAILFLOOR_LISTEN"] == f"0.0.0.0:{port}"

    seed = next(c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith(
        "-agent-config"))
    config = json.loads(seed["data"]["openclaw.json"])
    base_urls = [p["baseUrl"] for p in config["models"]["providers"].values()]
    assert base_urls == [f"http://127.0.0.1:{port}/agents/main/v1"]
    init = spec["initContainers"][0]
    assert {m["name"] for m in init["volumeMounts"]} == {"openclaw-state", "agent-config-seed"}


def test_base_url_env_is_set_for_the_agent() -> None:
    docs = render([SIDECAR], ["agent.baseUrlEnv=OPENAI_BASE_URL", "agent.agentId=coder",
                              "tailfloor.port=9000"])
    agent = container(pod_spec(docs), "openclaw")
    assert env_of(agent)["OPENAI_BASE_URL"] == "http://127.0.0.1:9000/agents/coder/v1"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_probes_security_and_read_only_root(variant: str) -> None:
    docs = render(VARIANTS[variant])
    spec = pod_spec(docs)
    tailfloor = container(spec, "tailfloor")
    assert tailfloor["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert tailfloor["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Probes use the health process's port, which the container exposes beside the proxy
    # and admin ports.
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert tailfloor[probe]["httpGet"]["port"] == "health"
    ports = {p["name"]: p["containerPort"] for p in tailfloor["ports"]}
    assert tailfloor["ports"][0]["name"] == "tailfloor" and "admin" in ports
    assert env_of(tailfloor)["TAILFLOOR_ADMIN_LISTEN"] == f"0.0.0.0:{ports['admin']}"
    assert env_of(tailfloor)["TAILFLOOR_HEALTH_LISTEN"] == f"0.0.0.0:{ports['health']}"
    assert len(set(ports.values())) == len(ports)
    assert tailfloor["resources"]["requests"] and tailfloor["resources"]["limits"]["memory"]

    sc = tailfloor["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    for c in spec["containers"]:
        assert c.get("securityContext", {}).get("allowPrivilegeEscalation") is False, c["name"]

    # With a read-only root, TMPDIR must be a writable emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in tailfloor["volumeMounts"]}
    assert env_of(tailfloor)["TMPDIR"] == "/tmp"
    tmp = next(v for v in spec["volumes"] if v["name"] == mounts["/tmp"])
    assert "emptyDir" in tmp


@pytest.mark.parametrize("variant", ["sidecar", "standalone"])
def test_rules_configmap_is_mounted_as_a_directory(variant: str) -> None:
    docs = render(VARIANTS[variant], ["tailfloor.rules.files.policy\\.toml=x = 1"])
    spec = pod_spec(docs)
    tailfloor = container(spec, "tailfloor")
    rules_dir = env_of(tailfloor)["TAILFLOOR_RULES"]
    mount = next(m for m in tailfloor["volumeMounts"] if m["mountPath"] == rules_dir)
    # A subPath mount would never see the kubelet's symlink swap, so no hot reload.
    assert "subPath" not in mount
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    cm = next(c for c in by_kind(docs, "ConfigMap")
              if c["metadata"]["name"] == volume["configMap"]["name"])
    assert cm["data"]["policy.toml"] == "x = 1"
    assert "items" not in volume["configMap"]


def test_standalone_has_service_and_disruption_budget() -> None:
    docs = render([STANDALONE])
    deployment = one(docs, "Deployment")
    service = one(docs, "Service")
    pdb = one(docs, "PodDisruptionBudget")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"],
                     deployment["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "tailfloor"
    assert deployment["spec"]["replicas"] == 2
    assert pdb["spec"]["minAvailable"] == 1
    spec = pod_spec(docs)
    assert [c["name"] for c in spec["containers"]] == ["tailfloor"]
    tailfloor = container(spec, "tailfloor")
    assert env_of(tailfloor)["TAILFLOOR_SESSIONS"] == "/sessions"
    assert any(m["mountPath"] == "/sessions" for m in tailfloor["volumeMounts"])


def test_monitoring_objects() -> None:
    docs = render([STANDALONE, MONITORING])
    monitor = one(docs, "ServiceMonitor")
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    selected = [s for s in services.values() if monitor["spec"]["selector"]["matchLabels"]
                .items() <= s["metadata"]["labels"].items()]
    # Prometheus scrapes the admin port through its own Service; the agents' Service never
    # exposes the admin port (session metadata lives there).
    assert len(selected) == 1 and selected[0]["metadata"]["name"].endswith("-admin")
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == selected[0]["spec"]["ports"][0]["name"] == "admin"
    assert endpoint["path"] == "/metrics"
    agents = [s for s in services.values() if s is not selected[0]]
    assert [p["targetPort"] for s in agents for p in s["spec"]["ports"]] == ["tailfloor"]
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"], "PrometheusRule has no groups"
    assert not by_kind(render([STANDALONE]), "ServiceMonitor")


def test_schema_rejects_bad_values() -> None:
    bad = [
        ["mode=daemonset"],
        ["tailfloor.port=0"],
        ["tailfloor.logFormat=xml"],
        ["tailfloor.upstream=not-a-url"],
        ["mode=sidecar"],  # no agent image
        ["tailfloor.sessions[0]=relative/path"],
        ["unknownTopLevel=1"],
    ]
    for sets in bad:
        proc = helm_template(sets=sets, check=False)
        assert proc.returncode != 0, f"--set {sets} was accepted"
        assert "schema" in proc.stderr or "values don't meet" in proc.stderr, proc.stderr


def test_named_sidecar_template_works_from_another_chart(tmp_path: Path) -> None:
    """Another chart depending on this one adds the sidecar to its own pod spec."""
    parent = tmp_path / "myagent"
    (parent / "templates").mkdir(parents=True)
    (parent / "charts").mkdir()
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: myagent\nversion: 1.0.0\n"
        "dependencies:\n  - name: tailfloor\n    version: 0.1.0\n")
    run([find_tool("helm"), "package", str(CHART), "-d", str(parent / "charts")])
    (parent / "values.yaml").write_text("tailfloor:\n  mode: standalone\n")
    (parent / "templates" / "pod.yaml").write_text(
        """{{- $cfg := dict "image" "example/tailfloor:1" "upstream" "http://models:8000/v1"
     "transcripts" (dict "volume" "work" "mountPath" "/work-ro")
     "rules" (dict "enabled" true "configMap" "my-rules") }}
apiVersion: v1
kind: Pod
metadata:
  name: myagent
spec:
  containers:
    - name: agent
      image: example/agent:1
      volumeMounts:
        - name: work
          mountPath: /work
    {{- include "tailfloor.sidecar" (dict "config" $cfg) | nindent 4 }}
  volumes:
    - name: work
      emptyDir: {}
    {{- include "tailfloor.sidecar.volumes" (dict "config" $cfg) | nindent 4 }}
""")
    out = run([find_tool("helm"), "template", "x", str(parent),
               "--show-only", "templates/pod.yaml"]).stdout
    rendered = tmp_path / "pod.yaml"
    rendered.write_text(out)
    run([find_tool("kubernetes-validate"), "-k", "1.30.0", "--strict", "--quiet",
         str(rendered)])
    pod = yaml.safe_load(out)
    tailfloor = container(pod["spec"], "tailfloor")
    env = env_of(tailfloor)
    assert env["TAILFLOOR_UPSTREAM"] == "http://models:8000/v1"
    assert env["TAILFLOOR_SESSIONS"] == "/work-ro"
    assert tailfloor["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tailfloor-rules"]["configMap"]["name"] == "my-rules"
    mounted = {m["name"] for m in tailfloor["volumeMounts"]}
    assert mounted <= set(volumes)


@pytest.mark.parametrize("variant", ["sidecar", "standalone"])
def test_rules_in_the_configmap_pass_tailfloor_rules_check(variant: str, tmp_path: Path) -> None:
    docs = render(VARIANTS[variant])
    rules = next(c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith(
        "-rules"))
    for name, content in (rules.get("data") or {}).items():
        (tmp_path / name).write_text(content)
    run([sys.executable, "-m", "proxy", "rules", "check", str(tmp_path)], cwd=ROOT)


def test_a_missing_tool_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("TAILFLOOR_PROMTOOL", raising=False)
    with pytest.raises(pytest.fail.Exception, match="'promtool' was not found; install it"):
        find_tool("promtool")


def test_a_rules_change_does_not_restart_the_pod() -> None:
    """Hot reload is the point: the pod template must not depend on the rules' content."""
    before = one(render([SIDECAR]), "Deployment")
    after = one(render([SIDECAR], ["tailfloor.rules.files.other\\.toml=[defaults]"]),
                "Deployment")
    assert before["spec"]["template"] == after["spec"]["template"]


def test_introspection_is_off_in_the_pod_unless_asked() -> None:
    tailfloor = container(pod_spec(render([STANDALONE])), "tailfloor")
    assert env_of(tailfloor)["TAILFLOOR_INTROSPECTION"] == "false"
    tailfloor = container(pod_spec(render([STANDALONE], ["tailfloor.introspection=true"])),
                          "tailfloor")
    assert env_of(tailfloor)["TAILFLOOR_INTROSPECTION"] == "true"


def test_the_health_process_can_be_turned_off_and_the_probes_go_to_admin() -> None:
    tailfloor = container(pod_spec(render([STANDALONE], ["tailfloor.healthPort=0"])),
                          "tailfloor")
    assert "TAILFLOOR_HEALTH_LISTEN" not in env_of(tailfloor)
    assert "health" not in {p["name"] for p in tailfloor["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert tailfloor[probe]["httpGet"]["port"] == "admin"
    # A probe that names a port by number is left as it is.
    tailfloor = container(pod_spec(render([STANDALONE], [
        "tailfloor.healthPort=0", "tailfloor.livenessProbe.httpGet.port=9999"])), "tailfloor")
    assert tailfloor["livenessProbe"]["httpGet"]["port"] == 9999


def test_standalone_replicas_share_a_store_without_a_password_in_the_pod_spec() -> None:
    plain = container(pod_spec(render([STANDALONE])), "tailfloor")
    assert "TAILFLOOR_STORE" not in env_of(plain)  # the default: each replica its own store
    docs = render([STANDALONE], sets=["tailfloor.store.url=redis://redis.cache:6379/0",
                                      "tailfloor.store.passwordSecret=redis-auth"])
    spec = pod_spec(docs)
    tailfloor = container(spec, "tailfloor")
    env = env_of(tailfloor)
    assert env["TAILFLOOR_STORE"] == "redis://redis.cache:6379/0"
    mount = next(m for m in tailfloor["volumeMounts"] if m["name"] == "tailfloor-store")
    assert env["TAILFLOOR_STORE_PASSWORD_FILE"] == mount["mountPath"] + "/password"
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == "tailfloor-store")
    assert volume["secret"]["secretName"] == "redis-auth"
    from_secret = container(pod_spec(render([STANDALONE], sets=[
        "tailfloor.store.urlSecret=redis-url"])), "tailfloor")
    store = next(e for e in from_secret["env"] if e["name"] == "TAILFLOOR_STORE")
    assert store["valueFrom"]["secretKeyRef"] == {"name": "redis-url", "key": "url"}
    assert helm_template(sets=["tailfloor.store.url=http://cache:6379"],
                         check=False).returncode != 0


def test_standalone_replicas_can_keep_sessions_by_client_ip_instead() -> None:
    assert "sessionAffinity" not in one(render([STANDALONE]), "Service")["spec"]
    service = one(render([STANDALONE], sets=["service.sessionAffinity=ClientIP"]), "Service")
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    assert service["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] == 10800


def test_the_inspector_keeps_content_off_and_takes_its_token_from_a_secret() -> None:
    plain = container(pod_spec(render([STANDALONE])), "tailfloor")
    env = env_of(plain)
    assert env["TAILFLOOR_INSPECT_CONTENT"] == "false"
    assert env["TAILFLOOR_INSPECT_REQUESTS"] == "20"
    assert "TAILFLOOR_ADMIN_TOKEN_FILE" not in env
    docs = render([STANDALONE], sets=["tailfloor.adminToken.secret=admin-token",
                                      "tailfloor.inspector.requests=0",
                                      "monitoring.serviceMonitor.enabled=true"])
    spec = pod_spec(docs)
    tailfloor = container(spec, "tailfloor")
    env = env_of(tailfloor)
    assert env["TAILFLOOR_INSPECT_REQUESTS"] == "0"
    mount = next(m for m in tailfloor["volumeMounts"] if m["name"] == "tailfloor-admin-token")
    assert env["TAILFLOOR_ADMIN_TOKEN_FILE"] == mount["mountPath"] + "/token"
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == "tailfloor-admin-token")
    assert volume["secret"]["secretName"] == "admin-token"
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["authorization"]["credentials"] == {"name": "admin-token", "key": "token"}


def test_otel_export_is_set_by_the_chart_with_its_headers_from_a_secret() -> None:
    plain = container(pod_spec(render([STANDALONE])), "tailfloor")
    assert not any(name.startswith("OTEL_") for name in env_of(plain))  # the default: off
    tailfloor = container(pod_spec(render([STANDALONE], sets=[
        "otel.endpoint=http://otel-collector.monitoring:4318",
        "otel.headersSecret=collector-key"])), "tailfloor")
    env = env_of(tailfloor)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4318"
    assert env["OTEL_SERVICE_NAME"] == "tailfloor"
    headers = next(e for e in tailfloor["env"] if e["name"] == "OTEL_EXPORTER_OTLP_HEADERS")
    assert headers["valueFrom"]["secretKeyRef"] == {"name": "collector-key", "key": "headers"}
    assert helm_template(sets=["otel.endpoint=collector:4318"], check=False).returncode != 0
