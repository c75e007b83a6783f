"""Unit tests of the job flow (engine.job), one rule each, on hand-built clusters."""

from __future__ import annotations

import json
from typing import Any

from engine import case as case_mod
from engine import cluster as cluster_mod
from engine import config as config_mod
from engine import flows, job, objects
from engine.decision import DELETE, FITS, LABEL, PREEMPT, UNSCHEDULABLE, WAIT, Decision
from tests.support.flowgen import NOW, jpod, node, quota, tolerant_forever

GROUP = "job1"


def member(name: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("priority", 1000)
    kw.setdefault("group", GROUP)
    return jpod(name, **kw)


def decide(
    objs: list[dict[str, Any]], pre: list[dict[str, Any]], config: dict[str, Any] | None = None
) -> Decision:
    raw = {"name": "t", "now": NOW, "objects": objs, "preemptor": pre, "config": config}
    return case_mod.answer(case_mod.load(raw, where="t"))


def build(objs: list[dict[str, Any]]) -> cluster_mod.Cluster:
    return cluster_mod.build([objects.normalize(o) for o in objs])


def names(d: Decision) -> list[str]:
    return sorted(v.name for v in d.victims)


def borrowed(name: str, *, priority: int = 0, cpu_m: int = 2000, **kw: Any) -> dict[str, Any]:
    """A team-b pod running on n1: the usual victim."""
    return jpod(name, namespace="team-b", node="n1", priority=priority, cpu_m=cpu_m, **kw)


def seed_cluster(
    *, max_cpu: int = 12, min_cpu: int = 4, b_label: str | None = "true"
) -> list[dict[str, Any]]:
    """The seed's picture: an 8-CPU node full with team-a's steady pod and two borrowed team-b pods."""
    return [
        node("n1", 8, 32, 110),
        quota("quota-a", "team-a", min_cpu=min_cpu, max_cpu=max_cpu),
        quota("quota-b", "team-b", min_cpu=0, max_cpu=8),
        jpod("a-steady", node="n1", priority=1000, cpu_m=2000, quota_name="quota-a", preemptible="false"),
        borrowed("b-1", cpu_m=3000, priority=100, preemptible=b_label, start="2025-12-31T20:00:00Z"),
        borrowed("b-2", cpu_m=3000, priority=100, preemptible=b_label, start="2025-12-31T22:00:00Z"),
    ]


def gang(n: int, *, cpu_m: int = 3000, **kw: Any) -> list[dict[str, Any]]:
    return [
        member(f"job1-{i}", cpu_m=cpu_m, quota_name="quota-a", preemptible="true", **kw) for i in range(n)
    ]


# ---- membership ----------------------------------------------------------------------


def test_job_pod_by_pod_group_label_quota_label_or_namespace_quota() -> None:
    c = build([quota("q", "team-a", min_cpu=1, max_cpu=2)])
    grouped = objects.pod(jpod("g", namespace="other", group="g1"))
    labelled = objects.pod(jpod("l", namespace="other", quota_name="q"))
    in_namespace = objects.pod(jpod("n", namespace="team-a"))
    plain = objects.pod(jpod("p", namespace="other"))
    assert [job.is_job_pod(c, p) for p in (grouped, labelled, in_namespace, plain)] == [
        True,
        True,
        True,
        False,
    ]
    assert flows.select_flow(c, [plain]) == "default"
    assert flows.select_flow(c, [in_namespace]) == "job"


def test_quota_label_wins_and_a_missing_quota_falls_back_to_the_namespace() -> None:
    c = build(
        [quota("q", "team-a", min_cpu=1, max_cpu=2), quota("elsewhere", "team-b", min_cpu=1, max_cpu=2)]
    )

    def quota_name(**kw: Any) -> str | None:
        q = job.quota_of(c, objects.pod(jpod("x", **kw)))
        return None if q is None else q.name

    assert quota_name(quota_name="elsewhere") == "elsewhere"
    assert quota_name(quota_name="nope") == "q"
    assert quota_name(namespace="none", quota_name="nope") is None


def test_a_quota_label_naming_no_quota_leaves_a_pod_in_the_default_flow() -> None:
    """Only a pod charged to an ElasticQuota takes the job flow (docs/semantics.md §2, docs/flows.md).

    A quota label naming a quota that does not exist falls back to the namespace's
    quota; with none there, the pod is charged to nothing. The label alone sent it
    to the job flow, whose victims are soft-evicted by default: with no Koordinator
    deleter behind a deleted quota, they would never leave.
    """
    c = build([node("n1", 2, 8, 110), jpod("low", namespace="other", node="n1", cpu_m=2000)])
    stale = objects.pod(jpod("x", namespace="other", quota_name="deleted", priority=100, cpu_m=1000))
    empty_group = objects.pod(
        jpod("y", namespace="other", priority=100, cpu_m=1000, labels={job.POD_GROUP: ""})
    )
    assert not job.is_job_pod(c, stale) and not job.is_job_pod(c, empty_group)
    assert flows.select_flow(c, [stale]) == flows.select_flow(c, [empty_group]) == "default"
    d = flows.decide(c, [stale], now=0, config=config_mod.Config())
    assert d.flow == "default" and [v.action for v in d.victims] == [config_mod.Config().victim_action]


def test_single_pod_brings_its_pending_group_in_name_order() -> None:
    objs = [
        node("n1", 8, 8, 110),
        member("b", cpu_m=100),
        member("c", cpu_m=100, node="n1"),  # bound: already running, not placed again
        member("d", cpu_m=100, namespace="team-b"),  # same group name, other namespace
        jpod("e", cpu_m=100, group="other"),
    ]
    c = build(objs)
    a = objects.pod(member("a", cpu_m=100))
    assert [p.name for p in job.gang(c, [a])] == ["a", "b"]
    d = flows.decide(c, [a], now=0, config=config_mod.Config())
    assert d.outcome == FITS and d.preemptor == "team-a/job1"
    assert d.placements == {"team-a/a": "n1", "team-a/b": "n1"}


def test_preemptor_name_without_pod_group_is_the_pod() -> None:
    objs = [node("n1", 8, 8, 110), quota("q", "team-a", min_cpu=8, max_cpu=8)]
    d = decide(objs, [jpod("solo", priority=1)])
    assert (d.flow, d.preemptor, d.outcome) == ("job", "team-a/solo", FITS)


# ---- preemptible, may trigger ----------------------------------------------------------


def test_preemptible_label_and_default() -> None:
    on, off = config_mod.Config(), config_mod.parse({"quota": {"disableDefaultPreemptible": True}})
    unlabelled = objects.pod(jpod("u"))
    assert job.is_preemptible(unlabelled, on) and not job.is_preemptible(unlabelled, off)
    assert job.is_preemptible(objects.pod(jpod("t", preemptible="true")), off)
    assert not job.is_preemptible(objects.pod(jpod("f", preemptible="false")), on)


def test_may_trigger_rules() -> None:
    c = build([])
    plain, strict = (
        config_mod.Config(),
        config_mod.parse({"quota": {"disableDefaultTriggerPreemption": True}}),
    )
    default_pod = objects.pod(jpod("d"))
    labelled = objects.pod(jpod("l", can_preempt="true"))
    never = objects.pod(jpod("n", can_preempt="true", policy="Never"))
    assert job.may_trigger(c, default_pod, plain) and not job.may_trigger(c, default_pod, strict)
    assert job.may_trigger(c, labelled, strict)
    assert not job.may_trigger(c, never, plain)


def test_never_through_the_priority_class_blocks_the_job() -> None:
    pc = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "hi"},
        "value": 1000,
        "preemptionPolicy": "Never",
    }
    pre = [dict(p, spec=dict(p["spec"], priorityClassName="hi")) for p in gang(2)]
    d = decide([*seed_cluster(), pc], pre)
    assert d.outcome == UNSCHEDULABLE and "may not trigger" in d.reason and d.victims == ()


