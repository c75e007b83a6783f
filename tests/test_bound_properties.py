"""`summary.bound` and `summary.refine` never overstate a node, on adversarial nodes.

A ranking trusts the bound in two ways: FITS and REJECTED verdicts are taken as
they are, and a candidate's bound is assumed to be a lexicographic lower bound
on the key a full evaluation computes (`Ranking.exact` raises when it is not, a
crash in production). The churn property tests reach the bound only through
whole decisions on gentle clusters; this one aims at it directly, one node at a
time, with what makes the bound's reasoning delicate: negative and extreme
priorities, pods without a start time, extended resources and zero requests,
the `pods` slot, nominated load, tolerating pods whose scheduling time differs
from their start time (open, closing and endless windows), terminating pods,
and nodes lacking a resource.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine import default, flows, minimal, summary, timeutil
from engine.cluster import Cluster, NodeState
from engine.config import Config
from engine.default import Preemptor
from engine.index import Index
from engine.nodetable import NodeTable
from tests.support import gen

SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRIORITIES = (-(2**31), -5, 0, 10, 10, 100, 1000)
TIMES = ("2025-12-31T20:00:00Z", "2025-12-31T23:30:00Z", "2025-12-31T23:59:00Z", None)
PREFIX = "preemption-toleration.scheduling.x-k8s.io/"


def _class(name: str, value: int, seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": name,
            "annotations": {
                PREFIX + "minimum-preemptable-priority": "1000",
                PREFIX + "toleration-seconds": str(seconds),
            },
        },
        "value": 10,
    }


# Quantities Kubernetes accepts whose millis (or bytes, summed) pass 2^63.
HUGE = ("9E", "7Ei", "9223372036854775807", "5E")


@st.composite
def _pod(draw: st.DrawFn, name: str, node: str | None) -> dict[str, Any]:
    klass = draw(st.sampled_from((None, None, "hour", "forever")))
    prio = 10 if klass else draw(st.sampled_from(PRIORITIES))
    obj = gen.pod(
        name,
        node=node,
        priority=prio,
        cpu_m=draw(st.sampled_from((0, 250, 500, 1000, 1500))),
        mem_gi=draw(st.sampled_from((0, 1, 2))),
        start=None,
        deleting=draw(st.integers(0, 6)) == 0,
        priority_class=klass,
        guaranteed=draw(st.booleans()),
    )
    if draw(st.integers(0, 3)) == 0:
        obj["spec"]["containers"][0]["resources"]["requests"]["example.com/gpu"] = str(
            draw(st.integers(0, 2))
        )
    if node is not None:
        start = draw(st.sampled_from(TIMES))
        scheduled = draw(st.sampled_from(TIMES))
        if start is not None:
            obj["status"]["startTime"] = start
        if scheduled is not None:
            obj["status"]["conditions"].append(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}
            )
    return obj


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, Any]:
    node = gen.node("n1", draw(st.sampled_from((2, 3))), draw(st.sampled_from((2, 4))), 110)
    alloc = node["status"]["allocatable"]
    if draw(st.booleans()):
        alloc["example.com/gpu"] = str(draw(st.integers(1, 3)))
    if draw(st.integers(0, 3)) == 0:
        alloc["pods"] = str(draw(st.integers(1, 6)))
    if draw(st.integers(0, 5)) == 0:
        # Valid quantities beyond a machine integer's room once in millis (9E cpu is 9*10^21m):
        # the table must hand such a node back, never fail on it.
        alloc[draw(st.sampled_from(("cpu", "memory")))] = draw(st.sampled_from(HUGE))
    objects = [_class("hour", 10, 3600), _class("forever", 10, -1), node]
    objects += [draw(_pod(f"p{i}", "n1")) for i in range(draw(st.integers(1, 9)))]
    if draw(st.integers(0, 5)) == 0:
        big = objects[-1]["spec"]["containers"][0]["resources"]["requests"]
        big[draw(st.sampled_from(("cpu", "memory")))] = draw(st.sampled_from(HUGE))
    for i in range(draw(st.integers(0, 2))):
        nom = gen.pod(
            f"nom{i}",
            node=None,
            priority=draw(st.sampled_from(PRIORITIES)),
            cpu_m=draw(st.sampled_from((250, 500))),
            nominated="n1",
        )
        objects.append(nom)
    requests: dict[str, str] = {}
    if cpu := draw(st.sampled_from((0, 500, 1000, 1000, 2000))):
        requests["cpu"] = f"{cpu}m"
    if mem := draw(st.sampled_from((0, 1, 2))):
        requests["memory"] = f"{mem}Gi"
    if gpu := draw(st.sampled_from((0, 0, 1, 2))):
        requests["example.com/gpu"] = str(gpu)
    preemptor = gen.pod(
        "pre", node=None, priority=draw(st.sampled_from((0, 11, 100, 100, 100, 1000, 5000))), cpu_m=0
    )
    preemptor["spec"]["containers"][0]["resources"]["requests"] = requests
    minutes = draw(st.sampled_from((0, 0, 10, 31, 60, 61, 30 * 24 * 60)))
    return {"objects": [*objects, preemptor], "now": timeutil.parse(gen.NOW) + minutes * 60 * timeutil.SECOND}


def _drawn(raw: dict[str, Any]) -> tuple[Cluster, int, Preemptor, NodeState]:
    """The drawn node's cluster, its instant, the preemptor `pre-uid` and the node `n1`."""
    cluster = Cluster()
    for obj in raw["objects"]:
        cluster.apply("ADDED", obj)
    pod = cluster.pods["pre-uid"]
    return cluster, raw["now"], Preemptor(pod, cluster.priority(pod), pod.requests), cluster.nodes["n1"]


