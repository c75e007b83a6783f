"""The dashboard and alerting rules in deploy/, without servers: promtool, the metric names, the chart.

promtool (Debian's prometheus package, which `make test` installs) checks the
rules and runs their unit tests (tests/prometheus/rules-test.yaml). Every metric
the dashboard and the rules name must be one the code registers, so a renamed
metric fails here. tests/k8s/test_prometheus.py scrapes the real components.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from prometheus_client import REGISTRY

from tests.k8s import helm
from tests.support import tools

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "deploy" / "helm" / "preemptctl" / "files"
DASHBOARD = FILES / "grafana-dashboard.json"
RULES = FILES / "prometheus-rules.yaml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "rules-test.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/preemptctl/preemptctl/blob/main/docs/runbooks.md"
# Metrics about decisions, which carry the decision's cluster (the dashboard's $cluster).
CLUSTER_METRICS = ("preemptctl_decisions_total", "preemptctl_decision_duration_seconds",
                   "preemptctl_preemption_victims", "preemptctl_actuator_outcomes_total")  # fmt: skip
# The modules that define every preemptctl metric (importing them registers the metrics).
METRIC_MODULES = (
    "streams.common.health",
    "streams.kafka.deadletter",
    "streams.kafka.lag",
    "streams.pipeline.metrics",
    "streams.pipeline.worker",
    "streams.pipeline.checkpoint",
    "streams.pipeline.recovery",
    "streams.pipeline.partitions",
    "streams.kube.actuator",
    "streams.kube.eviction",
    "streams.kube.lease",
    "streams.kube.source",
    "streams.kube.publisher",
)
ROWS = [
    "Source: the cluster's log",
    "Worker: lag behind preemption.cluster-events",
    "Worker: decisions and victims",
    "Actuator: outcomes",
    "Dead letters",
    "Actuator: leader",
]
# promtool runs in well under a second; a hung one must not hold the suite.
PROMTOOL_TIMEOUT_S = 60
METRIC_NAME = re.compile(r"\bpreemptctl_[a-z_]+")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tools.need("promtool", "prometheus"), *args],
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
        cwd=RULE_TESTS.parent,  # where the rule tests' relative rule_files start
    )


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in board["panels"] if p["type"] != "row" for t in p["targets"]]


def rule_queries() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(r["alert"], r["expr"]) for g in groups for r in g["rules"]]


def test_promtool_checks_the_rules() -> None:
    run = promtool("check", "rules", str(RULES))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(rule_queries())} rules found" in run.stdout


def test_the_alerts_fire_when_they_should_and_only_then() -> None:
    run = promtool("test", "rules", str(RULE_TESTS))
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_has_a_unit_test_that_fires_it_and_one_where_it_stays_quiet() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    checks = [c for t in tests for c in t.get("alert_rule_test", [])]
    for alert, _ in rule_queries():
        mine = [c for c in checks if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"{alert}: no test where it fires"
        assert any(not c["exp_alerts"] for c in mine) or alert in SILENT_ONLY_BY_OTHERS, (
            f"{alert}: no test where it stays quiet"
        )


# Alerts whose quiet case is the other alerts' tests (they fire on absence, so every test
# that has the component running shows them quiet): checked by the Prometheus scenario.
SILENT_ONLY_BY_OTHERS = {"PreemptctlComponentNotReady"}


def test_every_alert_links_its_runbook_and_severity() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    headings = {
        line.removeprefix("## ").strip().lower()
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in (r for g in groups for r in g["rules"]):
        annotations = rule["annotations"]
        assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{rule['alert'].lower()}", rule["alert"]
        assert rule["alert"].lower() in headings, f"docs/runbooks.md has no section {rule['alert']}"
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert annotations["summary"] and annotations["description"]


def test_every_component_has_an_alert() -> None:
    text = RULES.read_text()
    for metric in ("preemptctl_source_", "preemptctl_worker_", "preemptctl_actuator_"):
        assert metric in text, metric
    for component in ("source", "actuator"):
        assert f'preemptctl_leader{{component="{component}"}}' in text


def test_the_dashboard_has_one_row_per_component_and_every_panel_a_query() -> None:
    board = dashboard()
    assert [p["title"] for p in board["panels"] if p["type"] == "row"] == ROWS
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "cluster", "namespace"]
    for name in ("cluster", "namespace"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
        assert variables[name]["query"]["query"].startswith("label_values(preemptctl_")
    tops = [p["gridPos"]["y"] for p in board["panels"]]
    assert tops == sorted(tops)  # rows and their panels top to bottom, in order
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"] and panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"] == panel["datasource"] and t["expr"] for t in panel["targets"])
        for target in panel["targets"]:
            # Every selector of every query narrows to the chosen namespaces, and decision metrics to
            # the chosen clusters.
            for selector in re.findall(r"preemptctl_[a-z_]+(\{[^}]*\})?", target["expr"]):
                assert 'namespace=~"$namespace"' in selector, (panel["title"], target["expr"])
            for metric in CLUSTER_METRICS:
                for selector in re.findall(metric + r"[a-z_]*(\{[^}]*\})?", target["expr"]):
                    assert 'cluster=~"$cluster"' in selector, (panel["title"], target["expr"])


def registered_names() -> set[str]:
    """Every sample name the code's metrics can export (a labelled metric exports none until used)."""
    for module in METRIC_MODULES:
        importlib.import_module(module)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}
    return {
        family.name + suffix for family in REGISTRY.collect() for suffix in suffixes.get(family.type, ("",))
    }