# ---- admission -------------------------------------------------------------------------


def test_preemptible_job_over_max_is_refused_with_the_numbers() -> None:
    d = decide(seed_cluster(max_cpu=6), gang(2))
    assert d.outcome == UNSCHEDULABLE and d.victims == ()
    check = d.explanation["quotas"][0]["checks"][0]
    assert check["formula"].startswith("min(min, nonPreemptibleUsed)")
    assert (check["value"], check["limit"], check["ok"]) == ("2 + 0 + 6 = 8", "6", False)


def test_non_preemptible_job_must_fit_in_min() -> None:
    pre = [member(f"job1-{i}", cpu_m=3000, quota_name="quota-a", preemptible="false") for i in range(2)]
    assert decide(seed_cluster(min_cpu=8), pre).outcome == PREEMPT
    d = decide(seed_cluster(min_cpu=7), pre)
    assert d.outcome == UNSCHEDULABLE and "nonPreemptibleUsed + jobRequest <= min" in d.reason


def test_admission_is_per_resource_named_in_the_quota() -> None:
    objs = seed_cluster()
    objs[1]["spec"]["max"]["memory"] = "1Gi"
    d = decide(objs, gang(2, mem_gi=1))
    assert d.outcome == UNSCHEDULABLE and "for memory" in d.reason


