"""Property tests of the DaemonSet flow on generated clusters (hypothesis).

Facts are recomputed here from the case's records: what the required node
frees once the victims are gone, and which pods may be victims at all.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import job, placement, resources
from engine.decision import FITS, PREEMPT, Decision
from tests import flowgen, gen

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
        assert not job.leaving(pod)
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
