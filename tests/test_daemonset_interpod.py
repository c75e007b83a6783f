"""The DaemonSet flow under the filters that read other pods, on its required node (engine.interpod).

A DaemonSet pod asking for a host port (node exporters, ingress controllers) or
kept apart from some pods by anti-affinity must have what holds the port or stands
in the way evicted first, whatever the strategies pick for resources; one that a
more important pod blocks is unschedulable, never `fits` on a node kube-scheduler
would refuse.
"""

from __future__ import annotations

from typing import Any

from engine import case as case_mod
from engine.decision import FITS, PREEMPT, UNSCHEDULABLE, Decision
from tests.support.flowgen import NOW, ds_pod, node, running


def decide(objs: list[dict[str, Any]], pre: dict[str, Any]) -> Decision:
    raw = {"name": "t", "now": NOW, "objects": objs, "preemptor": [pre]}
    return case_mod.answer(case_mod.load(raw, where="t"))


def with_port(pod: dict[str, Any], port: int) -> dict[str, Any]:
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
    return pod


def exporter() -> dict[str, Any]:
    return with_port(ds_pod("exporter-w1", required="w1", cpu_m=500), 9100)


def test_the_pod_holding_its_port_is_evicted_though_resources_fit() -> None:
    holder = with_port(running("old-exporter", node="w1", cpu_m=500, priority=0), 9100)
    d = decide([node("w1", 4, 16, 110), holder, running("web", node="w1", cpu_m=500, priority=0)], exporter())
    assert (d.outcome, d.node, [v.name for v in d.victims]) == (PREEMPT, "w1", ["old-exporter"])


def test_the_holder_goes_with_what_the_strategy_frees_for_resources() -> None:
    holder = with_port(running("old-exporter", node="w1", cpu_m=200, priority=0), 9100)
    objs = [node("w1", 2, 16, 110), holder, running("web", node="w1", cpu_m=1600, priority=0)]
    d = decide(objs, exporter())
    assert d.outcome == PREEMPT
    assert sorted(v.name for v in d.victims) == ["old-exporter", "web"]


def test_a_more_important_holder_makes_it_unschedulable() -> None:
    holder = with_port(running("agent", node="w1", cpu_m=100, priority=5000), 9100)
    d = decide([node("w1", 4, 16, 110), holder], exporter())
    assert d.outcome == UNSCHEDULABLE and "may not be evicted" in d.reason


def test_an_other_port_fits() -> None:
    holder = with_port(running("agent", node="w1", cpu_m=100, priority=5000), 9200)
    d = decide([node("w1", 4, 16, 110), holder], exporter())
    assert (d.outcome, d.node) == (FITS, "w1")


def test_an_existing_pods_anti_affinity_against_it_is_evicted() -> None:
    loner = running("loner", node="w1", cpu_m=100, priority=0)
    loner["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "exporter"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    pre = ds_pod("exporter-w1", required="w1", cpu_m=500, labels={"app": "exporter"})
    w1 = node("w1", 4, 16, 110)
    assert decide([w1, loner], pre).outcome == FITS  # no hostname label: the term reaches no node
    w1["metadata"]["labels"]["kubernetes.io/hostname"] = "w1"
    d = decide([w1, loner], pre)
    assert (d.outcome, [v.name for v in d.victims]) == (PREEMPT, ["loner"])
