"""Unit tests of the default flow, one rule each, on hand-built clusters."""

from __future__ import annotations

from typing import Any

from engine import case as case_mod
from engine import cluster as cluster_mod
from engine import default, objects
from engine.decision import FITS, PREEMPT, UNSCHEDULABLE, WAIT, Decision
from tests.support.gen import NOW, node, pdb, pod


def decide(objs: list[dict[str, Any]], pre: dict[str, Any], config: dict[str, Any] | None = None) -> Decision:
    raw = {"name": "t", "now": NOW, "objects": objs, "preemptor": [pre], "config": config}
    return case_mod.answer(case_mod.load(raw, where="t"))


def victims(d: Decision) -> list[str]:
    return sorted(v.name for v in d.victims)


def test_fits_without_eviction_prefers_nominated_node() -> None:
    objs = [node("n1", 4, 8, 10), node("n2", 4, 8, 10)]
    assert decide(objs, pod("x", node=None, priority=1, cpu_m=1000)).node == "n1"
    d = decide(objs, pod("x", node=None, priority=1, cpu_m=1000, nominated="n2"))
    assert (d.outcome, d.node, d.victims) == (FITS, "n2", ())


def test_policy_never_does_not_preempt() -> None:
    objs = [node("n1", 1, 8, 10), pod("low", node="n1", priority=0, cpu_m=1000)]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000, policy="Never"))
    assert d.outcome == UNSCHEDULABLE and "Never" in d.reason


def test_equal_priority_is_never_a_victim() -> None:
    objs = [node("n1", 1, 8, 10), pod("same", node="n1", priority=10, cpu_m=1000)]
    assert decide(objs, pod("x", node=None, priority=10, cpu_m=1000)).outcome == UNSCHEDULABLE


def test_reprieve_keeps_most_important_pods() -> None:
    objs = [
        node("n1", 3, 8, 10),
        pod("old", node="n1", priority=0, cpu_m=1000, start="2025-12-31T20:00:00Z"),
        pod("young", node="n1", priority=0, cpu_m=1000, start="2025-12-31T23:00:00Z"),
        pod("mid", node="n1", priority=5, cpu_m=1000),
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000))
    assert victims(d) == ["young"]


def test_qos_ranks_between_priority_and_start_time() -> None:
    objs = [
        node("n1", 2, 8, 10),
        pod("burstable", node="n1", priority=0, cpu_m=1000, mem_gi=1, start="2025-12-31T20:00:00Z"),
        pod(
            "guaranteed",
            node="n1",
            priority=0,
            cpu_m=1000,
            mem_gi=1,
            start="2025-12-31T23:00:00Z",
            guaranteed=True,
        ),
    ]
    assert victims(decide(objs, pod("x", node=None, priority=10, cpu_m=1000))) == ["burstable"]


def test_pdb_violating_pods_are_reprieved_first() -> None:
    objs = [
        node("n1", 2, 8, 10),
        pod("covered", node="n1", priority=0, cpu_m=1000, labels={"app": "db"}),
        pod("free", node="n1", priority=5, cpu_m=1000),
        pdb("pdb", "db", 0),
    ]
    assert victims(decide(objs, pod("x", node=None, priority=10, cpu_m=1000))) == ["free"]


def test_disrupted_pods_do_not_use_the_budget() -> None:
    c = cluster_mod.build(
        [
            objects.normalize(o)
            for o in [node("n1", 2, 8, 10), pod("a", node="n1", priority=0, cpu_m=1000, labels={"app": "db"})]
        ]
    )
    raw = pdb("p", "db", 0)
    raw["status"]["disruptedPods"] = {"a": "2026-01-01T00:00:00Z"}
    c.upsert(objects.normalize(raw))
    assert default.pdb_violating(c, [c.pods["a-uid"]]) == [False]


def test_node_choice_prefers_fewer_pdb_violations_over_priority() -> None:
    objs = [
        node("n1", 1, 8, 10),
        pod("a", node="n1", priority=0, cpu_m=1000, labels={"app": "db"}),
        node("n2", 1, 8, 10),
        pod("b", node="n2", priority=5, cpu_m=1000),
        pdb("pdb", "db", 0),
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000))
    assert (d.node, victims(d)) == ("n2", ["b"])


