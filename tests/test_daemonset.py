"""Unit tests of the DaemonSet flow (engine.daemonset), one rule each, on hand-built clusters."""

from __future__ import annotations

from typing import Any

from engine import case as case_mod
from engine import daemonset, objects
from engine.decision import EVICT, FITS, PREEMPT, UNSCHEDULABLE, WAIT, Decision
from tests.support.flowgen import NOW, daemonset_owner, ds_pod, node, running, tolerant_forever

MULTIPLE = {"daemonset": {"victimSelectionStrategy": ["multiple"]}}


def decide(objs: list[dict[str, Any]], pre: dict[str, Any], config: dict[str, Any] | None = None) -> Decision:
    raw = {"name": "t", "now": NOW, "objects": objs, "preemptor": [pre], "config": config}
    return case_mod.answer(case_mod.load(raw, where="t"))


def names(d: Decision) -> list[str]:
    return [v.name for v in d.victims]


def full(*pods: dict[str, Any], cpu: int = 2) -> list[dict[str, Any]]:
    return [node("w1", cpu, 16, 110), node("w2", 8, 16, 110), *pods]


DS = ds_pod("fluentd-w1", required="w1", cpu_m=1000)


def test_selects_the_daemonset_flow() -> None:
    assert decide(full(), DS).flow == "daemonset"


def test_unknown_required_node_is_unschedulable() -> None:
    d = decide(full(), ds_pod("fluentd-x", required="gone"))
    assert d.outcome == UNSCHEDULABLE and "does not exist" in d.reason


