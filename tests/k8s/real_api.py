"""Pods as the real kube-apiserver stores them, for the tests against it (tests/k8s/test_real_api.py,
test_forged_events.py, test_preemptor_events.py).

- `pod(name, namespace)`: a pod, running and ready when bound to a node (what the kubelet would
  report, so PDBs guard it);
- `preemptor(...)`: a pending pod of `HIGH_PRIORITY_CLASS`, created, as admission stored it;
- `get_pod`: a pod as the server holds it now (None once gone).
The fixtures these tests share (`ns`, `no_component_is_forbidden`) are tests/k8s/conftest.py's.
"""

from __future__ import annotations

import urllib.error
from typing import Any, cast

from testbed import cluster


def pod(
    name: str,
    namespace: str,
    *,
    node_name: str | None = None,
    labels: dict[str, str] | None = None,
    grace: int = 30,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "500m"}}}],
        "terminationGracePeriodSeconds": grace,
    }
    if node_name:
        spec["nodeName"] = node_name
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }
    if node_name:  # what the kubelet would report: running and ready, so PDBs guard it
        obj["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    return obj


# The preemptors' PriorityClass. The actuator takes only victims of lower live priority than the
# live preemptor (issue 29), and the victims here have priority 0. A client cannot give a pod a
# priority of its own: the API server's Priority admission refuses a spec.priority that differs
# from its class's value, and sets it from priorityClassName, as in a real cluster.
HIGH_PRIORITY_CLASS = "preemptctl-test-high"
HIGH_PRIORITY = 1000


def high_priority_class(kube_cluster: cluster.TestCluster) -> None:
    """HIGH_PRIORITY_CLASS in the session's API server (created once; the server keeps it)."""
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": HIGH_PRIORITY_CLASS},
        "value": HIGH_PRIORITY,
        "description": "preemptors of the tests: above their victims' 0",
    }
    try:
        kube_cluster.apply(body)
    except urllib.error.HTTPError as exc:
        if exc.code != 409:  # already there: another test created it
            raise


def preemptor(kube_cluster: cluster.TestCluster, name: str, namespace: str, **kwargs: Any) -> dict[str, Any]:
    """A pending pod of HIGH_PRIORITY_CLASS, as admission stored it (spec.priority from the class)."""
    high_priority_class(kube_cluster)
    obj = pod(name, namespace, **kwargs)
    obj["spec"]["priorityClassName"] = HIGH_PRIORITY_CLASS
    created = kube_cluster.apply(obj)
    assert created["spec"]["priority"] == HIGH_PRIORITY, created["spec"]
    return created


def get_pod(kube_cluster: cluster.TestCluster, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return cast(
            dict[str, Any], kube_cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        )
    except Exception as exc:  # urllib's HTTPError 404
        if getattr(exc, "code", None) == 404:
            return None
        raise
