"""Property tests of the default flow on generated clusters (hypothesis).

Each property is checked against facts computed here from the raw objects, and
the engine as a whole against engine.reference, the literal transcription.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import default, reference, resources
from engine.decision import FITS, PREEMPT
from engine.default import Preemptor
from tests.support import gen

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decide(raw: dict[str, Any]) -> tuple[case_mod.Case, Any]:
    c = case_mod.load(raw, where="generated")
    return c, case_mod.answer(c)


@SETTINGS
@given(gen.clusters())
def test_victims_are_lower_priority_and_make_room(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    pre = c.preemptors[0]
    prio = c.cluster.priority(pre)
    if d.outcome != PREEMPT:
        assert d.victims == ()
        return
    assert d.node is not None
    evicted = {v.uid for v in d.victims}
    for v in d.victims:
        assert v.priority < prio
        assert v.node == d.node
        assert v.terminating == c.cluster.pods[v.uid].deleting
    assert resources.fits(pre.requests, gen.free_after(c, d.node, evicted))


@SETTINGS
@given(gen.clusters())
def test_reprieve_is_minimal(raw: dict[str, Any]) -> None:
    """No single victim could be given back: the preemptor would no longer fit."""
    c, d = _decide(raw)
    if d.outcome != PREEMPT:
        return
    assert d.node is not None
    evicted = {v.uid for v in d.victims}
    for v in d.victims:
        assert not resources.fits(c.preemptors[0].requests, gen.free_after(c, d.node, evicted - {v.uid}))


@SETTINGS
@given(gen.clusters())
def test_fits_has_no_victims_and_really_fits(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    if d.outcome == FITS:
        assert d.victims == ()
        assert d.node is not None
        assert resources.fits(c.preemptors[0].requests, gen.free_after(c, d.node, set()))


@SETTINGS
@given(gen.clusters(), st.randoms(use_true_random=False))
def test_answer_does_not_depend_on_object_order(raw: dict[str, Any], rnd: random.Random) -> None:
    _, d1 = _decide(raw)
    shuffled = dict(raw, objects=rnd.sample(raw["objects"], len(raw["objects"])))
    _, d2 = _decide(shuffled)
    assert d1.answer() == d2.answer()


@SETTINGS
@given(gen.clusters())
def test_engine_agrees_with_reference(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    want = reference.decide(c.cluster, c.preemptors[0], c.now)
    got = {"outcome": d.outcome, "node": d.node, "victims": sorted(v.key for v in d.victims)}
    if want["outcome"] in ("unschedulable", "wait"):
        got["node"] = None
    assert got == want


@SETTINGS
@given(gen.clusters())
def test_violations_are_counted_on_the_final_victims(raw: dict[str, Any]) -> None:
    """Every candidate node is ranked by the PDB violations its final victims really cause.

    Counted by brute force over every PDB (reference.violations_of), not by the
    pre-reprieve classification that orders the reprieve.
    """
    c = case_mod.load(raw, where="generated")
    pod = c.preemptors[0]
    pre = Preemptor(pod, c.cluster.priority(pod), pod.requests)
    for state in c.cluster.nodes.values():
        ev = default.evaluate_node(c.cluster, state, pre, c.now)
        if ev.status == default.CANDIDATE:
            assert ev.violations == reference.violations_of(c.cluster, ev.victims), ev.node
            assert ev.key[0] == ev.violations
