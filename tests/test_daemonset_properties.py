"""Property tests of the DaemonSet flow on generated clusters (hypothesis).

Facts are recomputed here from the case's records: what the required node
frees once the victims are gone, and which pods may be victims at all.
"""

from __future__ import annotations

import random
from fractions import Fraction
from types import SimpleNamespace
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import daemonset, placement, resources, victims
from engine.decision import FITS, PREEMPT, Decision
from engine.objects import Pod
from tests.support import flowgen, gen

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decide(raw: dict[str, Any]) -> tuple[case_mod.Case, Decision]:
    c = case_mod.load(raw, where="generated")
    return c, case_mod.answer(c)


@SETTINGS
@given(flowgen.daemonset_clusters())
def test_victims_are_never_daemonset_pods_and_only_on_the_required_node(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    assert d.flow == "daemonset"
    ds = c.preemptors[0]
    required = placement.required_node(ds)
    for v in d.victims:
        pod = c.cluster.pods[v.uid]
        assert not pod.daemonset
        assert not victims.leaving(pod)
        assert v.node == required == d.node
        assert v.priority <= c.cluster.priority(ds)
        assert v.action == c.config.victim_action


@SETTINGS
@given(flowgen.daemonset_clusters())
def test_after_evicting_the_victims_the_daemonset_pod_fits(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    ds = c.preemptors[0]
    if d.outcome not in (PREEMPT, FITS):
        assert d.victims == ()
        return
    assert d.node is not None and d.node == placement.required_node(ds)
    assert resources.fits(ds.requests, gen.free_after(c, d.node, {v.uid for v in d.victims}))
    if d.outcome == FITS:
        assert d.victims == ()
    else:
        assert d.victims
        assert not resources.fits(ds.requests, gen.free_after(c, d.node, set()))


@SETTINGS
@given(flowgen.daemonset_clusters())
def test_strategy_bounds(raw: dict[str, Any]) -> None:
    """`single` evicts one pod; `multiple` never more than maxVictims."""
    c, d = _decide(raw)
    if d.outcome != PREEMPT:
        return
    settings_ = c.config.daemonset
    if d.reason.startswith("single"):
        assert len(d.victims) == 1
    else:
        assert len(d.victims) <= settings_.max_victims


@SETTINGS
@given(flowgen.daemonset_clusters(), st.randoms(use_true_random=False))
def test_answer_does_not_depend_on_object_order(raw: dict[str, Any], rnd: random.Random) -> None:
    _, d1 = _decide(raw)
    _, d2 = _decide(dict(raw, objects=rnd.sample(raw["objects"], len(raw["objects"]))))
    assert d1.answer() == d2.answer()


_AMOUNTS = st.integers(0, 10**12)
_RESOURCES = st.dictionaries(
    st.sampled_from(("cpu", "memory", "pods", "example.com/gpu")), _AMOUNTS, max_size=4
)


@settings(max_examples=500, deadline=None)
@given(_RESOURCES, _RESOURCES, st.lists(_RESOURCES, min_size=2, max_size=6))
def test_integer_sizes_and_deviations_order_as_the_fractions_do(
    request: dict[str, int], allocatable: dict[str, int], pods: list[dict[str, int]]
) -> None:
    """Candidates are ordered by `_sizer`'s integers and deviations found by cross-multiplying:
    the same order, ties included, and the same deviation as the plain Fraction arithmetic."""
    # Both read only a pod's requests.
    records = [cast(Pod, SimpleNamespace(requests=r)) for r in pods]
    size = daemonset._sizer(request, allocatable)
    for a in records:
        for b in records:
            want = daemonset._size(a, request, allocatable) - daemonset._size(b, request, allocatable)
            got = size(a) - size(b)
            assert (got > 0) - (got < 0) == (want > 0) - (want < 0)
    for p in records:
        plain: Fraction | None = Fraction(0)
        for r, amount in p.requests.items():
            want_r = request.get(r, 0)
            if want_r <= 0:
                plain = None
                break
            plain = max(plain, Fraction(abs(amount - want_r), want_r)) if plain is not None else None
        assert daemonset.deviation(p, request) == plain
