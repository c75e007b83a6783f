"""Hypothesis strategies for small random clusters, as raw Kubernetes objects.

Clusters are kept small (a handful of nodes and pods, few distinct priorities
and sizes) so that ties, PDB budgets, tolerations, nominations and terminating
pods all occur often.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from engine import resources
from engine.case import Case

NOW = "2026-01-01T00:00:00Z"
PRIORITIES = (0, 10, 100, 1000)
TIMES = ("2025-12-31T20:00:00Z", "2025-12-31T22:00:00Z", "2025-12-31T23:59:00Z")


def node(
    name: str, cpu: int, mem: int, pods: int, *, taint: bool = False, cordon: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {"unschedulable": cordon}
    if taint:
        spec["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"{name}-uid", "labels": {"zone": "a" if name < "n3" else "b"}},
        "spec": spec,
        "status": {"allocatable": {"cpu": str(cpu), "memory": f"{mem}Gi", "pods": str(pods)}},
    }


def pod(
    name: str,
    *,
    node: str | None,
    priority: int,
    cpu_m: int,
    mem_gi: int = 0,
    start: str | None = TIMES[0],
    labels: dict[str, str] | None = None,
    deleting: bool = False,
    disruption: bool = False,
    nominated: str | None = None,
    priority_class: str | None = None,
    guaranteed: bool = False,
    policy: str | None = None,
) -> dict[str, Any]:
    req: dict[str, str] = {}
    if cpu_m:
        req["cpu"] = f"{cpu_m}m"
    if mem_gi:
        req["memory"] = f"{mem_gi}Gi"
    resources: dict[str, Any] = {"requests": req}
    if guaranteed and req:
        resources["limits"] = dict(req)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"{name}-uid",
        "labels": labels or {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-12-31T23:59:50Z"
    spec: dict[str, Any] = {"priority": priority, "containers": [{"name": "c", "resources": resources}]}
    if node:
        spec["nodeName"] = node
    if priority_class:
        spec["priorityClassName"] = priority_class
    if policy:
        spec["preemptionPolicy"] = policy
    status: dict[str, Any] = {"phase": "Running" if node else "Pending", "conditions": []}
    if start and node:
        status["startTime"] = start
        status["conditions"].append({"type": "PodScheduled", "status": "True", "lastTransitionTime": start})
    if disruption:
        status["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        )
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def pdb(name: str, app: str, allowed: int, *, disrupted: tuple[str, ...] = ()) -> dict[str, Any]:
    status: dict[str, Any] = {"disruptionsAllowed": allowed}
    if disrupted:
        status["disruptedPods"] = {pod: "2025-12-31T23:59:00Z" for pod in disrupted}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default", "uid": f"{name}-uid"},
        "spec": {"selector": {"matchLabels": {"app": app}}},
        "status": status,
    }


def tolerant_class() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": "tolerant",
            "uid": "tolerant-uid",
            "annotations": {
                "preemption-toleration.scheduling.x-k8s.io/minimum-preemptable-priority": "1000",
                "preemption-toleration.scheduling.x-k8s.io/toleration-seconds": "3600",
            },
        },
        "value": 10,
    }


@st.composite
def clusters(draw: st.DrawFn, *, max_nodes: int = 4, max_pods: int = 14) -> dict[str, Any]:
    """{objects, preemptor, now}: a cluster and one pending default-flow preemptor."""
    n_nodes = draw(st.integers(1, max_nodes))
    objects: list[dict[str, Any]] = [tolerant_class()]
    names = [f"n{i}" for i in range(1, n_nodes + 1)]
    for name in names:
        objects.append(
            node(
                name,
                draw(st.sampled_from((2, 3))),
                draw(st.sampled_from((3, 8))),
                draw(st.sampled_from((3, 110))),
                taint=draw(st.integers(0, 5)) == 0,
                cordon=draw(st.integers(0, 9)) == 0,
            )
        )
    for i in range(draw(st.integers(n_nodes, max_pods))):
        bound = draw(st.sampled_from(names))
        prio = draw(st.sampled_from(PRIORITIES))
        tolerant = prio == 10 and draw(st.booleans())
        objects.append(
            pod(
                f"p{i}",
                node=bound,
                priority=prio,
                cpu_m=draw(st.sampled_from((0, 500, 1000, 1000, 1500))),
                mem_gi=draw(st.sampled_from((0, 1, 2))),
                start=draw(st.sampled_from((*TIMES, None))),
                labels={"app": draw(st.sampled_from(("web", "db", "batch")))},
                deleting=(deleting := draw(st.integers(0, 7)) == 0),
                disruption=deleting and draw(st.booleans()),
                priority_class="tolerant" if tolerant else None,
                guaranteed=draw(st.booleans()),
            )
        )
    for i in range(draw(st.integers(0, 2))):
        objects.append(
            pod(
                f"nom{i}",
                node=None,
                priority=draw(st.sampled_from(PRIORITIES)),
                cpu_m=draw(st.sampled_from((500, 1000))),
                nominated=draw(st.sampled_from(names)),
            )
        )
    for app in draw(st.lists(st.sampled_from(("web", "db")), unique=True, min_size=1, max_size=2)):
        # Now and then a pod the budget already counts as disrupted (it spends nothing).
        disrupted = (f"p{draw(st.integers(0, max_pods))}",) if draw(st.integers(0, 3)) == 0 else ()
        objects.append(pdb(f"pdb-{app}", app, draw(st.integers(0, 1)), disrupted=disrupted))
    preemptor = pod(
        "preemptor",
        node=None,
        priority=draw(st.sampled_from((10, 100, 1000, 5000, 5000, 5000))),
        cpu_m=draw(st.sampled_from((1000, 1500, 2000, 3000))),
        mem_gi=draw(st.sampled_from((0, 1, 3))),
        nominated=draw(st.sampled_from((None, *names))),
        policy=draw(st.sampled_from((None, None, None, "Never"))),
    )
    return {"objects": objects, "preemptor": [preemptor], "now": NOW, "name": "generated"}


def free_after(c: Case, node: str, evicted: set[str]) -> dict[str, int]:
    """Free resources on `node` with `evicted` gone and nominated pods >= the preemptor counted.

    Recomputed from the raw records, independently of the engine's index.
    """
    cluster = c.cluster
    pre = c.preemptors[0]
    prio = cluster.priority(pre)
    free = dict(cluster.nodes[node].node.allocatable)
    for p in cluster.pods.values():
        if p.terminal or p.uid in evicted or p.uid == pre.uid:
            continue
        if p.node == node or (p.node is None and p.nominated == node and cluster.priority(p) >= prio):
            resources.sub(free, p.requests)
    return free