def test_node_filters_still_apply() -> None:
    objs = full()
    objs[0]["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    d = decide(objs, DS)
    assert d.outcome == UNSCHEDULABLE and "taint" in d.reason


def test_fits_on_the_required_node_only() -> None:
    d = decide(full(running("web", node="w1", cpu_m=1000)), DS)
    assert (d.outcome, d.node) == (FITS, "w1")
    # w2 is empty, but a DaemonSet pod may only go to its own node.
    d = decide(full(running("web", node="w1", cpu_m=2000)), DS)
    assert (d.outcome, d.node) == (PREEMPT, "w1")


def test_pod_bound_by_node_name_is_not_counted_against_itself() -> None:
    d = decide(full(running("web", node="w1", cpu_m=1000)), ds_pod("fluentd-w1", required="w1", bound=True))
    assert d.outcome == FITS


def test_start_delay_from_unschedulable_condition_then_creation() -> None:
    objs = full(running("web", node="w1", cpu_m=2000))
    cfg = {"daemonset": {"preemptionStartDelaySeconds": 60}}

    def outcome(created: str, unschedulable_since: str | None) -> str:
        pre = ds_pod("fluentd-w1", required="w1", created=created, unschedulable_since=unschedulable_since)
        return decide(objs, pre, cfg).outcome

    # The PodScheduled=False transition is the reservation's start, whatever the pod's age.
    assert outcome("2025-12-31T23:00:00Z", "2025-12-31T23:59:30Z") == WAIT
    assert outcome("2025-12-31T23:59:30Z", "2025-12-31T23:58:00Z") == PREEMPT
    # Without the condition, creationTimestamp; reaching the delay exactly is enough.
    assert outcome("2025-12-31T23:59:30Z", None) == WAIT
    assert outcome("2025-12-31T23:59:00Z", None) == PREEMPT


def test_daemonset_pods_and_terminating_pods_are_never_candidates() -> None:
    other_ds = running("kube-proxy", node="w1", cpu_m=1000, owners=[daemonset_owner("kube-proxy")])
    leaving = running("old", node="w1", cpu_m=1000, deleting=True)
    assert decide(full(other_ds, leaving), DS).outcome == UNSCHEDULABLE
    d = decide(full(other_ds, leaving, running("web", node="w1", cpu_m=1000), cpu=3), DS)
    assert names(d) == ["web"]


def test_soft_evicted_pods_are_leaving_too() -> None:
    soft = running("soft", node="w1", cpu_m=1000, labels={"scheduling.koordinator.sh/soft-eviction": "true"})
    d = decide(full(soft, running("web", node="w1", cpu_m=1000)), DS)
    assert names(d) == ["web"]


def test_equal_priority_is_a_candidate_higher_is_not() -> None:
    assert names(decide(full(running("same", node="w1", priority=1000, cpu_m=2000)), DS)) == ["same"]
    assert decide(full(running("vip", node="w1", priority=1001, cpu_m=2000)), DS).outcome == UNSCHEDULABLE


def test_tolerating_pods_are_not_candidates() -> None:
    pc = tolerant_forever()
    pod = running("t", node="w1", cpu_m=2000, priority_class="tolerant")
    pod["spec"].pop("priority")
    assert decide([pc, *full(pod)], DS).outcome == UNSCHEDULABLE


def test_class_order_regular_then_owner_then_opt_out() -> None:
    objs = full(
        running("opt-out", node="w1", priority=0, cpu_m=500, opt_out="annotation"),
        running("driver", node="w1", priority=0, cpu_m=500),
        running("plain", node="w1", priority=900, cpu_m=500),
        running("opt-label", node="w1", priority=0, cpu_m=500, opt_out="label"),
        running(
            "executor", node="w2", cpu_m=500, owners=[{"kind": "Pod", "name": "driver", "uid": "driver-uid"}]
        ),
    )
    c = case_mod.load({"now": NOW, "objects": objs, "preemptor": [DS]}, where="t")
    ordered = daemonset.candidates(c.cluster, c.cluster.nodes["w1"], c.preemptors[0], 1000, c.now)
    assert [(x.pod.name, daemonset.CLASS_NAMES[x.klass]) for x in ordered] == [
        ("plain", "regular"),
        ("driver", "owner"),
        ("opt-label", "opt-out"),
        ("opt-out", "opt-out"),
    ]
    d = decide(objs, DS)
    assert names(d) == ["plain", "driver"]
    assert [x["class"] for x in d.explanation["candidates"]] == ["regular", "owner", "opt-out", "opt-out"]


def test_within_a_class_lower_priority_then_younger_then_larger() -> None:
    objs = full(
        running("old-small", node="w1", priority=5, cpu_m=200, created="2025-12-31T20:00:00Z"),
        running("old-big", node="w1", priority=5, cpu_m=300, created="2025-12-31T20:00:00Z"),
        running("young", node="w1", priority=5, cpu_m=200, created="2025-12-31T23:00:00Z"),
        running("lowest", node="w1", priority=1, cpu_m=200, created="2025-12-31T20:00:00Z"),
    )
    c = case_mod.load({"now": NOW, "objects": objs, "preemptor": [DS]}, where="t")
    ordered = daemonset.candidates(c.cluster, c.cluster.nodes["w1"], c.preemptors[0], 1000, c.now)
    assert [x.pod.name for x in ordered] == ["lowest", "young", "old-big", "old-small"]


def test_single_picks_the_closest_deviation() -> None:
    objs = full(
        running("far", node="w1", cpu_m=1500, created="2025-12-31T23:00:00Z"),
        running("close", node="w1", cpu_m=1050),
        running("near", node="w1", cpu_m=1080),
        cpu=4,
    )
    # Candidate order is far (youngest), near, close (same age, larger first); closest wins.
    d = decide(
        objs, DS, {"daemonset": {"victimSelectionStrategy": ["single"], "singleVictimDeviationPercent": 10}}
    )
    assert d.outcome == PREEMPT and names(d) == ["close"]
    assert [c["deviationPercent"] for c in d.explanation["candidates"]] == [50.0, 8.0, 5.0]


def test_single_needs_every_requested_resource_close() -> None:
    victim = running("mem", node="w1", cpu_m=1000, mem_gi=1)
    pod = objects.pod(victim)
    assert daemonset.deviation(pod, {"cpu": 1000, "pods": 1}) is None
    assert daemonset.deviation(pod, {"cpu": 1000, "memory": 2**30, "pods": 1}) == 0
    cfg = {"daemonset": {"victimSelectionStrategy": ["single"]}}
    assert decide(full(victim, cpu=1), DS, cfg).outcome == UNSCHEDULABLE
    assert decide(full(running("cpu-only", node="w1", cpu_m=1000), cpu=1), DS, cfg).outcome == PREEMPT


def test_single_then_multiple_fallback() -> None:
    objs = full(running("a", node="w1", cpu_m=600), running("b", node="w1", cpu_m=600), cpu=1)
    objs[0]["status"]["allocatable"]["cpu"] = "1200m"
    cfg = {"daemonset": {"victimSelectionStrategy": ["single", "multiple"]}}
    d = decide(objs, DS, cfg)
    assert sorted(names(d)) == ["a", "b"] and d.reason.startswith("multiple")
    assert [s["strategy"] for s in d.explanation["strategies"]] == ["single", "multiple"]


def test_multiple_fails_past_max_victims() -> None:
    pods = [running(f"s{i}", node="w1", cpu_m=400) for i in range(3)]
    objs = full(*pods)
    objs[0]["status"]["allocatable"]["cpu"] = "1200m"
    assert decide(objs, DS, {"daemonset": {"maxVictims": 2}}).outcome == UNSCHEDULABLE
    assert len(decide(objs, DS, {"daemonset": {"maxVictims": 3}}).victims) == 3


def test_victim_action_follows_config() -> None:
    d = decide(full(running("web", node="w1", cpu_m=2000)), DS, {"victimAction": "evict"})
    assert [v.action for v in d.victims] == [EVICT]


def test_policy_never_does_not_preempt() -> None:
    pre = ds_pod("fluentd-w1", required="w1", policy="Never")
    assert decide(full(running("web", node="w1", cpu_m=2000)), pre).outcome == UNSCHEDULABLE


def test_higher_priority_nominated_pod_keeps_its_room() -> None:
    vip = running("vip", node="w1", priority=5000, cpu_m=1000)
    vip["spec"].pop("nodeName")
    vip["status"] = {"phase": "Pending", "nominatedNodeName": "w1"}
    d = decide(full(running("web", node="w1", cpu_m=1000), vip), DS)
    # Without vip's promised 1 CPU the pod would fit; with it, web must go.
    assert d.outcome == PREEMPT and names(d) == ["web"]


def test_wait_while_its_earlier_victims_are_terminating() -> None:
    leaving = running("old", node="w1", cpu_m=1000, deleting=True, disruption=True)
    objs = full(leaving, running("web", node="w1", cpu_m=1000))
    assert names(decide(objs, DS)) == ["web"]
    nominated = ds_pod("fluentd-w1", required="w1", nominated="w1")
    assert decide(objs, nominated).outcome == WAIT


def test_its_own_wait_rule_holds_for_victims_evicted_through_the_eviction_api() -> None:
    """Issue 28, 8: this flow keeps "any DisruptionTarget reason" (docs/semantics.md §6). Its
    `evict` victims carry EvictionByEvictionAPI, and terminating pods are never its candidates:
    under the default flow's rule (PreemptionByScheduler only) it would evict `web` as well
    while `old` is still on its way out. A plain delete (no condition) holds nothing."""
    nominated = ds_pod("fluentd-w1", required="w1", nominated="w1")
    evicted = running("old", node="w1", cpu_m=1000, deleting=True)
    evicted["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    )
    assert decide(full(evicted, running("web", node="w1", cpu_m=1000)), nominated).outcome == WAIT
    deleted = running("old", node="w1", cpu_m=1000, deleting=True)
    d = decide(full(deleted, running("web", node="w1", cpu_m=1000)), nominated)
    assert d.outcome == PREEMPT and names(d) == ["web"]
