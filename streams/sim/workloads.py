"""Synthetic clusters shaped like kube-scheduler's scheduler_perf preemption configs.

PreemptionBasic / PreemptionAsync: nodes of 4 CPU / 32Gi / 110 pods, each
filled with 4 low-priority pods of 900m / 500Mi (3.6 CPU used), and
high-priority preemptors of 3000m / 500Mi that can only run by evicting 3 of
them. Objects are raw Kubernetes JSON, so the same workload feeds the engine,
`decide` (as a case file) and the streaming pipeline (as a trace).
"""

from __future__ import annotations

from typing import Any

LOW_PRIORITY = 0
HIGH_PRIORITY = 1000
EPOCH = "2026-01-01T00:00:00Z"


def node(i: int) -> dict[str, Any]:
    name = f"node-{i:05d}"
    alloc = {"cpu": "4", "memory": "32Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"{name}-uid",
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name},
        },
        "spec": {},
        "status": {"allocatable": alloc, "capacity": alloc},
    }


def unschedulable(ts: str) -> dict[str, Any]:
    """A pending pod's status once the scheduler found no node: what asks for preemption."""
    return {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": ts}
        ],
    }


def pod(
    name: str, *, priority: int, cpu: str, memory: str, node: str | None, ts: str = EPOCH
) -> dict[str, Any]:
    status: dict[str, Any]
    if node is None:
        status = unschedulable(ts)
    else:
        status = {
            "phase": "Running",
            "startTime": ts,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ts}],
        }
    spec: dict[str, Any] = {
        "priority": priority,
        "containers": [
            {
                "name": "c",
                "image": "registry.k8s.io/pause:3.9",
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }
        ],
        "terminationGracePeriodSeconds": 30,
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"{name}-uid",
            "resourceVersion": "1",
            "creationTimestamp": ts,
        },
        "spec": spec,
        "status": status,
    }


def cluster_objects(nodes: int, pods_per_node: int = 4) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i in range(nodes):
        n = node(i)
        objs.append(n)
        name = n["metadata"]["name"]
        for j in range(pods_per_node):
            objs.append(pod(f"low-{i:05d}-{j}", priority=LOW_PRIORITY, cpu="900m", memory="500Mi", node=name))
    return objs


def preemptors(count: int) -> list[dict[str, Any]]:
    return [
        pod(f"high-{k:05d}", priority=HIGH_PRIORITY, cpu="3000m", memory="500Mi", node=None)
        for k in range(count)
    ]


def case(nodes: int, pods_per_node: int = 4) -> dict[str, Any]:
    """One large decide case (docs/case-format.md): the whole cluster and a single preemptor."""
    return {
        "name": f"scale-{nodes}-nodes",
        "now": EPOCH,
        "objects": cluster_objects(nodes, pods_per_node),
        "preemptor": preemptors(1),
    }