def test_the_dashboard_and_rules_name_only_metrics_the_code_exports() -> None:
    known = registered_names()
    for where, query in panel_queries(dashboard()) + rule_queries():
        named = set(METRIC_NAME.findall(query))
        assert named, where
        assert named <= known, f"{where}: {sorted(named - known)} not exported by preemptctl"


def monitoring_values(**flags: bool) -> dict[str, Any]:
    chart_values = helm.values()
    for name, enabled in flags.items():
        chart_values["monitoring"][name]["enabled"] = enabled
    return chart_values


def test_the_chart_installs_dashboard_rules_and_scrape_config_behind_flags() -> None:
    def monitoring(d: dict[str, Any]) -> bool:
        component = d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        return component in ("metrics", "monitoring")

    assert not [d for d in helm.manifests(helm.DEFAULTS) if monitoring(d)]
    chart_values = monitoring_values(dashboard=True, prometheusRule=True, serviceMonitor=True)
    schema = json.loads((helm.CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(chart_values)
    docs = helm.manifests(chart_values)

    (dash,) = [c for c in helm.by_kind(docs, "ConfigMap").values() if monitoring(c)]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for
    assert json.loads(dash["data"]["preemptctl.json"]) == dashboard()

    (rule,) = helm.by_kind(docs, "PrometheusRule").values()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())  # the file promtool checks, unchanged
    # ... but for the runbooks' address, where a team keeps its own copy.
    wiki = "https://wiki.example/runbooks/preemptctl"
    moved = monitoring_values(prometheusRule=True)
    moved["monitoring"]["runbookBaseUrl"] = wiki
    (rule,) = helm.by_kind(helm.manifests(moved), "PrometheusRule").values()
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert urls and all(u.startswith(wiki + "#preemptctl") for u in urls)

    (monitor,) = helm.by_kind(docs, "ServiceMonitor").values()
    selects = monitor["spec"]["selector"]["matchLabels"].items()
    # One Service selected (the worker's own headless Service is not: no target scraped twice).
    (service,) = [
        s for s in helm.by_kind(docs, "Service").values() if selects <= s["metadata"]["labels"].items()
    ]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": chart_values["metricsPort"], "targetPort": "metrics"}
    ]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("metrics", "/metrics", "30s")
    workloads = [
        *helm.by_kind(docs, "Deployment").values(),
        *helm.by_kind(docs, "StatefulSet").values(),
    ]
    assert len(workloads) == 3
    for deployment in workloads:
        pod = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod.items()  # every component is scraped
        assert helm.container(deployment)["ports"][0]["name"] == "metrics"
