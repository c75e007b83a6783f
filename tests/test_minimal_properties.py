"""`victimSelection: minimal` is exact (brute force agrees) and never worse than `kubernetes`."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings

from engine import case as case_mod
from engine import default, minimal, placement, resources
from engine.config import Config
from engine.decision import PREEMPT
from engine.default import Preemptor
from tests import gen

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
