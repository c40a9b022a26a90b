"""Alert rules: promtool checks and unit tests, one firing case per alert, and the chart's
PrometheusRule carries exactly the same rules."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy.tools import CHART, EXAMPLES, GRAFANA, find_tool, one, render, run

RULES = GRAFANA / "alerts" / "tailfloor-alerts.yaml"
TESTS = GRAFANA / "alerts" / "tailfloor-alerts.test.yaml"
CHART_RULES = CHART / "files" / "tailfloor-alerts.yaml"

REQUIRED = {
    "TailfloorOverflowRecoveryFailing",
    "TailfloorUpstreamErrorRatioHigh",
    "TailfloorTranscriptReadErrors",
    "TailfloorFloorCappedFrequently",
    "TailfloorUnidentifiedRequestsFrequent",
    "TailfloorProxyOverheadP99High",
    "TailfloorSummarizerFailing",
    "TailfloorNoTranscriptsWhileRequestsFlow",
}


def alert_names() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def test_promtool_check_rules() -> None:
    out = run([find_tool("promtool"), "check", "rules", str(RULES)]).stdout
    assert f"SUCCESS: {len(alert_names())} rules found" in out


def test_promtool_unit_tests_pass() -> None:
    proc = run([find_tool("promtool"), "test", "rules", str(TESTS)], cwd=TESTS.parent)
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_every_alert_has_a_firing_unit_test() -> None:
    names = alert_names()
    assert names >= REQUIRED, REQUIRED - names
    fired: set[str] = set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        assert case["input_series"], case["name"]
        for check in case.get("alert_rule_test", []):
            if check.get("exp_alerts"):
                fired.add(check["alertname"])
    assert fired == names, f"alerts without a firing test: {names - fired}"


def test_unit_tests_fail_when_an_alert_never_fires(tmp_path: Path) -> None:
    """The unit tests really discriminate: with every threshold unreachable they fail."""
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule["expr"] = f"({rule['expr']}) and on() vector(0) > 1"
    broken = yaml.safe_dump(data)
    (tmp_path / RULES.name).write_text(broken)
    (tmp_path / TESTS.name).write_text(TESTS.read_text())
    proc = run([find_tool("promtool"), "test", "rules", TESTS.name], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    for name in alert_names():
        assert f"alertname: {name}," in proc.stdout + proc.stderr, name


def test_chart_ships_the_same_rules() -> None:
    assert CHART_RULES.read_bytes() == RULES.read_bytes(), (
        "helm/tailfloor/files/tailfloor-alerts.yaml differs from grafana/alerts; copy it over")
    docs = render([EXAMPLES / "standalone.yaml", EXAMPLES / "monitoring.yaml"])
    rule = one(docs, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    docs = render([EXAMPLES / "openclaw-sidecar.yaml", EXAMPLES / "monitoring.yaml"])
    spec = one(docs, "PrometheusRule")["spec"]
    path = tmp_path / "from-chart.yaml"
    path.write_text(yaml.safe_dump(spec))
    run([find_tool("promtool"), "check", "rules", str(path)])