@SETTINGS
@given(nodes(), st.sampled_from(("kubernetes", "minimal")), st.booleans())
def test_bound_and_refine_never_exceed_a_full_evaluation(raw: dict[str, Any], mode: str, job: bool) -> None:
    cluster, now, pre, state = _drawn(raw)
    # The job flow's rankings summarise only some pods (its victims' kind).
    pods = [p for p in state.pods.values() if not job or p.qos != 0]
    s = summary.build(cluster, state, pods)
    free = default.free_for(cluster, state, pre)
    evaluate = minimal.evaluate_node if mode == "minimal" else default.evaluate_node
    # Evaluated as a ranking evaluates it: the summary's pods are the only potential victims.
    ev = evaluate(cluster, state, pre, now, s.pods)
    b = summary.bound(s, free, pre.requests, pre.priority, now, minimal=mode == "minimal")
    if ev.status == default.REJECTED and "eligible" not in ev.reason:
        return  # a node filter (missing resource): the ranking rejects it before any bound
    event(f"tier {b.tier}, held {bool(summary.withheld(s, pre.priority, now)[0])}")
    assert b.tier == ev.status, (b, ev.status, ev.reason)
    if b.tier == default.REJECTED:
        assert b.reason == ev.reason
    if b.tier != default.CANDIDATE:
        return
    assert b.value <= ev.key, (b.value, ev.key)
    refined = summary.refine(s, free, pre.requests, pre.priority, now, b.value, minimal=mode == "minimal")
    assert refined <= ev.key, (refined, ev.key)


def test_a_tolerating_pod_that_could_go_alone_does_not_tighten_a_pair() -> None:
    """The pod that alone covers the shortfall tolerates the preemptor; two later-started pods go instead.

    The coarse bound's start term came from that lone pod; the refined bound kept it
    with a count of two, above the node's true key, and `Ranking.exact` raised.
    """
    objects = [
        gen.tolerant_class(),
        gen.node("n1", 2, 8, 110),
        gen.pod(
            "t", node="n1", priority=10, cpu_m=1000, start="2025-12-31T23:30:00Z", priority_class="tolerant"
        ),
        gen.pod("b", node="n1", priority=10, cpu_m=500, start="2025-12-31T23:59:00Z"),
        gen.pod("c", node="n1", priority=10, cpu_m=500, start="2025-12-31T23:59:00Z"),
        gen.pod("x", node=None, priority=100, cpu_m=1000),
    ]
    cluster = Cluster()
    for obj in objects:
        cluster.apply("ADDED", obj)
    now = timeutil.parse(gen.NOW)
    d = flows.decide(cluster, [cluster.pods["x-uid"]], now=now, config=Config(), index=Index(cluster))
    assert (d.outcome, d.node, sorted(v.key for v in d.victims)) == (
        "preempt",
        "n1",
        ["default/b", "default/c"],
    )


@SETTINGS
@given(nodes(), st.sampled_from(("kubernetes", "minimal")), st.booleans())
def test_the_node_table_gives_exactly_the_bound_or_hands_the_node_back(
    raw: dict[str, Any], mode: str, other_levels: bool
) -> None:
    """`NodeTable.bounds` equals `summary.bound` for every node it answers, on adversarial nodes.

    Nominated load, tolerating pods (open, closing, endless windows), a lone victim,
    negative and extreme priorities, missing resources: the table must either give
    the bound's exact value or hand the node back. `other_levels` lays the table out
    with levels the node does not have (a column repeats the row below for them).
    """
    cluster, now, pre, state = _drawn(raw)
    s = summary.build(cluster, state, list(state.pods.values()))
    table = NodeTable(cluster)
    if other_levels:
        table.usable((-7, 5, 50, 10**6), {})
    exact, refused, others = table.bounds(
        ["n1"],
        [state],
        lambda _: s,
        pre.requests,
        pre.priority,
        now,
        minimal=mode == "minimal",
        free_of=lambda st: default.free_for(cluster, st, pre),
    )
    b = summary.bound(
        s, default.free_for(cluster, state, pre), pre.requests, pre.priority, now, minimal=mode == "minimal"
    )
    event(f"table answers: {'candidate' if exact else 'rejected' if refused else 'no'}")
    assert len(exact) + len(refused) + len(others) == 1
    if exact:
        assert (b.tier, b.expires) == (default.CANDIDATE, None), b
        assert exact == [("n1", b.value)], (exact, b)
    elif refused:
        assert (b.tier, b.expires) == (default.REJECTED, None), b
        assert refused == [("n1", b.reason)], (refused, b)
    else:
        assert others == [0]


