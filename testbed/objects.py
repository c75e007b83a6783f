"""Objects for the end-to-end tests and the e2e benchmark: kwok nodes, pods, PDBs, PriorityClasses.

Pods may also carry what the inter-pod filters read (issue 28): host ports (`host_port`),
required pod anti-affinity (`anti_affinity`) and topology spread (`spread`).
"""

from __future__ import annotations

from typing import Any

from testbed.stack import PREEMPTCTL_SCHEDULER

# Every object a test creates carries this label with the test's name: its pods pick its
# nodes by it (nodeSelector), so tests do not share capacity.
GROUP = "e2e.preemptctl.io/group"
PAUSE = "registry.k8s.io/pause:3.9"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def node(
    name: str,
    group: str,
    *,
    cpu: str = "4",
    pods: int = 110,
    taint: bool = False,
    zone: str | None = None,
) -> dict[str, Any]:
    """A kwok node: kwok makes it Ready and runs the pods bound to it; in `zone` when given."""
    spec: dict[str, Any] = {}
    if taint:
        spec["taints"] = [{"key": "e2e.preemptctl.io/closed", "value": "yes", "effect": "NoSchedule"}]
    allocatable = {"cpu": cpu, "memory": "64Gi", "pods": str(pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {GROUP: group, HOSTNAME: name, "type": "kwok", **({ZONE: zone} if zone else {})},
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
    host_port: int | None = None,
    anti_affinity: dict[str, Any] | None = None,
    spread: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod of `group`; bound straight to `node` when given (a running victim), else scheduled
    by `scheduler` (preemptctl's profile by default) onto the group's nodes.

    `host_port`: its container asks for that TCP host port. `anti_affinity`: one required pod
    anti-affinity term (`anti_affinity_term`). `spread`: one topology spread constraint
    (`spread_constraint`)."""
    container: dict[str, Any] = {"name": "c", "image": PAUSE, "resources": {"requests": {"cpu": cpu}}}
    if host_port is not None:
        container["ports"] = [{"containerPort": host_port, "hostPort": host_port, "protocol": "TCP"}]
    spec: dict[str, Any] = {
        "containers": [container],
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
    if anti_affinity is not None:
        spec["affinity"] = {
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [anti_affinity]}
        }
    if spread is not None:
        spec["topologySpreadConstraints"] = [spread]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {GROUP: group, **(labels or {})}},
        "spec": spec,
    }


def anti_affinity_term(labels: dict[str, str], topology_key: str = HOSTNAME) -> dict[str, Any]:
    """A required pod anti-affinity term: the pods of its namespace labelled `labels`, by `topology_key`."""
    return {"labelSelector": {"matchLabels": dict(labels)}, "topologyKey": topology_key}


def spread_constraint(
    labels: dict[str, str], topology_key: str = ZONE, *, max_skew: int = 1
) -> dict[str, Any]:
    """A hard (DoNotSchedule) topology spread constraint over the pods labelled `labels`."""
    return {
        "maxSkew": max_skew,
        "topologyKey": topology_key,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": dict(labels)},
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
