"""The cluster's label indexes (`Cluster.bound_labelled`, `Cluster.nodes_labelled`) against a scan.

The inter-pod filters read the pods a selector can match and the nodes of a domain
from indexes the cluster builds when first asked and then keeps as objects change.
Over any sequence of watch events (pods created, bound, relabelled, moved between
namespaces' labels, finished, deleted; nodes added, relabelled, removed), asked at
any point, each index must equal a plain scan of the cluster's tables.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster import Cluster

KEYS = ("app", "tier")
VALUES = ("a", "b")
NAMESPACES = ("n1", "n2")
NODES = ("w1", "w2", "w3")


def _pod(
    i: int, namespace: str, labels: dict[str, str], node: str | None, phase: str, rv: int
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {
            "name": f"p{i}",
            "namespace": namespace,
            "uid": f"u{i}",
            "labels": labels,
            "resourceVersion": str(rv),
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]},
        "status": {"phase": phase},
    }
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def _node(name: str, labels: dict[str, str], rv: int) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "resourceVersion": str(rv)},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    }


labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("pod"),
            st.integers(0, 5),
            st.sampled_from(NAMESPACES),
            labels,
            st.sampled_from([None, *NODES]),
            st.sampled_from(["Pending", "Running", "Succeeded"]),
        ),
        st.tuples(st.just("delete-pod"), st.integers(0, 5)),
        st.tuples(st.just("node"), st.sampled_from(NODES), labels),
        st.tuples(st.just("delete-node"), st.sampled_from(NODES)),
        st.tuples(st.just("ask"), st.sampled_from(NAMESPACES), st.sampled_from(KEYS)),
    ),
    max_size=40,
)


def _check(c: Cluster) -> None:
    for ns in NAMESPACES:
        for key in KEYS:
            for values in (("a",), ("b",), ("a", "b")):
                want = {u for u, p in c.bound_in(ns).items() if p.labels.get(key) in values}
                assert set(c.bound_labelled(ns, key, values)) == want, (ns, key, values)
    for key in KEYS:
        want_nodes: dict[str, set[str]] = {}
        for name, state in c.nodes.items():
            if key in state.node.labels:
                want_nodes.setdefault(state.node.labels[key], set()).add(name)
        assert {v: set(n) for v, n in c.nodes_labelled(key).items()} == want_nodes, key


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_label_indexes_are_what_a_scan_finds_after_any_events(events: list[tuple[Any, ...]]) -> None:
    c = Cluster()
    held: dict[int, dict[str, Any]] = {}
    for rv, step in enumerate(events, start=1):
        kind = step[0]
        if kind == "pod":
            _, i, ns, lab, node, phase = step
            seen = i in held
            ns = held[i]["metadata"]["namespace"] if seen else ns  # a pod keeps its namespace
            held[i] = _pod(i, ns, dict(lab), node, phase, rv)
            c.apply("MODIFIED" if seen else "ADDED", held[i])
        elif kind == "delete-pod":
            if step[1] in held:
                c.apply("DELETED", held.pop(step[1]))
        elif kind == "node":
            c.apply("MODIFIED", _node(step[1], {"kubernetes.io/hostname": step[1], **step[2]}, rv))
        elif kind == "delete-node":
            if step[1] in c.nodes:
                c.apply("DELETED", _node(step[1], {}, rv))
        else:
            c.bound_labelled(step[1], step[2], VALUES)  # build an index mid-way
            c.nodes_labelled(step[2])
        _check(c)
