from typing import Any

import pytest

from engine import objects, placement


def _node(**kw: Any) -> objects.Node:
    spec = {"unschedulable": kw.get("cordon", False), "taints": kw.get("taints", [])}
    meta = {"name": kw.get("name", "n1"), "labels": kw.get("labels", {"zone": "a", "gen": "5"})}
    return objects.node(
        {
            "kind": "Node",
            "metadata": meta,
            "spec": spec,
            "status": {"allocatable": {"cpu": "4", "memory": "4Gi", "pods": "10"}},
        }
    )


def _pod(**spec: Any) -> objects.Pod:
    spec.setdefault("containers", [{"resources": {"requests": {"cpu": "1"}}}])
    return objects.pod({"kind": "Pod", "metadata": {"name": "p"}, "spec": spec})


def test_cordoned_node_is_unresolvable_unless_tolerated() -> None:
    assert placement.unresolvable(_node(cordon=True), _pod()) is not None
    tol = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
    assert placement.unresolvable(_node(cordon=True), _pod(tolerations=tol)) is None


@pytest.mark.parametrize(
    ("taint", "toleration", "ok"),
    [
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, None, False),
        ({"key": "k", "value": "v", "effect": "NoExecute"}, None, False),
        ({"key": "k", "value": "v", "effect": "PreferNoSchedule"}, None, True),
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, {"key": "k", "value": "v"}, True),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"key": "k", "operator": "Equal", "value": "w"},
            False,
        ),
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, {"key": "k", "operator": "Exists"}, True),
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, {"operator": "Exists"}, True),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            {"key": "k", "operator": "Exists", "effect": "NoExecute"},
            False,
        ),
    ],
)
def test_taints_and_tolerations(taint: dict, toleration: dict | None, ok: bool) -> None:
    pod = _pod(tolerations=[toleration] if toleration else [])
    assert (placement.unresolvable(_node(taints=[taint]), pod) is None) is ok


def _affinity(*terms: dict) -> dict:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


@pytest.mark.parametrize(
    ("term", "ok"),
    [
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, False),
        ({"matchExpressions": [{"key": "missing", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, False),
        ({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]}, True),
        ({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["5"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}, False),
        ({}, False),
    ],
)
def test_required_node_affinity_operators(term: dict, ok: bool) -> None:
    assert (placement.unresolvable(_node(), _pod(affinity=_affinity(term))) is None) is ok


def test_affinity_terms_are_ored_and_expressions_anded() -> None:
    a = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}
    b = {
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "gen", "operator": "In", "values": ["5"]},
        ]
    }
    assert placement.unresolvable(_node(), _pod(affinity=_affinity(a, b))) is None
    c = {
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "gen", "operator": "In", "values": ["6"]},
        ]
    }
    assert placement.unresolvable(_node(), _pod(affinity=_affinity(a, c))) is not None


def test_node_selector_and_missing_resources() -> None:
    assert placement.unresolvable(_node(), _pod(nodeSelector={"zone": "a"})) is None
    assert placement.unresolvable(_node(), _pod(nodeSelector={"zone": "b"})) is not None
    gpu = [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}]
    assert "nvidia.com/gpu" in (placement.unresolvable(_node(), _pod(containers=gpu)) or "")


def test_a_request_beyond_allocatable_is_unresolvable_but_the_pod_count_is_not() -> None:
    """NodeResourcesFit's Unresolvable: a request larger than the node's allocatable can
    never fit whatever leaves; "Too many pods" can (upstream marks it resolvable)."""
    big = [{"resources": {"requests": {"cpu": "5"}}}]
    assert (
        placement.unresolvable(_node(), _pod(containers=big)) == "node's allocatable cpu is below the request"
    )
    exact = [{"resources": {"requests": {"cpu": "4", "memory": "4Gi"}}}]
    assert placement.unresolvable(_node(), _pod(containers=exact)) is None
    no_pods = objects.node(
        {"kind": "Node", "metadata": {"name": "n0"}, "status": {"allocatable": {"cpu": "4", "pods": "0"}}}
    )
    assert placement.unresolvable(no_pods, _pod()) is None


def test_required_node_of_a_daemonset_pod() -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w1"]}]}
    assert placement.required_node(_pod(affinity=_affinity(term))) == "w1"
    assert placement.required_node(_pod(nodeName="w2")) == "w2"
