"""Objects for the end-to-end tests and the e2e benchmark: kwok nodes, pods, PDBs, PriorityClasses."""

from __future__ import annotations

from typing import Any

from tests.e2e.stack import PREEMPTCTL_SCHEDULER

# Every object a test creates carries this label with the test's name: its pods pick its
# nodes by it (nodeSelector), so tests do not share capacity.
GROUP = "e2e.preemptctl.io/group"
PAUSE = "registry.k8s.io/pause:3.9"


def node(name: str, group: str, *, cpu: str = "4", pods: int = 110, taint: bool = False) -> dict[str, Any]:
    """A kwok node: kwok makes it Ready and runs the pods bound to it."""
    spec: dict[str, Any] = {}
    if taint:
        spec["taints"] = [{"key": "e2e.preemptctl.io/closed", "value": "yes", "effect": "NoSchedule"}]
    allocatable = {"cpu": cpu, "memory": "64Gi", "pods": str(pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {GROUP: group, "kubernetes.io/hostname": name, "type": "kwok"},
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def pod(
    name: str,
    namespace: str,
    group: str,
    *,
    cpu: str,
    priority_class: str | None = None,
    node: str | None = None,
    scheduler: str | None = PREEMPTCTL_SCHEDULER,
    labels: dict[str, str] | None = None,
    grace: int = 0,
) -> dict[str, Any]:
    """A pod of `group`; bound straight to `node` when given (a running victim), else scheduled
    by `scheduler` (preemptctl's profile by default) onto the group's nodes."""
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": PAUSE, "resources": {"requests": {"cpu": cpu}}}],
        "nodeSelector": {GROUP: group},
        "terminationGracePeriodSeconds": grace,
        # kwok nodes carry no taint of their own; tolerate kwok's in case a build adds one.
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node:
        spec["nodeName"] = node
    elif scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {GROUP: group, **(labels or {})}},
        "spec": spec,
    }


def priority_class(name: str, value: int, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "annotations": annotations or {}},
        "value": value,
    }


def pdb(name: str, namespace: str, app: str, *, allowed: int, healthy: int) -> dict[str, Any]:
    """A PDB with the status the disruption controller would write (none runs here)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": app}}, "minAvailable": healthy - allowed},
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": healthy - allowed,
            "expectedPods": healthy,
            "observedGeneration": 1,
        },
    }
