"""`victimSelection: minimal` is exact (brute force agrees) and never worse than `kubernetes`."""

from __future__ import annotations

import itertools
import os
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import default, flows, minimal, placement, resources, timeutil
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import PREEMPT
from engine.default import Preemptor
from engine.index import Index
from streams.sim import mixed
from tests.support import gen, minimal_oracle

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decide(raw: dict[str, Any], mode: str) -> tuple[case_mod.Case, Any]:
    c = case_mod.load(dict(raw, config={"victimSelection": mode}), where="generated")
    return c, case_mod.answer(c)


def _brute_force(c: case_mod.Case) -> tuple[tuple[int, ...], str] | None:
    """Every subset of every node's eligible pods; the least (key, node) that makes room."""
    cluster = c.cluster
    pod = c.preemptors[0]
    pre = Preemptor(pod, cluster.priority(pod), pod.requests)
    best = None
    for name in sorted(cluster.nodes):
        state = cluster.nodes[name]
        if placement.unresolvable(state.node, pod) is not None:
            continue
        free = default.free_for(cluster, state, pre)
        potential, _ = default.potential_victims(cluster, state, pre, c.now)
        for size in range(len(potential) + 1):
            for subset in itertools.combinations(potential, size):
                room = dict(free)
                for p in subset:
                    resources.add(room, p.requests)
                if resources.fits(pod.requests, room):
                    key = minimal.disruption_key(cluster, subset)
                    if best is None or (key, name) < best:
                        best = (key, name)
    return best


@SETTINGS
@given(gen.clusters(max_pods=10))
def test_minimal_agrees_with_brute_force(raw: dict[str, Any]) -> None:
    c, d = _decide(raw, "minimal")
    if d.outcome != PREEMPT:
        return
    want = _brute_force(c)
    assert want is not None
    got = minimal.disruption_key(c.cluster, [c.cluster.pods[v.uid] for v in d.victims])
    assert got == want[0]
    assert d.node == want[1]


@SETTINGS
@given(gen.clusters())
def test_minimal_is_never_worse_than_kubernetes(raw: dict[str, Any]) -> None:
    ck, dk = _decide(raw, "kubernetes")
    cm, dm = _decide(raw, "minimal")
    assert dk.outcome == dm.outcome
    if dk.outcome != PREEMPT:
        return
    kube = minimal.disruption_key(ck.cluster, [ck.cluster.pods[v.uid] for v in dk.victims])
    mini = minimal.disruption_key(cm.cluster, [cm.cluster.pods[v.uid] for v in dm.victims])
    assert mini <= kube


def test_minimal_mode_is_part_of_the_config_hash() -> None:
    assert Config(victim_selection="minimal").hash() != Config().hash()


@st.composite
def filled_nodes(draw: st.DrawFn, *, max_pods: int = 22) -> dict[str, Any]:
    """One node filled with pods of a few shapes, priorities, budgets (some overlapping) and starts."""
    cpu = draw(st.sampled_from((4, 8)))
    objs: list[dict[str, Any]] = [gen.node("n1", cpu, 64, draw(st.sampled_from((110, 24))))]
    shapes = draw(st.lists(st.tuples(st.sampled_from((100, 250, 500, 1000)), st.sampled_from((0, 1, 2))),
                           min_size=1, max_size=4))  # fmt: skip
    levels = draw(st.lists(st.sampled_from((-5, 0, 1, 10, 50, 100)), min_size=1, max_size=5, unique=True))
    used = 0
    for i in range(draw(st.integers(4, max_pods))):
        cpu_m, mem_gi = draw(st.sampled_from(shapes))
        if used + cpu_m > cpu * 1000:
            break
        used += cpu_m
        labels = {"app": draw(st.sampled_from(("a", "b", "c")))}
        if draw(st.booleans()):
            labels["tier"] = "x"
        objs.append(
            gen.pod(
                f"p{i:02d}",
                node="n1",
                priority=draw(st.sampled_from(levels)),
                cpu_m=cpu_m,
                mem_gi=mem_gi,
                start=draw(st.sampled_from(gen.TIMES)),
                labels=labels,
                guaranteed=draw(st.booleans()),
            )
        )
    for app in ("a", "b"):
        if draw(st.booleans()):
            budget = gen.pdb(f"pdb-{app}", app, draw(st.integers(0, 3)))
            if draw(st.integers(0, 4)) == 0:
                budget["status"]["disruptedPods"] = {"p00": "2025-12-31T23:59:00Z"}
            objs.append(budget)
    if draw(st.integers(0, 3)) == 0:  # overlapping: a budget over tier=x crosses the app budgets
        overlap = gen.pdb("pdb-tier", "-", draw(st.integers(0, 2)))
        overlap["spec"]["selector"] = {"matchLabels": {"tier": "x"}}
        objs.append(overlap)
    pre = gen.pod("x", node=None, priority=1000, cpu_m=draw(st.sampled_from((500, 1000, 2000, 3000))),
                  mem_gi=draw(st.sampled_from((0, 1, 4))))  # fmt: skip
    return {"name": "filled", "now": gen.NOW, "objects": objs, "preemptor": [pre]}