def test_nominated_higher_priority_pods_count_as_bound() -> None:
    objs = [node("n1", 2, 8, 10), pod("nom", node=None, priority=50, cpu_m=2000, nominated="n1")]
    assert decide(objs, pod("x", node=None, priority=10, cpu_m=1000)).outcome == UNSCHEDULABLE
    # a lower-priority nomination is not counted: capacity is not promised over the preemptor
    objs[1] = pod("nom", node=None, priority=5, cpu_m=2000, nominated="n1")
    assert decide(objs, pod("x", node=None, priority=10, cpu_m=1000)).outcome == FITS


def test_wait_while_earlier_victims_terminate_on_nominated_node() -> None:
    objs = [
        node("n1", 1, 8, 10),
        pod("leaving", node="n1", priority=0, cpu_m=1000, deleting=True, disruption=True),
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000, nominated="n1"))
    assert d.outcome == WAIT and "leaving" in d.reason
    # not nominated there: it may list the terminating pod as a victim again (no action needed)
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000))
    assert d.outcome == PREEMPT and d.victims[0].terminating


def test_only_preemptions_under_way_are_waited_for() -> None:
    """kube-scheduler waits only for its own preemptions (DisruptionTarget reason
    PreemptionByScheduler): a pod someone else evicts or drains does not hold the preemptor."""
    evicted = pod("leaving", node="n1", priority=0, cpu_m=1000, deleting=True)
    evicted["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    )
    d = decide([node("n1", 1, 8, 10), evicted], pod("x", node=None, priority=10, cpu_m=1000, nominated="n1"))
    assert d.outcome == PREEMPT and d.victims[0].terminating


def test_no_wait_on_a_nominated_node_too_small_for_the_preemptor() -> None:
    """A nominated node whose allocatable shrank below the request is unresolvable upstream:
    the preemptor preempts again elsewhere instead of waiting for victims there."""
    objs = [
        node("n1", 1, 8, 10),  # shrank from 2 CPUs: x (1.5 CPU) can never run here again
        pod("leaving", node="n1", priority=0, cpu_m=1000, deleting=True, disruption=True),
        node("n2", 2, 8, 10),
        pod("b", node="n2", priority=0, cpu_m=2000),
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1500, nominated="n1"))
    assert (d.outcome, d.node, victims(d)) == (PREEMPT, "n2", ["b"])


def test_pods_without_labels_count_against_no_pdb() -> None:
    """filterPodsWithPDBViolation skips pods without labels, even under a selector their
    empty label set matches (NotIn, DoesNotExist): no violation on n1, whose victim is cheaper."""
    budget = pdb("not-x", "x", 0)
    budget["spec"]["selector"] = {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]}
    objs = [
        node("n1", 1, 8, 10),
        pod("bare", node="n1", priority=1, cpu_m=1000),
        node("n2", 1, 8, 10),
        pod("labelled", node="n2", priority=2, cpu_m=1000, labels={"app": "x"}),
        budget,
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000))
    assert (d.node, victims(d), d.explanation["chosen"]["pdbViolations"]) == ("n1", ["bare"], 0)
    for expression in (
        {"key": "app", "operator": "DoesNotExist"},
        {"key": "app", "operator": "NotIn", "values": ["x"]},
    ):
        budget["spec"]["selector"] = {"matchExpressions": [expression]}
        objs[1]["metadata"]["labels"] = {"tier": "t"}  # labelled: now the budget counts it
        d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000))
        assert (d.node, victims(d)) == ("n2", ["labelled"]), expression
        objs[1]["metadata"]["labels"] = {}


def test_a_class_of_zero_seconds_protects_pods_not_scheduled_yet() -> None:
    """PreemptionToleration exempts a pod without PodScheduled=True before it reads
    toleration-seconds: even 0 (or no seconds annotation) protects it from preemptors below
    the minimum. Ten pods a node, so the summaries' bounds decide too, not only evaluations."""
    cls = {
        "kind": "PriorityClass",
        "metadata": {
            "name": "guarded",
            "annotations": {"preemption-toleration.scheduling.x-k8s.io/minimum-preemptable-priority": "1000"},
        },
        "value": 1,
    }
    objs: list[dict[str, Any]] = [cls, node("n1", 10, 8, 20), node("n2", 10, 8, 20)]
    for n in ("n1", "n2"):
        for i in range(10):
            p = pod(f"{n}-{i}", node=n, priority=1 if n == "n1" else 5, cpu_m=1000, priority_class="guarded")
            if n == "n1":
                p["status"]["conditions"] = []  # bound by nodeName, not scheduled: no PodScheduled
            else:
                p["spec"]["priorityClassName"] = ""
            objs.append(p)
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000))
    assert (d.outcome, d.node, victims(d)) == (PREEMPT, "n2", ["n2-9"])
    assert decide(objs, pod("x", node=None, priority=1000, cpu_m=1000)).node == "n1"