def test_mixed_job_passes_both_formulas() -> None:
    pre = [
        member("job1-0", cpu_m=3000, quota_name="quota-a", preemptible="false"),
        member("job1-1", cpu_m=3000, quota_name="quota-a", preemptible="true"),
    ]
    # Non-preemptible: 2 + 3 <= min 4 fails.
    assert decide(seed_cluster(min_cpu=4), pre).outcome == UNSCHEDULABLE
    assert decide(seed_cluster(min_cpu=5), pre).outcome == PREEMPT


def test_fits_is_gated_by_the_quota_too() -> None:
    objs = [node("n1", 8, 8, 110), quota("q", "team-a", min_cpu=0, max_cpu=1)]
    d = decide(objs, [member("m", cpu_m=2000, preemptible="true")])
    assert d.outcome == UNSCHEDULABLE and d.reason.startswith("quota")


# ---- placement and victims ---------------------------------------------------------------


def test_seed_gang_reclaims_both_borrowed_pods_and_labels_them() -> None:
    d = decide(seed_cluster(), gang(2))
    assert d.outcome == PREEMPT and names(d) == ["b-1", "b-2"]
    assert d.placements == {"team-a/job1-0": "n1", "team-a/job1-1": "n1"}
    assert {v.action for v in d.victims} == {LABEL}
    assert d.members == ("team-a/job1-0", "team-a/job1-1")


def test_delete_action_when_configured() -> None:
    d = decide(seed_cluster(), gang(2), {"quota": {"podShouldBeDeletedWhenPreempted": True}})
    assert names(d) == ["b-1", "b-2"] and {v.action for v in d.victims} == {DELETE}


def test_all_or_nothing() -> None:
    d = decide(seed_cluster(), gang(3))
    assert d.outcome == UNSCHEDULABLE and d.victims == () and "all or nothing" in d.reason


def test_unlabelled_pods_are_safe_when_default_preemptible_is_disabled() -> None:
    d = decide(seed_cluster(b_label=None), gang(2), {"quota": {"disableDefaultPreemptible": True}})
    assert d.outcome == UNSCHEDULABLE and d.victims == ()
    assert decide(seed_cluster(b_label=None), gang(2)).outcome == PREEMPT


def test_only_lower_priority_pods_are_victims() -> None:
    objs = [node("n1", 2, 8, 110), jpod("same", namespace="team-b", node="n1", priority=1000, cpu_m=2000)]
    assert decide(objs, [member("m", cpu_m=2000)]).outcome == UNSCHEDULABLE


def test_tolerating_pods_are_not_victims() -> None:
    pc = tolerant_forever()
    objs = [pc, node("n1", 2, 8, 110), borrowed("t", priority_class="tolerant")]
    objs[-1]["spec"].pop("priority")
    assert decide(objs, [member("m", cpu_m=2000)]).outcome == UNSCHEDULABLE


def test_gang_spreads_when_earlier_members_fill_a_node() -> None:
    objs = [node("n1", 2, 8, 110), node("n2", 2, 8, 110)]
    d = decide(objs, [member("a", cpu_m=1500), member("b", cpu_m=1500)])
    assert d.outcome == FITS and d.placements == {"team-a/a": "n1", "team-a/b": "n2"}


def test_member_takes_a_free_node_before_evicting() -> None:
    objs = [
        node("n1", 2, 8, 110),
        node("n2", 2, 8, 110),
        jpod("low", namespace="team-b", node="n1", priority=0, cpu_m=2000),
    ]
    d = decide(objs, [member("a", cpu_m=2000), member("b", cpu_m=2000)])
    # a takes the free n2; b can only evict on n1.
    assert (
        d.outcome == PREEMPT and d.placements == {"team-a/a": "n2", "team-a/b": "n1"} and names(d) == ["low"]
    )


