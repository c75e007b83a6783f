"""Node filters that preemption cannot fix: cordon, taints, selectors, affinity, too little allocatable.

A node that fails one of these is not a preemption candidate however many pods
leave it (kube-scheduler's UnschedulableAndUnresolvable). Capacity is not
checked here; see `resources`.
"""

from __future__ import annotations

from engine.objects import Node, Pod, Taint

_SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
_CORDON_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


def _tolerated(pod: Pod, taint: Taint) -> bool:
    return any(t.tolerates(taint) for t in pod.tolerations)


def untolerated_taint(node: Node, pod: Pod) -> Taint | None:
    """The first NoSchedule/NoExecute taint of `node` the pod does not tolerate."""
    for taint in node.taints:
        if taint.effect in _SCHEDULING_EFFECTS and not _tolerated(pod, taint):
            return taint
    return None


def selects(node: Node, pod: Pod) -> bool:
    """The pod's nodeSelector and required node affinity both match `node` (NodeAffinity)."""
    for key, value in pod.node_selector:
        if node.labels.get(key) != value:
            return False
    return pod.required_affinity is None or any(
        term.matches(node.name, node.labels) for term in pod.required_affinity
    )


def unresolvable(node: Node, pod: Pod) -> str | None:
    """Why `pod` can never run on `node` whatever is evicted, or None when it could."""
    if node.unschedulable and not _tolerated(pod, _CORDON_TAINT):
        return "node is cordoned (spec.unschedulable)"
    for taint in node.taints:
        if taint.effect in _SCHEDULING_EFFECTS and not _tolerated(pod, taint):
            return f"untolerated taint {taint.key}={taint.value}:{taint.effect}"
    for key, value in pod.node_selector:
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    if pod.required_affinity is not None and not any(
        term.matches(node.name, node.labels) for term in pod.required_affinity
    ):
        return "required node affinity does not match"
    return too_small(node, pod)


def before_ports(node: Node, pod: Pod) -> str | None:
    """`unresolvable` less the allocatable check: the filters kube-scheduler runs before NodePorts."""
    if node.unschedulable and not _tolerated(pod, _CORDON_TAINT):
        return "node is cordoned (spec.unschedulable)"
    taint = untolerated_taint(node, pod)
    if taint is not None:
        return f"untolerated taint {taint.key}={taint.value}:{taint.effect}"
    if not selects(node, pod):
        return "nodeSelector or required node affinity does not match"
    return None


def too_small(node: Node, pod: Pod) -> str | None:
    """The request exceeds what the node has at all (NodeResourcesFit's Unresolvable)."""
    for resource, amount in pod.requests.items():
        # NodeResourcesFit's Unresolvable: the request exceeds what the node has at all, so
        # no eviction can help. Not the pod count: upstream's "Too many pods" is resolvable.
        if resource != "pods" and amount > node.allocatable.get(resource, 0):
            have = node.allocatable.get(resource, 0)
            if not have:
                return f"node has no {resource}"
            return f"node's allocatable {resource} is below the request"
    return None


def required_node(pod: Pod) -> str | None:
    """The one node a DaemonSet pod must run on: its matchFields metadata.name affinity, else nodeName."""
    if pod.required_affinity:
        for term in pod.required_affinity:
            for req in term.fields:
                if req.key == "metadata.name" and req.operator == "In" and len(req.values) == 1:
                    return req.values[0]
    return pod.node