def test_terminal_pods_use_nothing() -> None:
    done = pod("done", node="n1", priority=100, cpu_m=1000)
    done["status"]["phase"] = "Succeeded"
    assert decide([node("n1", 1, 8, 10), done], pod("x", node=None, priority=1, cpu_m=1000)).outcome == FITS


def test_explanation_ranks_candidates_and_names_rejections() -> None:
    objs = [
        node("n1", 1, 8, 10),
        pod("a", node="n1", priority=5, cpu_m=1000),
        node("n2", 1, 8, 10),
        pod("b", node="n2", priority=1, cpu_m=1000),
        node("n3", 1, 8, 10, taint=True),
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000))
    ex = d.explanation
    assert [c["node"] for c in ex["candidates"]] == ["n2", "n1"]
    assert ex["candidates"][0]["highestVictimPriority"] == 1
    assert ex["rejected"] == [{"node": "n3", "reason": "untolerated taint dedicated=x:NoSchedule"}]
    assert ex["chosen"]["node"] == "n2"


def test_violations_are_counted_on_final_victims_not_pre_reprieve_flags() -> None:
    """docs/semantics.md §3: a node whose reprieve gives back the PDB's more important pod ranks as 0.

    On n1, `big` (older) spends web's one allowed disruption, so `small` is flagged
    PDB-violating and tried first in the reprieve; it must go, and `big` comes back.
    Evicting `small` alone is within web's budget: 0 violations. kube-scheduler would
    count small's flag (1 violation) and prefer n2, whose victim has a higher priority.
    """
    objs = [
        node("n1", 3, 8, 10),
        node("n2", 2, 8, 10),
        pod("big", node="n1", priority=0, cpu_m=1000, labels={"app": "web"}, start="2025-12-31T20:00:00Z"),
        pod("small", node="n1", priority=0, cpu_m=2000, labels={"app": "web"}, start="2025-12-31T22:00:00Z"),
        pod("other", node="n2", priority=5, cpu_m=2000),
        pdb("web", "web", 1),
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=2000))
    assert (d.outcome, d.node, victims(d)) == (PREEMPT, "n1", ["small"])
    by_node = {c["node"]: c for c in d.explanation["candidates"]}
    assert by_node["n1"]["pdbViolations"] == 0
    chosen = {p["pod"]: p for p in d.explanation["chosen"]["potentialVictims"]}
    # The reprieve order still follows upstream's classification: small flagged, tried first.
    assert chosen["default/small"]["pdbViolating"] and chosen["default/small"]["victim"]
    assert not chosen["default/big"]["pdbViolating"] and not chosen["default/big"]["victim"]


def test_a_victim_beyond_the_budget_is_still_a_violation() -> None:
    objs = [
        node("n1", 2, 8, 10),
        pod("a", node="n1", priority=0, cpu_m=1000, labels={"app": "web"}),
        pod("b", node="n1", priority=0, cpu_m=1000, labels={"app": "web"}),
        pdb("web", "web", 1),
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=2000))
    assert victims(d) == ["a", "b"] and d.explanation["chosen"]["pdbViolations"] == 1


def test_minimal_ties_go_to_the_latest_started_highest_priority_victims() -> None:
    """Equal (violations, highest, count, sum) on two nodes: evict the pod that lost the least work."""
    objs = [
        node("n1", 1, 8, 10),
        node("n2", 1, 8, 10),
        pod("older", node="n1", priority=0, cpu_m=1000, start="2025-12-31T20:00:00Z"),
        pod("younger", node="n2", priority=0, cpu_m=1000, start="2025-12-31T23:00:00Z"),
    ]
    d = decide(objs, pod("x", node=None, priority=10, cpu_m=1000), {"victimSelection": "minimal"})
    assert (d.node, victims(d)) == ("n2", ["younger"])