def test_member_goes_where_the_default_criteria_rank_best() -> None:
    objs = [
        node("n1", 2, 8, 110),
        node("n2", 2, 8, 110),
        jpod("mid", namespace="team-b", node="n1", priority=500, cpu_m=2000),
        jpod("low", namespace="team-b", node="n2", priority=0, cpu_m=2000),
    ]
    d = decide(objs, [member("a", cpu_m=2000)])
    assert (d.node, d.placements) == ("n2", None) and names(d) == ["low"]
    assert d.explanation["placements"][0]["candidates"][0]["node"] == "n2"


def test_reprieve_gives_back_what_the_gang_does_not_need() -> None:
    objs = [
        node("n1", 4, 8, 110),
        jpod("old", namespace="team-b", node="n1", priority=0, cpu_m=1000, start="2025-12-31T20:00:00Z"),
        jpod("young", namespace="team-b", node="n1", priority=0, cpu_m=1000, start="2025-12-31T23:00:00Z"),
        jpod("big", namespace="team-b", node="n1", priority=0, cpu_m=2000, start="2025-12-31T22:00:00Z"),
    ]
    d = decide(objs, [member("a", cpu_m=1000), member("b", cpu_m=1000)])
    # Member a alone would evict young and b then big; with both placed, everything is
    # assigned back in importance order (old, big, young): big cannot stay, young can.
    assert d.outcome == PREEMPT and names(d) == ["big"]
    assert d.explanation["placements"][0]["candidates"][0]["victimPods"] == ["team-b/young"]


def test_nominated_members_are_not_counted_twice() -> None:
    objs = [node("n1", 2, 8, 110), jpod("low", namespace="team-b", node="n1", priority=0, cpu_m=1000)]
    pre = [member("a", cpu_m=1000, nominated="n1"), member("b", cpu_m=1000, nominated="n1")]
    d = decide(objs, pre)
    assert d.outcome == PREEMPT and names(d) == ["low"]


def test_higher_priority_nominated_outsider_is_counted() -> None:
    objs = [
        node("n1", 2, 8, 110),
        jpod("vip", namespace="team-b", priority=5000, cpu_m=1000, nominated="n1"),
        jpod("low", namespace="team-b", node="n1", priority=0, cpu_m=1000),
    ]
    assert decide(objs, [member("a", cpu_m=2000)]).outcome == UNSCHEDULABLE


# ---- leaving pods and the previous round -----------------------------------------------------


def test_wait_while_the_previous_round_is_unfinished() -> None:
    objs = [
        node("n1", 2, 8, 110),
        jpod("low", namespace="team-b", node="n1", priority=0, cpu_m=2000, deleting=True, disruption=True),
    ]
    d = decide(objs, [member("a", cpu_m=2000, nominated="n1")])
    assert d.outcome == WAIT and d.victims == () and "terminating" in d.reason


def test_only_a_preemptions_victims_hold_the_job() -> None:
    """Issue 28, 8: the default flow's wait rule. A pod terminating for another reason (a drain's
    eviction, a plain delete) does not hold a member's nomination: the job preempts again,
    listing it among its victims with nothing more to do, and takes nobody else for it."""
    for reason in ("EvictionByEvictionAPI", None):
        low = jpod("low", namespace="team-b", node="n1", priority=0, cpu_m=2000, deleting=True)
        if reason:
            low["status"]["conditions"].append(
                {"type": "DisruptionTarget", "status": "True", "reason": reason}
            )
        other = jpod("other", namespace="team-b", node="n1", priority=0, cpu_m=0)
        d = decide([node("n1", 2, 8, 110), low, other], [member("a", cpu_m=2000, nominated="n1")])
        assert d.outcome == PREEMPT and names(d) == ["low"] and d.victims[0].terminating, reason


def test_soft_evicted_victim_counts_as_leaving() -> None:
    objs = [node("n1", 2, 8, 110), borrowed("low", soft_evicted=True)]
    d = decide(objs, [member("a", cpu_m=2000, nominated="n1")])
    assert d.outcome == WAIT and "soft-evicted" in d.reason
    # Not nominated yet: the soft-evicted pod may be listed again, with nothing more to do to it.
    d = decide(objs, [member("a", cpu_m=2000)])
    assert d.outcome == PREEMPT and names(d) == ["low"] and d.victims[0].terminating