@settings(max_examples=int(os.environ.get("MINIMAL_EXAMPLES", "200")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(filled_nodes())
def test_minimal_agrees_with_the_pod_by_pod_search_on_filled_nodes(raw: dict[str, Any]) -> None:
    """The search over kinds (with its memo and bounds) finds the key the plain search over pods finds."""
    c = case_mod.load(raw, where="filled")
    pod = c.preemptors[0]
    pre = Preemptor(pod, c.cluster.priority(pod), pod.requests)
    state = c.cluster.nodes["n1"]
    got = minimal.evaluate_node(c.cluster, state, pre, c.now)
    want = minimal_oracle.evaluate_node(c.cluster, state, pre, c.now)
    assert got.status == want.status
    event(f"{len(got.victims) // 4 * 4}+ victims" if got.status == default.CANDIDATE else "not a candidate")
    if got.status == default.CANDIDATE:
        assert not got.capped
        assert got.key == want.key
        assert got.key == minimal.disruption_key(c.cluster, got.victims)
        free = default.free_for(c.cluster, state, pre)
        for v in got.victims:
            resources.add(free, v.requests)
        assert resources.fits(pod.requests, free)


def test_filled_nodes_of_an_ordinary_cluster_never_reach_the_cap() -> None:
    """Nodes of 50-110 pods of a mixed cluster (bench engine --workload mixed --node-pods 50-110):
    the search ends on its own for every preemptor shape, however many victims it needs."""
    gen_mixed = mixed.MixedCluster(4, seed=7, pods_per_node=(50, 110))
    cluster = Cluster()
    for obj in gen_mixed.objects():
        cluster.apply("ADDED", obj)
    now = timeutil.parse(mixed.EPOCH)
    evaluated = 0
    for k, shape in enumerate(gen_mixed.preemptor_shapes(30)):
        raw = gen_mixed.default_preemptor(k, {**shape, "cpu_m": shape["cpu_m"] * 2}, at=0)
        cluster.apply("ADDED", raw)
        pod = cluster.pods[raw["metadata"]["uid"]]
        pre = Preemptor(pod, cluster.priority(pod), pod.requests)
        for state in cluster.nodes.values():
            ev = minimal.evaluate_node(cluster, state, pre, now)
            if ev.status == default.CANDIDATE:
                evaluated += 1
                assert not ev.capped, (k, state.node.name)
        cluster.remove("Pod", pod.uid)
    assert evaluated > 30


def _filled_cluster() -> tuple[Cluster, Preemptor]:
    gen_mixed = mixed.MixedCluster(3, seed=11, pods_per_node=(60, 90))
    cluster = Cluster()
    for obj in gen_mixed.objects():
        cluster.apply("ADDED", obj)
    raw = gen_mixed.default_preemptor(0, {"priority": 50000, "cpu_m": 8000}, at=0)
    cluster.apply("ADDED", raw)
    pod = cluster.pods[raw["metadata"]["uid"]]
    return cluster, Preemptor(pod, cluster.priority(pod), pod.requests)


def test_a_capped_search_keeps_its_best_and_the_decision_says_so(monkeypatch: Any) -> None:
    cluster, pre = _filled_cluster()
    monkeypatch.setattr(minimal, "MAX_WORK", 40)
    now = timeutil.parse(mixed.EPOCH)
    d = flows.decide(cluster, [pre.pod], now=now, config=Config(victim_selection="minimal"))
    assert d.outcome == PREEMPT
    assert any(c.get("searchCapped") for c in d.explanation["candidates"])
    for state in cluster.nodes.values():
        greedy = default.evaluate_node(cluster, state, pre, now)
        capped = minimal.evaluate_node(cluster, state, pre, now)
        if greedy.status == default.CANDIDATE:
            assert capped.key <= minimal.disruption_key(cluster, greedy.victims)


def test_an_explanation_never_searches_a_node_again(monkeypatch: Any) -> None:
    """The top candidates an explanation lists are the evaluations the ranking already holds:
    each node is searched once, and a second decision on an unchanged cluster searches none."""
    cluster, pre = _filled_cluster()
    searched: list[int] = []
    run = minimal._Search.run

    def counted(self: Any) -> None:
        searched.append(id(self))
        run(self)

    monkeypatch.setattr(minimal._Search, "run", counted)
    now = timeutil.parse(mixed.EPOCH)
    index = Index(cluster)
    config = Config(victim_selection="minimal")
    first = flows.decide(cluster, [pre.pod], now=now, config=config, index=index)
    assert 0 < len(searched) <= len(cluster.nodes)
    assert len(first.explanation["candidates"]) > 1
    before = len(searched)
    again = flows.decide(cluster, [pre.pod], now=now, config=config, index=index)
    assert len(searched) == before
    assert again.answer() == first.answer()


# ---- branch and bound across nodes (`beat`) -----------------------------------------------


@SETTINGS
@given(gen.clusters(), st.randoms(use_true_random=False), st.integers(0, 4))
def test_pruning_by_other_nodes_never_changes_the_decision(
    raw: dict[str, Any], rnd: Any, peeked: int
) -> None:
    """Nodes searched in any order, each told the best set found on the others so far (their
    searches', and cheap first answers on a few): the decision (node and victims) is the one
    of searching every node in full, every node searched to the end has its full answer, and
    every pruned node ranks after the decision's node."""
    c = case_mod.load(dict(raw, config={"victimSelection": "minimal"}), where="generated")
    cluster, pod = c.cluster, c.preemptors[0]
    pre = default.preemptor(cluster, pod)
    names = sorted(cluster.nodes)
    full = {n: minimal.evaluate_node(cluster, cluster.nodes[n], pre, c.now) for n in names}
    ranked = sorted((ev.key, n) for n, ev in full.items() if ev.status == default.CANDIDATE)
    found: dict[str, tuple[int, ...]] = {}
    for n in rnd.sample(names, min(peeked, len(names))):
        first = minimal.incumbent(cluster, cluster.nodes[n], pre, c.now)
        assert (first is None) == (full[n].status != default.CANDIDATE)
        if first is not None:
            assert first >= full[n].key  # a set found there: never below the node's key
            found[n] = first
    pruned = 0
    for n in rnd.sample(names, len(names)):
        beat = min(((key, m) for m, key in found.items() if m != n), default=None)
        ev = minimal.evaluate_node(cluster, cluster.nodes[n], pre, c.now, beat=beat)
        assert ev.status == full[n].status
        if isinstance(ev, minimal.Pruned):
            assert beat is not None and (full[n].key, n) > beat and (full[n].key, n) > ranked[0]
            assert (ev.key, n) > beat and ev.key <= full[n].key  # a bound, and one that holds
            assert ev.beaten_by == beat[1] and not ev.victims
            assert default.criteria(ev, cluster)["notSearched"] == f"cannot beat {beat[1]}'s cost"
            pruned += 1
        elif ev.status == default.CANDIDATE:
            assert (ev.key, ev.victims, ev.capped) == (full[n].key, full[n].victims, full[n].capped)
            found[n] = ev.key
    event(f"{pruned} node(s) pruned")
    if ranked:
        # The least found is a full search's (pruned nodes' first answers rank after it).
        assert min((key, m) for m, key in found.items()) == ranked[0]


@settings(max_examples=int(os.environ.get("MINIMAL_EXAMPLES", "200")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(filled_nodes(), st.integers(-2, 2), st.integers(0, 3), st.sampled_from(("n0", "n2")))
def test_a_search_told_to_beat_a_key_finds_the_oracles_answer_or_prunes(
    raw: dict[str, Any], delta: int, term: int, other: str
) -> None:
    """Told a key near the pod-by-pod oracle's (one term moved by `delta`), from a node named
    before or after it: the search returns the full search's set when the oracle's key ranks
    before that key, and a bound (Pruned) when it does not."""
    c = case_mod.load(raw, where="filled")
    pod = c.preemptors[0]
    pre = Preemptor(pod, c.cluster.priority(pod), pod.requests)
    state = c.cluster.nodes["n1"]
    want = minimal_oracle.evaluate_node(c.cluster, state, pre, c.now)
    if want.status != default.CANDIDATE:
        return
    key = list(want.key)
    key[term] += delta
    beat = (tuple(key), other)
    got = minimal.evaluate_node(c.cluster, state, pre, c.now, beat=beat)
    if (want.key, "n1") < beat:
        full = minimal.evaluate_node(c.cluster, state, pre, c.now)
        assert not isinstance(got, minimal.Pruned)
        assert (got.key, got.victims) == (want.key, full.victims)
    else:
        assert isinstance(got, minimal.Pruned)
        event("pruned")
