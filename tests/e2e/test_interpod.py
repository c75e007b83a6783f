"""The filters that read other pods, end to end (issue 28, 4): each preemptor ends bound where decided.

kube-scheduler v1.34 runs every Filter plugin inside preemption, NodePorts,
InterPodAffinity and PodTopologySpread among them (docs/semantics.md §1,
engine/interpod.py). Each case here is a pod kube-scheduler cannot place on any
node until a lower-priority pod goes, although CPU alone would let it fit: a
decider that read resources only would answer `fits`, nobody would evict, and
the pod would stay pending for good. On kwok nodes with the real kube-scheduler
(preemptctl's profile, DefaultPreemption off), each preemptor must end bound on
the node of preemptctl's decision, with exactly that decision's victims gone.

Each case is set up so only one answer is right: the pods that must stay are of
the preemptor's own priority (never victims) or cure nothing, so the decided node
and victims are asserted as kube-scheduler's DefaultPreemption would choose them.
Waits are generous deadlines for a loaded machine (tests/e2e/waits.py),
never timings asserted.
"""

from __future__ import annotations

import contextlib
import functools
import time
import urllib.error
from typing import Any

import pytest

from testbed import objects
from testbed.stack import ControlPlane, Stack, wait_for
from tests.e2e.waits import (
    BIND_TIMEOUT_S,
    HIGH,
    LOW,
    NAMESPACE,
    SETTLE_S,
    decisions_for,
    phase,
    preempted_exactly,
    watch_until_bound,
)

START_S = 60.0  # kwok making a node Ready or a bound pod Running


@pytest.fixture(scope="session", autouse=True)
def interpod_priority_classes(plane: ControlPlane) -> None:
    """The classes test_loop.py uses, with the same values (whichever module runs first creates them)."""
    for name, value in ((LOW, 10), (HIGH, 1000)):
        with contextlib.suppress(urllib.error.HTTPError):  # 409: already there
            plane.create(objects.priority_class(name, value))


def _nodes(plane: ControlPlane, group: str, zones: dict[str, str | None]) -> list[str]:
    """Nodes `<group>-<suffix>` for each suffix of `zones`, each in its zone (None: no zone label)."""
    names = [f"{group}-{suffix}" for suffix in zones]
    for name, zone in zip(names, zones.values(), strict=True):
        plane.create(objects.node(name, group, zone=zone))
    for name in names:
        wait_for(functools.partial(plane.ready_node, name), f"kwok made {name} Ready", START_S)
    return names


def _running(plane: ControlPlane, pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Create pods bound straight to their nodes; returns them by name once kwok runs them."""
    made = {p["metadata"]["name"]: plane.create(p) for p in pods}
    for name in made:
        wait_for(functools.partial(_runs, plane, name), f"kwok runs {name}", START_S)
    return made


def _runs(plane: ControlPlane, name: str) -> bool:
    return phase(plane, name) == "Running"


def _describe(decisions: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{d['outcome']} node={d.get('node')} victims={sorted(v['name'] for v in d['victims'])}"
        f" reason={d.get('reason')!r}"
        for d in decisions
    )


def _scheduler_message(plane: ControlPlane, name: str) -> str:
    pod = plane.pod(NAMESPACE, name)
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c.get("message", "") for c in conditions if c.get("type") == "PodScheduled"), "")


def _ends_bound_where_decided(
    plane: ControlPlane,
    loop: Stack,
    preemptor: dict[str, Any],
    running: dict[str, dict[str, Any]],
    *,
    node: str,
    victims: set[str],
) -> None:
    """`preemptor` (just created) ends bound on its decision's node, which is `node`, with exactly
    the decision's victims, which are `victims`, gone and every other pod of `running` still there."""
    name, uid = preemptor["metadata"]["name"], preemptor["metadata"]["uid"]
    try:
        bound, nominations = watch_until_bound(plane, name)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\ndecisions for {name}: {_describe(decisions_for(loop, uid)) or 'none'}"
            f"\nkube-scheduler: {_scheduler_message(plane, name)!r}"
        ) from None
    decided = decisions_for(loop, uid)
    # Never `fits` (the answer before issue 28) nor anything else: every decision preempts, alike.
    assert decided and all(d["outcome"] == "preempt" for d in decided), _describe(decided)
    decision = decided[0]
    chosen = {v["name"] for v in decision["victims"]}
    assert all(
        d["node"] == decision["node"] and {v["name"] for v in d["victims"]} == chosen for d in decided
    ), _describe(decided)
    assert bound == decision["node"], f"bound on {bound}; {_describe(decided)}"
    assert (decision["node"], chosen) == (node, victims), _describe(decided)
    assert {v["node"] for v in decision["victims"]} == {node}, decision["victims"]
    assert [n for n in nominations if n is not None] in ([], [node]), nominations
    preempted_exactly(plane, decision, running)
    time.sleep(SETTLE_S)  # long enough for a wrong later eviction to show
    preempted_exactly(plane, decision, running)


