"""The wait rule reads the nominated node's first failing filter in upstream order (docs/semantics.md §3).

kube-scheduler's PodEligibleToPreemptOthers lets a nominated preemptor preempt again
only when its nominated node's status is UnschedulableAndUnresolvable. Filters run
in order and the first failure is the status: a host-port clash (NodePorts,
Unschedulable) comes before NodeResourcesFit, so on a node too small for the
preemptor whose wanted port a victim still holds, kube-scheduler waits.
"""

from __future__ import annotations

from typing import Any

from engine import case as case_mod
from engine.decision import WAIT
from tests.support import gen


def _decide(*, port: bool) -> Any:
    victim = gen.pod("victim", node="n1", priority=0, cpu_m=500, deleting=True, disruption=True)
    pre = gen.pod("p", node=None, priority=1000, cpu_m=3000, nominated="n1")
    if port:
        for pod in (victim, pre):
            pod["spec"]["containers"][0]["ports"] = [{"containerPort": 1, "hostPort": 8080}]
    objects = [gen.node("n1", 2, 8, 110), gen.node("n2", 1, 8, 110), victim]
    return case_mod.answer(case_mod.load({"now": gen.NOW, "objects": objects, "preemptor": [pre]}, where="t"))


def test_a_held_port_on_a_too_small_nominated_node_holds_the_preemptor() -> None:
    assert _decide(port=True).outcome == WAIT


def test_without_the_port_the_too_small_node_does_not() -> None:
    assert _decide(port=False).outcome != WAIT
