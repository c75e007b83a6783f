"""The bundled event traces (docs/case-format.md, traces): the seed examples and PreemptionBasic.

The examples are the seed design's Examples 1-4 (Pod Preemption in Kubernetes),
each on its own nodes in one cluster, plus a PreemptionBasic-shaped trace of any
size. They are generated here so that the bundled trace, the tests and the docs
cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from engine import timeutil
from streams.sim import workloads

T0 = timeutil.parse("2026-01-01T00:00:00Z")
EXAMPLE_LABEL = "preemptctl.example/story"


def _at(seconds: float) -> str:
    return timeutil.render(T0 + int(seconds * timeutil.SECOND))


def _node(name: str, cpu: str) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": "64Gi", "pods": "110"}
    labels = {"kubernetes.io/hostname": name, EXAMPLE_LABEL: name.split("-")[0]}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"{name}-uid", "resourceVersion": "1", "labels": labels},
        "spec": {},
        "status": {"allocatable": alloc, "capacity": alloc},
    }


def _pod(
    name: str, priority: int, cpu: str, *, node: str | None, at: float, grace: int = 30
) -> dict[str, Any]:
    obj = workloads.pod(name, priority=priority, cpu=cpu, memory="100Mi", node=node, ts=_at(at))
    obj["spec"]["terminationGracePeriodSeconds"] = grace
    # Each example keeps to its own nodes, so the four stories do not mix.
    obj["spec"]["nodeSelector"] = {EXAMPLE_LABEL: name.split("-")[0]}
    if node is None:
        obj["status"] = {"phase": "Pending", "conditions": []}  # the simulated scheduler decides
    return obj


def _added(at: float, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": "ADDED", "ts": _at(at), "cluster": "default", "object": obj}


def example() -> list[dict[str, Any]]:
    """Seed 004, Examples 1-4, one after the other on their own nodes (README, "The pipeline")."""
    ev: list[dict[str, Any]] = []
    # Example 1: C (1000) evicts A and B on a 10-unit node; D (50) arrives while they
    # terminate and cannot use their room, because C is nominated there.
    ev += [
        _added(0, _node("ex1-node", "10")),
        _added(1, _pod("ex1-a", 100, "5", node="ex1-node", at=1)),
        _added(1, _pod("ex1-b", 100, "5", node="ex1-node", at=1)),
        _added(10, _pod("ex1-c", 1000, "10", node=None, at=10)),
        _added(15, _pod("ex1-d", 50, "2", node=None, at=15)),
    ]
    # Example 2: while C's victims terminate, E (2000) arrives and takes the node over
    # (A and B are listed again, already terminating); C is left pending.
    ev += [
        _added(100, _node("ex2-node", "10")),
        _added(101, _pod("ex2-a", 100, "5", node="ex2-node", at=101)),
        _added(101, _pod("ex2-b", 100, "5", node="ex2-node", at=101)),
        _added(110, _pod("ex2-c", 1000, "10", node=None, at=110)),
        _added(115, _pod("ex2-e", 2000, "10", node=None, at=115)),
    ]
    # Example 3: a second node has room: D (50) is bound there, no preemption.
    ev += [
        _added(200, _node("ex3-node-1", "10")),
        _added(200, _node("ex3-node-2", "10")),
        _added(201, _pod("ex3-a", 100, "5", node="ex3-node-1", at=201)),
        _added(201, _pod("ex3-b", 100, "5", node="ex3-node-1", at=201)),
        _added(201, _pod("ex3-e", 3000, "8", node="ex3-node-2", at=201)),
        _added(210, _pod("ex3-c", 1000, "10", node=None, at=210)),
        _added(215, _pod("ex3-d", 50, "2", node=None, at=215)),
    ]
    # Example 4: a lower-priority pod F (500) cannot take over the node whose victims
    # are leaving for C: C's nomination still counts against it.
    ev += [
        _added(300, _node("ex4-node", "10")),
        _added(301, _pod("ex4-a", 100, "5", node="ex4-node", at=301)),
        _added(301, _pod("ex4-b", 100, "5", node="ex4-node", at=301)),
        _added(310, _pod("ex4-c", 1000, "10", node=None, at=310)),
        _added(315, _pod("ex4-f", 500, "10", node=None, at=315)),
    ]
    ev.sort(key=lambda e: e["ts"])  # stable: equal times keep the order written above
    return ev


def basic(nodes: int, preemptors: int | None = None, *, spacing: float = 0.01) -> list[dict[str, Any]]:
    """PreemptionBasic as a trace: the filled cluster, then one 3-CPU preemptor per node."""
    ev = [_added(0, obj) for obj in workloads.cluster_objects(nodes)]
    for k, obj in enumerate(workloads.preemptors(nodes if preemptors is None else preemptors)):
        at = 1 + k * spacing
        obj["status"] = {"phase": "Pending", "conditions": []}
        obj["metadata"]["creationTimestamp"] = _at(at)
        ev.append(_added(at, obj))
    return ev
