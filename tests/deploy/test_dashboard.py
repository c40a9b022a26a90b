"""The Grafana dashboard: its structure, and every panel query checked against what a running
tailfloor really exports and against a real Prometheus scraping it under load."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy import live
from tests.deploy.feature_load import FeatureLoad
from tests.deploy.tools import GRAFANA, find_tool, run

DASHBOARD = GRAFANA / "dashboards" / "tailfloor.json"
PROVISIONING = GRAFANA / "provisioning"
METRIC = re.compile(r"\btailfloor_[a-z0-9_]+\b")
# What Grafana substitutes, for a plain Prometheus without namespace/pod labels.
VARIABLES = {"$__rate_interval": "1m", "$__range": "1m", "$namespace": ".*", "$pod": ".*",
             "$model": ".*", "$agent": ".*"}

# Gauges that are legitimately zero between requests: every other query must return a value
# above zero after the load (a panel counting events must see some).
MAY_BE_ZERO = {("Rejected, disconnected, in flight", "D")}
REQUIRED_TOPICS = [
    "Request rate by model", "Errors by model and status", "Tokens per minute by type",
    "Tokens per minute by model", "Tokens per minute by agent", "Time to first token",
    "Proxy overhead", "Rewrites by kind", "Messages restored and tails carried",
    "Overflow outcomes", "Compactions", "Summarizer latency", "Summarizer tokens per minute",
    "Transcript lag", "Transcript lines and errors", "Sessions tracked", "Floor cost vs saved",
    "Cache fill", "Cache bytes held",
]


@dataclass(frozen=True, slots=True)
class Target:
    panel: str
    ref: str
    expr: str

    @property
    def plain(self) -> str:
        expr = self.expr
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        return expr

    @property
    def metrics(self) -> set[str]:
        return set(METRIC.findall(self.expr))


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def targets() -> list[Target]:
    return [Target(p["title"], t["refId"], t["expr"])
            for p in panels() for t in p.get("targets", [])]


def family_of(series: str, fams: dict[str, live.Family]) -> str | None:
    for family in fams.values():
        if series in family.series:
            return family.name
    return None


def test_structure_uid_datasource_and_variables() -> None:
    board = dashboard()
    assert board["uid"] == "tailfloor-overview"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "pod", "model", "agent"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name]["allValue"] == ".*"
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in panels()]
    missing = [t for t in REQUIRED_TOPICS if t not in titles]
    assert not missing, missing
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert 'namespace=~"$namespace"' in target["expr"], (panel["title"], target)
            assert 'pod=~"$pod"' in target["expr"], (panel["title"], target)


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in panels():
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_provisioning_files() -> None:
    dashboards = yaml.safe_load((PROVISIONING / "dashboards" / "tailfloor.yaml").read_text())
    provider = dashboards["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert sources["datasources"][0]["type"] == "prometheus"
    files = [*PROVISIONING.rglob("*.yaml")]
    run([find_tool("yamllint"), "-c", str(Path(__file__).with_name("yamllint.yaml")),
         "--strict", *map(str, files)])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Fake upstream + real tailfloor + real Prometheus (1 s scrapes), after a short load."""
    tmp = tmp_path_factory.mktemp("stack")
    fake = live.FakeUpstream()
    started: list[live.Process] = []
    try:
        rules = tmp / "rules"
        rules.mkdir()
        features = FeatureLoad(tmp, rules)
        tailfloor, url = live.start_tailfloor(fake.url, tmp, rules, features.args)
        started.append(tailfloor)
        before = live.http_get(url + "/metrics").decode()
        prometheus, prom_url = live.start_prometheus(url.removeprefix("http://"), tmp)
        started.append(prometheus)
        live.run_load(url, fake, seconds=4, rules=rules, features=features)
        after = live.http_get(url + "/metrics").decode()
        total = live.families(after)["tailfloor_requests"]

        def caught_up() -> bool:
            want = sum(s.value for f in text_string_to_metric_families(after)
                       if f.name == total.name for s in f.samples if s.name.endswith("_total"))
            got = live.finite_values(live.instant_query(
                prom_url, "sum(tailfloor_requests_total)"))
            return bool(got) and got[0] >= want

        live.wait_for(caught_up, 30, "Prometheus to scrape the load", prometheus.logs)
        yield {"before": before, "after": after, "prometheus": prom_url,
               "logs": lambda: "\n".join(p.logs() for p in started)}
    finally:
        for process in reversed(started):
            process.stop()
        fake.stop()


def test_every_panel_metric_is_exported_by_a_running_tailfloor(stack: dict[str, Any]) -> None:
    # Scraped before any request: HELP/TYPE are there for every family, used or not.
    fams = live.families(stack["before"])
    for target in targets():
        for series in target.metrics:
            assert family_of(series, fams), (
                f"panel {target.panel!r} queries {series}, which tailfloor does not export")


def test_every_panel_query_returns_data_from_prometheus(stack: dict[str, Any]) -> None:
    fams = live.families(stack["after"])
    problems: list[str] = []
    for target in targets():
        values = live.finite_values(live.instant_query(stack["prometheus"], target.plain))
        if values and (any(values) or (target.panel, target.ref) in MAY_BE_ZERO):
            continue
        used = sorted(f for f in (family_of(s, fams) for s in target.metrics) if f)
        idle = [f for f in used if not fams[f].exercised]
        what = "zeros only" if values else "no data"
        problems.append(f"panel {target.panel!r} ({target.ref}): {what}; families "
                        f"{used}, not exercised by the load: {idle}\n    {target.plain}")
    assert not problems, "\n".join(problems)
