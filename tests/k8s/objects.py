"""Kubernetes objects for the scenarios, as the API server would hold them (minus uid and version)."""

from __future__ import annotations

from typing import Any


def node(name: str, *, cpu: str = "4", memory: str = "8Gi") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }


def pod(
    name: str,
    *,
    namespace: str = "default",
    node: str | None = None,
    priority: int = 0,
    cpu: str = "900m",
    scheduler: str | None = None,
    labels: dict[str, str] | None = None,
    grace: int | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        "priority": priority,
    }
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if unschedulable:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": spec,
        "status": status,
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "value": value}


def pdb(name: str, *, namespace: str = "default", app: str = "web", allowed: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": app}}, "maxUnavailable": 1},
        "status": {"disruptionsAllowed": allowed},
    }


def elastic_quota(name: str, *, namespace: str = "default") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"min": {"cpu": "4"}, "max": {"cpu": "8"}},
    }