def test_terminating_pod_may_be_listed_again() -> None:
    objs = [node("n1", 2, 8, 110), borrowed("low", deleting=True)]
    d = decide(objs, [member("a", cpu_m=2000)])
    assert d.outcome == PREEMPT and d.victims[0].terminating


def test_soft_eviction_patch() -> None:
    patch = job.soft_eviction_annotation("d-1", "team-a/job1", "team-a/job1", "preempted")
    assert patch["metadata"]["labels"] == {job.SOFT_EVICTION: "true"}
    text = patch["metadata"]["annotations"][job.SOFT_EVICTION]
    assert json.loads(text) == {
        "preemptJob": "team-a/job1",
        "preemptor": "team-a/job1",
        "decisionId": "d-1",
        "reason": "preempted",
    }
    assert text == json.dumps(json.loads(text), sort_keys=True)


def test_minimal_selection_keeps_its_smaller_victim_set() -> None:
    objs = [
        node("n1", 5, 8, 110),
        jpod("a", namespace="team-b", node="n1", priority=0, cpu_m=2000, start="2025-12-31T20:00:00Z"),
        jpod("b", namespace="team-b", node="n1", priority=0, cpu_m=1000, start="2025-12-31T21:00:00Z"),
        jpod("c", namespace="team-b", node="n1", priority=0, cpu_m=1000, start="2025-12-31T22:00:00Z"),
        jpod("d", namespace="team-b", node="n1", priority=0, cpu_m=1000, start="2025-12-31T23:00:00Z"),
    ]
    pre = [member("m", cpu_m=3000)]
    # Greedy reprieve keeps the oldest (a) and so needs b, c and d; two pods suffice.
    assert names(decide(objs, pre)) == ["b", "c", "d"]
    assert len(decide(objs, pre, {"victimSelection": "minimal"}).victims) == 2


# ---- the answer's shape and minimal-mode ties (docs/semantics.md §2, §7) -----------------


def test_a_quota_pod_alone_is_answered_with_node() -> None:
    objs = [
        node("n1", 2, 8, 110),
        quota("quota-a", "team-a", min_cpu=4, max_cpu=8),
        jpod("low", namespace="team-b", node="n1", priority=0, cpu_m=2000),
    ]
    lone = jpod("lone", priority=1000, cpu_m=2000)  # no pod-group label: a job of one through its quota
    d = decide(objs, [lone])
    assert (d.flow, d.outcome, d.node, d.placements) == ("job", PREEMPT, "n1", None)
    assert d.preemptor == "team-a/lone" and names(d) == ["low"]
    answer = d.answer()
    assert answer["node"] == "n1" and "placements" not in answer


def test_a_pod_group_of_one_is_answered_with_node_and_fits_too() -> None:
    objs = [node("n1", 2, 8, 110), node("n2", 2, 8, 110)]
    d = decide(objs, [member("solo", cpu_m=1000)])
    assert (d.flow, d.outcome, d.node, d.placements) == ("job", FITS, "n1", None)


def test_a_gang_of_several_is_answered_with_placements() -> None:
    objs = [node("n1", 2, 8, 110)]
    d = decide(objs, [member("a", cpu_m=1000), member("b", cpu_m=1000)])
    assert (d.node, d.placements) == (None, {"team-a/a": "n1", "team-a/b": "n1"})


def test_minimal_job_placement_tie_goes_to_the_latest_started_victims() -> None:
    """Equal minimal keys on n1 and n2: the member goes where the highest-priority victim started latest."""
    objs = [
        node("n1", 2, 8, 110),
        node("n2", 2, 8, 110),
        jpod("older", namespace="team-b", node="n1", priority=0, cpu_m=2000, start="2025-12-31T20:00:00Z"),
        jpod("younger", namespace="team-b", node="n2", priority=0, cpu_m=2000, start="2025-12-31T23:00:00Z"),
    ]
    d = decide(objs, [member("a", cpu_m=2000)], {"victimSelection": "minimal"})
    assert (d.outcome, d.node, names(d)) == (PREEMPT, "n2", ["younger"])
    gang_of_two = decide(
        [*objs, node("n3", 2, 8, 110)],
        [member("a", cpu_m=2000), member("b", cpu_m=2000)],
        {"victimSelection": "minimal"},
    )
    # a takes the free n3; b the tie between n1 and n2, broken by the younger victim.
    assert gang_of_two.placements == {"team-a/a": "n3", "team-a/b": "n2"} and names(gang_of_two) == [
        "younger"
    ]