def test_required_anti_affinity_by_hostname_preempts_the_matching_pod_on_the_decided_node(
    plane: ControlPlane, loop: Stack
) -> None:
    """Every node runs a low-priority `app=aa-x` pod and has room: the preemptor's required
    anti-affinity (hostname) passes nowhere until one of them goes. On the node preempted, the
    other low-priority pod neither blocks nor frees anything, so it stays (reprieved)."""
    group = "aa"
    x = {"app": "aa-x"}
    nodes = _nodes(plane, group, {"n0": None, "n1": None})
    running = _running(
        plane,
        [
            objects.pod(f"{n}-x", NAMESPACE, group, cpu="1", priority_class=LOW, node=n, labels=x)
            for n in nodes
        ]
        + [objects.pod(f"{n}-other", NAMESPACE, group, cpu="1", priority_class=LOW, node=n) for n in nodes],
    )
    preemptor = plane.create(
        objects.pod(
            "aa-p",
            NAMESPACE,
            group,
            cpu="1",
            priority_class=HIGH,
            anti_affinity=objects.anti_affinity_term(x),
        )
    )
    # Both nodes are equal for kube-scheduler: the decision picks one, and its x pod is the victim.
    uid = preemptor["metadata"]["uid"]
    first = wait_for(lambda: decisions_for(loop, uid), "aa-p decided", BIND_TIMEOUT_S)[0]
    node = first.get("node") or "(none)"
    _ends_bound_where_decided(plane, loop, preemptor, running, node=node, victims={f"{node}-x"})
    assert node in nodes


def test_a_host_port_held_on_the_only_fitting_node_is_freed_by_preempting_its_holder(
    plane: ControlPlane, loop: Stack
) -> None:
    """n0 has CPU to spare but a low-priority pod holds hostPort 8080 there; n1 is full of a pod of
    the preemptor's own priority. Only evicting the port's holder on n0 lets the preemptor in;
    n0's other low-priority pod (no port) stays."""
    group = "port"
    n0, n1 = _nodes(plane, group, {"n0": None, "n1": None})
    running = _running(
        plane,
        [
            objects.pod(
                f"{n0}-holder", NAMESPACE, group, cpu="1", priority_class=LOW, node=n0, host_port=8080
            ),
            objects.pod(f"{n0}-other", NAMESPACE, group, cpu="1", priority_class=LOW, node=n0),
            objects.pod(
                f"{n1}-full", NAMESPACE, group, cpu="4", priority_class=HIGH, node=n1, host_port=9090
            ),
        ],
    )
    preemptor = plane.create(
        objects.pod("port-p", NAMESPACE, group, cpu="1", priority_class=HIGH, host_port=8080)
    )
    _ends_bound_where_decided(plane, loop, preemptor, running, node=n0, victims={f"{n0}-holder"})


def test_zone_spread_preempts_in_the_under_filled_zone(plane: ControlPlane, loop: Stack) -> None:
    """maxSkew 1 by zone, DoNotSchedule, over `app=spread-web`. Zone a runs two matching pods (one
    on each of its nodes, both with room), zone b one, on a node a low-priority filler makes full.
    In zone a the skew would be 3 - 1 = 2; in zone b it is 2 - 2 = 0, once the filler goes. The
    matching pods are of the preemptor's priority, so no eviction in zone a could cure the skew."""
    group = "spread"
    web = {"app": "spread-web"}
    a0, a1, b0 = _nodes(plane, group, {"a0": "spread-za", "a1": "spread-za", "b0": "spread-zb"})
    running = _running(
        plane,
        [
            *(
                objects.pod(f"{n}-web", NAMESPACE, group, cpu="1", priority_class=HIGH, node=n, labels=web)
                for n in (a0, a1, b0)
            ),
            objects.pod(f"{b0}-filler", NAMESPACE, group, cpu="3", priority_class=LOW, node=b0),
        ],
    )
    preemptor = plane.create(
        objects.pod(
            "spread-p",
            NAMESPACE,
            group,
            cpu="1",
            priority_class=HIGH,
            labels=web,  # it counts itself, as a replica of the workload it spreads
            spread=objects.spread_constraint(web, objects.ZONE, max_skew=1),
        )
    )
    _ends_bound_where_decided(plane, loop, preemptor, running, node=b0, victims={f"{b0}-filler"})


def test_a_namespace_selector_picks_by_the_namespace_label_and_its_pod_is_preempted(
    plane: ControlPlane, loop: Stack
) -> None:
    """The preemptor's required anti-affinity (hostname) is against app=nsl-x pods of the namespaces
    labelled team=nsl-a (namespaceSelector), and the e2e namespace gets that label: the source
    writes the Namespace and the worker folds its labels. The only node is full with two
    low-priority pods, x and then y: for room alone y (the later started) would go and x be
    reprieved, but x keeps the preemptor out, so x is the victim and y stays. Matched against the
    name label alone (before Namespaces were read) the term picks nothing and y would go, and the
    pod stay pending. (The node is full so that NodeResourcesFit, which kube-scheduler retries on
    a pod's deletion, rejects first: InterPodAffinity's retry hint matches a deleted pod without
    namespace labels, so a selector like this one never retries on it.)"""
    group = "nsl"
    x = {"app": "nsl-x"}
    plane.patch(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"metadata": {"labels": {"team": "nsl-a"}}},
    )
    (node,) = _nodes(plane, group, {"n0": None})
    running = _running(
        plane, [objects.pod(f"{node}-x", NAMESPACE, group, cpu="2", priority_class=LOW, node=node, labels=x)]
    )
    time.sleep(1.1)  # y starts a second later (startTime has seconds): the less important of the two
    running |= _running(
        plane, [objects.pod(f"{node}-y", NAMESPACE, group, cpu="2", priority_class=LOW, node=node)]
    )
    term = {**objects.anti_affinity_term(x), "namespaceSelector": {"matchLabels": {"team": "nsl-a"}}}
    preemptor = plane.create(
        objects.pod("nsl-p", NAMESPACE, group, cpu="1", priority_class=HIGH, anti_affinity=term)
    )
    _ends_bound_where_decided(plane, loop, preemptor, running, node=node, victims={f"{node}-x"})