def test_the_node_table_grows_re_lays_and_reuses_columns() -> None:
    """Past its first capacity, with a level it did not have, and after nodes go: the same bounds."""
    cluster = Cluster()
    table = NodeTable(cluster)
    names = [f"n{i:02d}" for i in range(40)]
    for i, name in enumerate(names):
        cluster.apply("ADDED", gen.node(name, 4, 8, 110))
        for k in range(3):
            cluster.apply(
                "ADDED", gen.pod(f"{name}-p{k}", node=name, priority=10 * (1 + (i + k) % 3), cpu_m=1200)
            )
    now = timeutil.parse(gen.NOW)
    assert table.capacity < len(names)

    def check(priority: int) -> None:
        pre = Preemptor(cluster.pods["n00-p0-uid"], priority, {"cpu": 2000, "pods": 1})
        states = [cluster.nodes[n] for n in names]
        sums = {
            n: summary.build(cluster, cluster.nodes[n], list(cluster.nodes[n].pods.values())) for n in names
        }
        exact, refused, others = table.bounds(
            names,
            states,
            lambda st: sums[st.node.name],
            pre.requests,
            priority,
            now,
            minimal=False,
            free_of=lambda st: default.free_for(cluster, st, pre),
        )
        assert len(exact) + len(refused) + len(others) == len(names)
        assert exact, "the table answers for these nodes"
        for name, value in exact:
            b = summary.bound(
                sums[name], cluster.free(cluster.nodes[name]), pre.requests, priority, now, minimal=False
            )
            assert (b.tier, b.value) == (default.CANDIDATE, value), name

    check(100)
    # A pod at a priority the table has no level for: it is re-laid, every column rewritten.
    cluster.apply("ADDED", gen.pod("n05-new", node="n05", priority=15, cpu_m=100))
    check(100)
    # Nodes go and come back: their columns are freed and reused, never mistaken for the old ones.
    for name in names[:5]:
        table.forget(name)
        cluster.apply("DELETED", {**gen.node(name, 4, 8, 110)})
        cluster.apply("ADDED", gen.node(name, 4, 8, 110))
    check(100)


def test_a_table_without_levels_holds_a_node_without_pods() -> None:
    """No PriorityClass and a node without pods: warming wrote its column into the placeholder row.

    A restored worker warms its index (`Index.warm`) before any pod carries a
    priority; writing the empty node's column crashed (a row of no levels into
    the table's one placeholder row), and the worker could not open its partition.
    """
    cluster = Cluster()
    cluster.apply("ADDED", gen.node("empty", 4, 8, 110))
    now = timeutil.parse(gen.NOW)
    index = Index(cluster, lasting=True)
    index.warm((), now, "kubernetes")
    assert index.table is not None and index.table.levels == []
    # Pods come (at priorities no class names: the table is re-laid), then a preemptor.
    cluster.apply("ADDED", gen.node("busy", 2, 8, 110))
    for k, prio in enumerate((0, 10, 10)):
        cluster.apply("ADDED", gen.pod(f"p{k}", node="busy", priority=prio, cpu_m=600))
    cluster.apply("ADDED", gen.pod("x", node=None, priority=100, cpu_m=3000))
    x = cluster.pods["x-uid"]
    table = index.table
    states = [cluster.nodes[n] for n in ("empty", "busy")]
    sums = {st.node.name: summary.build(cluster, st, list(st.pods.values())) for st in states}
    exact, refused, others = table.bounds(
        ["empty", "busy"],
        states,
        lambda st: sums[st.node.name],
        {"cpu": 3000, "pods": 1},
        100,
        now,
        minimal=False,
        free_of=lambda st: cluster.free(st),
    )
    for name, value in exact:
        b = summary.bound(
            sums[name], cluster.free(cluster.nodes[name]), {"cpu": 3000, "pods": 1}, 100, now, minimal=False
        )
        assert (b.tier, b.value) == (default.CANDIDATE, value), name
    for name, why in refused:
        b = summary.bound(
            sums[name], cluster.free(cluster.nodes[name]), {"cpu": 3000, "pods": 1}, 100, now, minimal=False
        )
        assert (b.tier, b.reason) == (default.REJECTED, why), name
    assert len(exact) + len(refused) + len(others) == 2
    d = flows.decide(cluster, [x], now=now, config=Config(), index=index)
    fresh = flows.decide(cluster, [x], now=now, config=Config(), index=None)
    assert d == fresh
