"""The incremental index gives exactly the answers of a fresh, literal evaluation, through churn.

A small mixed cluster (tests.support.churn) evolves through random watch events folded
with `Cluster.apply` (pods bound, deleted, terminating, nominated, heartbeats;
PDB status, selector, creation and deletion; a toleration policy changed; quotas
resized; nodes added, cordoned, resized, deleted and created again; time passing
through toleration windows)
while one long-lived Index answers for preemptors of every flow after every
change. Each answer is checked three ways:
- against engine.reference (the literal transcription, recomputed from scratch);
- against the same decision made with a fresh Index (the whole answer, the
  explanation included: nothing may depend on what a cache happened to hold);
- for the default flow, against `index.full_scan`, which evaluates every node in
  full with no bounds at all (the specification the bounds must not change).
The same objects folded in any order give the decisions of a cluster built at
once, as a worker restored from a snapshot builds it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import cluster as cluster_mod
from engine import default, flows, objects, reference, timeutil
from engine import index as index_mod
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import Decision
from engine.index import Index, full_scan
from engine.objects import Pod
from tests.support import churn, flowgen, gen

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _cluster(raw: dict[str, Any]) -> Cluster:
    c = Cluster()
    for obj in raw["objects"]:
        c.apply("ADDED", obj)
    return c


def _answer(d: Decision) -> dict[str, Any]:
    out: dict[str, Any] = {"outcome": d.outcome, "victims": sorted(v.key for v in d.victims)}
    out["node"] = d.node if d.outcome in ("preempt", "fits") else None
    if d.placements is not None:
        out["placements"] = dict(sorted(d.placements.items()))
    return out


def _check(got: Decision, want: dict[str, Any], why: Any) -> None:
    answer = _answer(got)
    assert {k: answer.get(k) for k in want} == want, why


def _preemptors(cluster: Cluster) -> dict[str, list[Pod]]:
    """One question per flow and shape, added to the cluster as pending pods."""
    raws = {
        "small": [gen.pod("q-small", node=None, priority=100, cpu_m=1000)],
        "big": [gen.pod("q-big", node=None, priority=5000, cpu_m=2000, mem_gi=1)],
        "nominated": [gen.pod("q-nom", node=None, priority=1000, cpu_m=1500, nominated="n2")],
        "zoned": [gen.pod("q-zone", node=None, priority=1000, cpu_m=1000)],
        # The same priority and requests as "zoned" with other node filters: one shared ranking.
        "unzoned": [gen.pod("q-any", node=None, priority=1000, cpu_m=1000)],
        "tolerating": [gen.pod("q-tol", node=None, priority=1000, cpu_m=1000)],
        "gang": [
            flowgen.jpod(
                f"g-{i}", namespace="team-a", priority=1000, cpu_m=1000, group="g1", preemptible="true"
            )
            for i in range(2)
        ],
        "quota-pod": [flowgen.jpod("solo", namespace="team-b", priority=5000, cpu_m=1500)],
        "daemonset": [flowgen.ds_pod("agent-x", required="n1", priority=1000, cpu_m=1000)],
    }
    raws["zoned"][0]["spec"]["nodeSelector"] = {"zone": "b"}
    raws["tolerating"][0]["spec"]["tolerations"] = [
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    ]
    out = {}
    for shape, pods in raws.items():
        for obj in pods:
            obj["metadata"]["resourceVersion"] = "1"
            cluster.apply("ADDED", obj)
        out[shape] = [cluster.pods[o["metadata"]["uid"]] for o in pods]
    return out


def _decide(cluster: Cluster, pods: list[Pod], now: int, config: Config, index: Index | None) -> Decision:
    current = [cluster.pods.get(p.uid, p) for p in pods]
    return flows.decide(cluster, current, now=now, config=config, index=index)


@SETTINGS
@given(
    churn.clusters(),
    st.data(),
    st.sampled_from(("kubernetes", "minimal")),
    # These clusters' nodes hold few pods: 0 makes every node go through summaries and
    # bounds, the default evaluates the small ones outright (engine.index.EVALUATE_MAX_PODS).
    st.sampled_from((0, index_mod.EVALUATE_MAX_PODS)),
    st.booleans(),
)
def test_long_lived_index_matches_fresh_and_reference_through_churn(
    raw: dict[str, Any], data: st.DataObject, mode: str, evaluate_max_pods: int, table: bool
) -> None:
    with mock.patch.object(index_mod, "EVALUATE_MAX_PODS", evaluate_max_pods), _node_table(table):
        _long_lived_index_through_churn(raw, data, mode)


def _node_table(on: bool) -> Any:
    """With `on`, every ranking settles through the node table (`engine.nodetable`) from its first
    pending node on; these clusters are far below the sizes where the index would use it."""
    if not on:
        return mock.patch.object(index_mod, "VECTOR_MIN", 10**9)
    patches = mock.patch.multiple(index_mod, VECTOR_MIN=1, TABLE_AT_RANKING=1)
    return patches


def _long_lived_index_through_churn(raw: dict[str, Any], data: st.DataObject, mode: str) -> None:
    cluster = _cluster(raw)
    config = Config(victim_selection=mode)
    questions = _preemptors(cluster)
    index = Index(cluster, lasting=True)
    now = timeutil.parse(raw["now"])
    for step, (kind, obj, advance) in enumerate([("TICK", None, 0), *data.draw(churn.changes(raw))]):
        now += advance * timeutil.SECOND
        if obj is not None:
            cluster.apply(kind, obj)
        for shape, pods in questions.items():
            why = (step, kind, shape, mode)
            d = _decide(cluster, pods, now, config, index)
            fresh = _decide(cluster, pods, now, config, None)
            assert d.answer() == fresh.answer(), why
            # The victims as the decision record carries them (already-terminating flags too).
            assert [v.to_json() for v in d.victims] == [v.to_json() for v in fresh.victims], why
            current = [cluster.pods[p.uid] for p in pods]
            flow = flows.select_flow(cluster, current)
            event(f"{flow} {d.outcome}")
            if flow == "default":
                pre = default.Preemptor(current[0], cluster.priority(current[0]), current[0].requests)
                spec = full_scan(cluster, pre, now, mode)
                if d.outcome == "preempt":
                    assert spec.best is not None and spec.best.node == d.node, why
                    assert sorted(v.uid for v in spec.best.victims) == sorted(v.uid for v in d.victims), why
                if spec.fitting is None and d.outcome in ("preempt", "unschedulable"):
                    for key in (
                        "candidates",
                        "candidateCount",
                        "rejected",
                        "rejectedCount",
                        "rejectedReasons",
                    ):
                        assert d.explanation[key] == spec.explanation[key], (why, key)
                if mode == "kubernetes":
                    _check(d, reference.decide(cluster, current[0], now), why)
            elif flow == "job" and mode == "kubernetes":
                _check(d, reference.decide_job(cluster, current, now, config), why)
            elif flow == "daemonset":
                _check(d, reference.decide_daemonset(cluster, current[0], now, config), why)


@SETTINGS
@given(churn.clusters())
def test_folding_in_any_order_builds_the_same_indexes(raw: dict[str, Any]) -> None:
    """The derived indexes (PDB membership, usage, groups, owners) equal a build from scratch."""
    folded = _cluster(raw)
    built = cluster_mod.build([objects.normalize(o) for o in reversed(raw["objects"])])
    assert folded.usage == built.usage
    for uid in folded.pods:
        assert [p.uid for p in folded.budgets.of(uid)] == [p.uid for p in built.budgets.of(uid)]
        assert folded.owns(uid) == built.owns(uid)
    for node in folded.nodes:
        assert folded.nodes[node].used == built.nodes[node].used


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(churn.clusters(), st.randoms(use_true_random=False), st.sampled_from(("kubernetes", "minimal")))
def test_folding_in_any_order_gives_the_same_decisions(raw: dict[str, Any], rnd: Any, mode: str) -> None:
    """Watch order is per kind, so objects reach the index in any order (docs/semantics.md §8).

    Folded one by one in a shuffled order, as a worker meets them, the objects must
    give the decisions of `cluster.build` (a restored worker), byte for byte.
    """
    shuffled = list(raw["objects"])
    rnd.shuffle(shuffled)
    folded = _cluster({"objects": shuffled})
    built = cluster_mod.build([objects.normalize(o) for o in raw["objects"]])
    config = Config(victim_selection=mode)
    now = timeutil.parse(raw["now"])
    from_folded, from_built = _preemptors(folded), _preemptors(built)
    for shape, pods in from_folded.items():
        a = flows.decide(folded, pods, now=now, config=config)
        b = flows.decide(built, from_built[shape], now=now, config=config)
        assert a.answer() == b.answer(), shape
        assert [v.to_json() for v in a.victims] == [v.to_json() for v in b.victims], shape


def test_case_answers_do_not_depend_on_a_shared_index() -> None:
    raw = {
        "name": "t",
        "now": gen.NOW,
        "objects": [gen.node("n1", 2, 8, 10), gen.pod("low", node="n1", priority=0, cpu_m=2000)],
        "preemptor": [gen.pod("x", node=None, priority=10, cpu_m=2000)],
    }
    c = case_mod.load(raw, where="t")
    shared = Index(c.cluster, lasting=True)
    assert case_mod.answer(c, index=shared).answer() == case_mod.answer(c).answer()


def _versioned(cluster: Cluster) -> Callable[[str, dict[str, Any]], None]:
    """cluster.apply with each object given the next resourceVersion, as the API server would."""
    version = 0

    def apply(kind: str, obj: dict[str, Any]) -> None:
        nonlocal version
        version += 1
        cluster.apply(kind, {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}})

    return apply


def test_a_node_created_again_is_not_mistaken_for_the_one_it_replaced() -> None:
    """A node deleted and created again, a pod bound to it meanwhile: its cached summary is stale.

    Node versions restarted at zero with each NodeState, so the re-created node
    repeated the version of the empty one it replaced, and the long-lived index
    answered `fits` on a full node from that node's old summary.
    """
    cluster = Cluster()
    apply = _versioned(cluster)

    replaced = gen.node("n2", 2, 8, 110)
    apply("ADDED", gen.node("n1", 2, 8, 110))
    apply("ADDED", gen.pod("a", node="n1", priority=0, cpu_m=2000))
    apply("ADDED", replaced)
    apply("ADDED", gen.pod("x", node=None, priority=100, cpu_m=1000))
    index = Index(cluster, lasting=True)
    x = [cluster.pods["x-uid"]]
    assert _decide(cluster, x, 0, Config(), index).outcome == "fits"
    apply("DELETED", replaced)
    apply("ADDED", gen.pod("b", node="n2", priority=0, cpu_m=2000))
    apply("ADDED", replaced)
    d = _decide(cluster, x, 0, Config(), index)
    assert _answer(d) == _answer(_decide(cluster, x, 0, Config(), None))
    assert (d.outcome, d.node) == ("preempt", "n1")


def test_pods_folded_before_their_priority_class_take_its_value() -> None:
    """Watch order is per kind: a pod without spec.priority may arrive before its class.

    The index stamped such a pod once, with whatever classes it held then, so a
    worker folding the log and one restored from a snapshot (`cluster.build`,
    classes first) disagreed on its priority and chose different nodes.
    """
    classes = [
        {"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000},
        {"kind": "PriorityClass", "metadata": {"name": "base"}, "value": 50, "globalDefault": True},
    ]
    pods = [
        gen.pod("classed", node="n1", priority=0, cpu_m=2000),
        gen.pod("defaulted", node="n2", priority=0, cpu_m=2000),
        gen.pod("low", node="n3", priority=0, cpu_m=2000),
        gen.pod("x", node=None, priority=100, cpu_m=2000),
    ]
    del pods[0]["spec"]["priority"], pods[1]["spec"]["priority"]
    pods[0]["spec"]["priorityClassName"] = "high"
    raw = [gen.node(n, 2, 8, 110) for n in ("n1", "n2", "n3")] + pods + classes
    folded = Cluster()
    for n, obj in enumerate(raw):
        folded.apply("ADDED", {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(n + 1)}})
    built = cluster_mod.build([objects.normalize(o) for o in raw])
    for c in (folded, built):
        assert [c.pods[f"{p}-uid"].priority for p in ("classed", "defaulted", "low")] == [1000, 50, 0]
    x = [folded.pods["x-uid"]]
    index = Index(folded, lasting=True)
    d = _decide(folded, x, 0, Config(), index)
    assert _answer(d) == _answer(_decide(built, [built.pods["x-uid"]], 0, Config(), None))
    assert (d.outcome, d.node) == ("preempt", "n3")
    # Deleting the default class gives its pods priority 0 again, and they are victims once more.
    folded.apply("DELETED", {**classes[1], "metadata": {"name": "base", "resourceVersion": "99"}})
    assert folded.pods["defaulted-uid"].priority == 0
    assert _decide(folded, x, 0, Config(), index).node == "n2"


def test_deleted_nodes_leave_nothing_in_the_index() -> None:
    """Machines come and go under new names: a long-lived index must not keep every node it ever saw."""
    cluster = Cluster()
    apply = _versioned(cluster)

    apply("ADDED", gen.pod("x", node=None, priority=100, cpu_m=1000))
    index = Index(cluster, lasting=True)
    for i in range(20):
        node = gen.node(f"n{i}", 2, 8, 110)
        apply("ADDED", node)
        apply("ADDED", gen.pod(f"a{i}", node=f"n{i}", priority=0, cpu_m=2000))
        assert _decide(cluster, [cluster.pods["x-uid"]], 0, Config(), index).outcome == "preempt"
        apply("DELETED", node)
    _decide(cluster, [cluster.pods["x-uid"]], 0, Config(), index)
    assert len(index.summaries) == 0
    assert all(not r._filtered for r in index._rankings.values())


def test_touch_logs_stay_bounded_whoever_reads_them(monkeypatch: Any) -> None:
    """Without preemptors nothing trimmed the logs, and one ranking used once pinned them for good."""
    monkeypatch.setattr(cluster_mod, "MAX_TOUCH_LOG", 40)
    cluster = Cluster()
    apply = _versioned(cluster)

    for n in ("n1", "n2"):
        apply("ADDED", gen.node(n, 2, 8, 110))
    apply("ADDED", gen.pod("once", node=None, priority=100, cpu_m=2000))
    apply("ADDED", gen.pod("often", node=None, priority=1000, cpu_m=1000))
    index = Index(cluster, lasting=True)
    once, often = [cluster.pods["once-uid"]], [cluster.pods["often-uid"]]
    _decide(cluster, once, 0, Config(), index)
    for i in range(200):
        apply("ADDED", gen.pod(f"p{i}", node=f"n{1 + i % 2}", priority=0, cpu_m=200 + 200 * (i % 5)))
        apply("DELETED", gen.pod(f"p{i}", node=f"n{1 + i % 2}", priority=0, cpu_m=200 + 200 * (i % 5)))
        if i % 3 == 0:
            apply("ADDED", gen.pod(f"q{i}", node=f"n{1 + i % 2}", priority=0, cpu_m=100))
            _decide(cluster, often, 0, Config(), index)
        assert len(cluster.touched) <= 40
    # The ranking left behind starts over and still answers as a fresh index does.
    assert _answer(_decide(cluster, once, 0, Config(), index)) == _answer(
        _decide(cluster, once, 0, Config(), None)
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    churn.wide_clusters(),
    st.data(),
    st.sampled_from(("kubernetes", "minimal")),
    st.sampled_from((0, index_mod.EVALUATE_MAX_PODS)),
    st.booleans(),
)
def test_wide_workloads_under_pdbs_through_churn(
    raw: dict[str, Any], data: st.DataObject, mode: str, evaluate_max_pods: int, table: bool
) -> None:
    """A long-lived index equals a fresh one and the reference after every event of wide-workload churn.

    PDB status changes are one log entry whatever the budget's width, applied by
    each ranking to the nodes it evaluated with that budget (`Ranking.reads`) that
    host more of its pods than both budgets allow; preemptions mark their victims
    terminating (the next decisions wait on them or look past them).
    """
    with mock.patch.object(index_mod, "EVALUATE_MAX_PODS", evaluate_max_pods), _node_table(table):
        cluster = _cluster(raw)
        config = Config(victim_selection=mode)
        index = Index(cluster, lasting=True)
        now = timeutil.parse(raw["now"])
        objects = {o["metadata"]["uid"]: o for o in raw["objects"]}
        shapes = [(100, 1000), (1000, 1500), (1000, 500), (5000, 2000)]
        questions = []
        for q, (priority, cpu_m) in enumerate(shapes):
            obj = gen.pod(f"q{q}", node=None, priority=priority, cpu_m=cpu_m)
            obj["metadata"]["resourceVersion"] = "1"
            cluster.apply("ADDED", obj)
            questions.append([cluster.pods[obj["metadata"]["uid"]]])
        version = 1000
        for step in range(data.draw(st.integers(1, 10))):
            kind, obj = churn.wide_change(data.draw, objects, step)
            version += 1
            obj["metadata"]["resourceVersion"] = str(version)
            cluster.apply(kind, obj)
            if kind == "DELETED":
                objects.pop(obj["metadata"]["uid"], None)
            else:
                objects[obj["metadata"]["uid"]] = obj
            for q, pods in enumerate(questions):
                why = (step, kind, q, mode)
                d = _decide(cluster, pods, now, config, index)
                assert d.answer() == _decide(cluster, pods, now, config, None).answer(), why
                pre = default.Preemptor(pods[0], cluster.priority(pods[0]), pods[0].requests)
                spec = full_scan(cluster, pre, now, mode)
                if d.outcome == "preempt":
                    assert spec.best is not None and spec.best.node == d.node, why
                    assert sorted(v.uid for v in spec.best.victims) == sorted(v.uid for v in d.victims), why
                if spec.fitting is None and d.outcome in ("preempt", "unschedulable"):
                    for key in ("candidates", "candidateCount", "rejectedCount", "rejectedReasons"):
                        assert d.explanation[key] == spec.explanation[key], (why, key)
                if mode == "kubernetes":
                    _check(d, reference.decide(cluster, pods[0], now), why)
                event(f"{kind} {d.outcome}")
                if d.outcome == "preempt" and data.draw(st.booleans()):
                    # The preemption goes ahead: its victims become terminating.
                    for v in d.victims:
                        victim = copy.deepcopy(objects[v.uid])
                        if "deletionTimestamp" in victim["metadata"]:
                            continue
                        victim["metadata"]["deletionTimestamp"] = "2025-12-31T23:59:50Z"
                        victim["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True"})
                        version += 1
                        victim["metadata"]["resourceVersion"] = str(version)
                        cluster.apply("MODIFIED", victim)
                        objects[v.uid] = victim


def test_rankings_sharing_filter_verdicts_each_see_a_node_change() -> None:
    """Rankings of shapes the node filters read alike share their verdicts (`filter_signature`).

    The first to catch up on a node change updates the shared verdict; each other
    ranking must still look at the node again, not take the updated verdict for
    the one its own entry was filed with (n1 stayed "cordoned" for the second shape).
    """
    cluster = Cluster()
    apply = _versioned(cluster)
    node = gen.node("n1", 2, 8, 110)
    apply("ADDED", node)
    apply("ADDED", gen.node("n2", 2, 8, 110))
    apply("ADDED", gen.pod("low1", node="n1", priority=0, cpu_m=2000))
    apply("ADDED", gen.pod("low2", node="n2", priority=0, cpu_m=2000))
    apply("ADDED", gen.pod("a", node=None, priority=100, cpu_m=1000))
    apply("ADDED", gen.pod("b", node=None, priority=1000, cpu_m=1000))
    index = Index(cluster, lasting=True)
    shapes = [[cluster.pods["a-uid"]], [cluster.pods["b-uid"]]]
    assert index_mod.filter_signature(
        default.Preemptor(shapes[0][0], 100, shapes[0][0].requests)
    ) == index_mod.filter_signature(default.Preemptor(shapes[1][0], 1000, shapes[1][0].requests))
    for cordon in (True, False, True, False):
        apply("MODIFIED", {**node, "spec": {"unschedulable": cordon}})
        for pods in shapes:
            d = _decide(cluster, pods, 0, Config(), index)
            assert d.answer() == _decide(cluster, pods, 0, Config(), None).answer(), (cordon, pods[0].name)
