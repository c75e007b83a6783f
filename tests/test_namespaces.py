"""Namespace objects: their labels are what a pod (anti-)affinity term's namespaceSelector matches.

Units for the record (engine.objects), the index (engine.cluster), the record check
(schemas.records) and the fold (fold.controller), and a property: on
generated clusters whose pods live in several namespaces, some with a Namespace
object and labels, a term's `namespaceSelector` decides as the `namespaces` list of
exactly the namespaces whose labels it matches; and Namespace objects that carry
only the name label decide as no Namespace objects at all (as before they were read).
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import flows, objects
from engine.cluster import Cluster
from engine.config import Config
from engine.constraints import NAMESPACE_NAME_LABEL
from engine.errors import InvalidObject
from engine.selectors import LabelSelector
from fold.controller import BadEvent, Controller
from schemas import records

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOST, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
NAMESPACES = ("default", "alpha", "beta", "gamma")
TEAMS = ("a", "b")


def _namespace(name: str, labels: dict[str, str] | None = None, rv: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"{name}-uid", "resourceVersion": rv}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


# ---- the record and the index ----------------------------------------------------------------


def test_a_namespace_record_keeps_its_labels_and_always_its_name_label() -> None:
    ns = objects.normalize(_namespace("alpha", {"team": "a"}))
    assert isinstance(ns, objects.Namespace)
    assert ns.name == "alpha" and ns.uid == "alpha-uid" and ns.resource_version == "1"
    assert ns.labels == {"team": "a", NAMESPACE_NAME_LABEL: "alpha"}
    # The API server sets the name label whatever the object says; a hand-written one may not.
    forged = objects.normalize(_namespace("alpha", {NAMESPACE_NAME_LABEL: "beta"}))
    assert isinstance(forged, objects.Namespace) and forged.labels == {NAMESPACE_NAME_LABEL: "alpha"}
    bare = objects.normalize(_namespace("beta"))
    assert isinstance(bare, objects.Namespace) and bare.labels == {NAMESPACE_NAME_LABEL: "beta"}


@pytest.mark.parametrize(
    "raw",
    [
        {"kind": "Namespace"},
        {"kind": "Namespace", "metadata": {}},
        {"kind": "Namespace", "metadata": {"name": "alpha", "labels": ["team"]}},
    ],
)
def test_a_namespace_without_a_name_or_with_bad_labels_is_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(InvalidObject):
        objects.normalize(raw)


def test_the_index_knows_a_namespace_by_its_labels_and_an_unseen_one_by_its_name() -> None:
    cluster = Cluster()
    assert cluster.namespace_labels("alpha") == {NAMESPACE_NAME_LABEL: "alpha"}
    assert cluster.apply("ADDED", _namespace("alpha", {"team": "a"}, rv="5")) == ("Namespace/alpha", True)
    assert cluster.namespace_labels("alpha") == {"team": "a", NAMESPACE_NAME_LABEL: "alpha"}
    assert ("Namespace", "alpha") in cluster.all_keys()
    # An older event is already reflected; a newer one replaces the labels.
    assert cluster.apply("MODIFIED", _namespace("alpha", {"team": "b"}, rv="4"))[1] is False
    assert cluster.apply("MODIFIED", _namespace("alpha", {"team": "b"}, rv="6"))[1] is True
    assert cluster.namespace_labels("alpha")["team"] == "b"
    # Deleted: back to the name alone, and a re-delivered older event cannot bring it back.
    assert cluster.apply("DELETED", _namespace("alpha", rv="7"))[1] is True
    assert cluster.namespace_labels("alpha") == {NAMESPACE_NAME_LABEL: "alpha"}
    assert cluster.apply("MODIFIED", _namespace("alpha", {"team": "a"}, rv="6"))[1] is False
    assert "alpha" not in cluster.namespaces
    # No node is touched: namespace labels are read per decision.
    assert cluster.touched == []


# ---- the record check ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ok"),
    [("alpha", True), ("team-a", True), ("a.b", False), ("Alpha", False), ("-a", False), ("a" * 64, False)],
)
def test_a_namespace_is_named_by_a_dns_label(name: str, ok: bool) -> None:
    problem = records.object_problem(_namespace(name))
    assert (problem is None) == ok, problem
    if not ok:
        assert "DNS-1123" in str(problem)
    # A dotted name is fine for any other kind.
    assert records.object_problem({"kind": "PriorityClass", "metadata": {"name": "a.b"}}) is None


def test_the_worker_refuses_a_namespace_named_as_no_namespace_can_be() -> None:
    ctl = Controller("c", Config())
    event = {"type": "ADDED", "ts": "2026-01-01T00:00:00Z", "object": _namespace("a.b", {"team": "a"})}
    with pytest.raises(BadEvent):
        ctl.step(event)
    assert ctl.cluster.namespaces == {}
    ctl.step({**event, "object": _namespace("alpha", {"team": "a"})})
    assert ctl.cluster.namespace_labels("alpha")["team"] == "a"


# ---- a namespace's labels change a pending preemptor's answer -----------------------------------

_NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "n1", "uid": "n1-uid", "resourceVersion": "1", "labels": {HOST: "n1"}},
    "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
}


def _guarded_pod(name: str, namespace: str, *, node: str | None, rv: str) -> dict[str, Any]:
    """A pod of 1 cpu; bound: a guard whose anti-affinity keeps role=batch pods of team=a away."""
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"{name}-uid", "resourceVersion": rv}
    if node is not None:
        spec["priority"] = 0
        spec["nodeName"] = node
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"role": "batch"}},
                        "namespaceSelector": {"matchLabels": {"team": "a"}},
                        "topologyKey": HOST,
                    }
                ]
            }
        }
        status: dict[str, Any] = {"phase": "Running", "startTime": "2025-12-31T00:00:00Z"}
    else:
        spec["priority"] = 100
        meta["labels"] = {"role": "batch"}
        status = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def test_a_namespace_labelled_later_wakes_the_preemptor_it_concerns() -> None:
    ctl = Controller("c", Config())
    first = [
        {"type": "ADDED", "ts": "2026-01-01T00:00:00Z", "object": _NODE},
        {
            "type": "ADDED",
            "ts": "2026-01-01T00:00:00Z",
            "object": _guarded_pod("guard", "ops", node="n1", rv="2"),
        },
        {
            "type": "ADDED",
            "ts": "2026-01-01T00:00:00Z",
            "object": _guarded_pod("p", "alpha", node=None, rv="3"),
        },
    ]
    out = [d for e in first for d in ctl.step(e).records]
    assert [d["outcome"] for d in out] == ["fits"]  # alpha has no team label (no Namespace seen)
    later = [
        {"type": "ADDED", "ts": "2026-01-01T00:00:01Z", "object": _namespace("alpha", {"team": "a"}, rv="4")},
        {"type": "TICK", "ts": "2026-01-01T00:01:00Z"},
    ]
    out = [d for e in later for d in ctl.step(e).records]
    assert [(d["outcome"], [v["name"] for v in d["victims"]]) for d in out] == [("preempt", ["guard"])]


def _first_events() -> list[dict[str, Any]]:
    return [
        {"type": "ADDED", "ts": "2026-01-01T00:00:00Z", "object": _NODE},
        {
            "type": "ADDED",
            "ts": "2026-01-01T00:00:00Z",
            "object": _guarded_pod("guard", "ops", node="n1", rv="2"),
        },
        {
            "type": "ADDED",
            "ts": "2026-01-01T00:00:00Z",
            "object": _guarded_pod("p", "alpha", node=None, rv="3"),
        },
        {"type": "ADDED", "ts": "2026-01-01T00:00:00Z", "object": _namespace("alpha", {"team": "b"}, rv="4")},
    ]


def test_a_namespace_event_rejected_while_deciding_leaves_the_labels_as_they_were() -> None:
    failing = {"now": False}

    def decide(*args: Any, **kwargs: Any) -> Any:
        if failing["now"]:
            raise RuntimeError("injected")
        return flows.decide(*args, **kwargs)

    ctl = Controller("c", Config(), decide=decide)
    for e in _first_events():
        ctl.step(e)
    failing["now"] = True
    relabel = {
        "type": "MODIFIED",
        "ts": "2026-01-01T00:01:00Z",
        "object": _namespace("alpha", {"team": "a"}, rv="5"),
    }
    with pytest.raises(BadEvent):
        ctl.step(relabel)  # the change wakes p, whose decision fails: the event is undone
    assert ctl.cluster.namespace_labels("alpha")["team"] == "b"
    assert ctl.cluster.held_version("Namespace", "alpha") == "4"
    failing["now"] = False
    assert [d["outcome"] for d in ctl.step(relabel).records] == ["preempt"]


def test_a_restored_worker_knows_the_namespaces_labels() -> None:
    ctl = Controller("c", Config())
    dirty: dict[str, bytes | None] = {}  # every Ready's store keys, as the worker gathers them
    for e in _first_events():
        dirty.update(ctl.step(e).dirty)
    stored = [orjson.loads(v) for v in dirty.values() if v is not None]
    again = Controller.restore(config=Config(), key=None, state=ctl.state(), objects_raw=stored)
    assert again.cluster.namespaces == ctl.cluster.namespaces
    assert again.cluster.namespace_labels("alpha")["team"] == "b"


# ---- property: a selector decides as the namespaces whose labels it matches ------------------


def _term(draw: st.DrawFn) -> dict[str, Any]:
    term: dict[str, Any] = {
        "labelSelector": {"matchLabels": {"app": draw(st.sampled_from(["x", "y"]))}},
        "topologyKey": draw(st.sampled_from([HOST, ZONE])),
    }
    how = draw(st.sampled_from(["labels", "in", "name"]))
    if how == "labels":
        term["namespaceSelector"] = {"matchLabels": {"team": draw(st.sampled_from(TEAMS))}}
    elif how == "in":
        term["namespaceSelector"] = {
            "matchExpressions": [
                {
                    "key": "team",
                    "operator": "In",
                    "values": list(draw(st.sets(st.sampled_from(TEAMS), min_size=1))),
                }
            ]
        }
    else:
        term["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: draw(st.sampled_from(NAMESPACES))}}
    return term


def _pod(draw: st.DrawFn, name: str, *, node: str | None) -> dict[str, Any]:
    namespace = draw(st.sampled_from(NAMESPACES))
    spec: dict[str, Any] = {
        "priority": 1000 if node is None else draw(st.sampled_from([0, 2000])),
        "containers": [{"name": "c", "resources": {"requests": {"cpu": draw(st.sampled_from(["1", "2"]))}}}],
    }
    affinity: dict[str, Any] = {}
    if draw(st.integers(0, 2)) == 0:
        affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [_term(draw)]}
    if node is None and draw(st.integers(0, 3)) == 0:
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [_term(draw)]}
    if affinity:
        spec["affinity"] = affinity
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"{name}-uid"}
    app = draw(st.sampled_from(["x", "y", None]))
    if app:
        meta["labels"] = {"app": app}
    if node is not None:
        spec["nodeName"] = node
        status: dict[str, Any] = {"phase": "Running", "startTime": "2025-12-31T00:00:00Z"}
    else:
        status = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        }
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": status}


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    objs: list[dict[str, Any]] = []
    n_nodes = draw(st.integers(1, 4))
    for i in range(n_nodes):
        labels = {HOST: f"n{i}", ZONE: draw(st.sampled_from(["z1", "z2"]))}
        objs.append(
            {
                "kind": "Node",
                "metadata": {"name": f"n{i}", "labels": labels},
                "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
            }
        )
    for name in NAMESPACES:
        if draw(st.booleans()):
            team = draw(st.sampled_from([*TEAMS, None]))
            objs.append(_namespace(name, {"team": team} if team else None))
    for j in range(draw(st.integers(0, 8))):
        objs.append(_pod(draw, f"p{j}", node=f"n{draw(st.integers(0, n_nodes - 1))}"))
    return {"now": "2026-01-01T00:00:00Z", "objects": objs, "preemptor": [_pod(draw, "pre", node=None)]}


def _as_namespace_lists(raw: dict[str, Any]) -> dict[str, Any]:
    """The case with every term's namespaceSelector replaced by the namespaces whose labels it
    matches (a namespace without an object has its name label only)."""
    out = copy.deepcopy(raw)
    labels = {name: {NAMESPACE_NAME_LABEL: name} for name in NAMESPACES}
    for o in raw["objects"]:
        if o["kind"] == "Namespace":
            labels[o["metadata"]["name"]] = {
                **o["metadata"].get("labels", {}),
                NAMESPACE_NAME_LABEL: o["metadata"]["name"],
            }
    for pod in [*out["objects"], *out["preemptor"]]:
        for block in (pod.get("spec", {}).get("affinity") or {}).values():
            for term in block["requiredDuringSchedulingIgnoredDuringExecution"]:
                selector = LabelSelector.parse(term.pop("namespaceSelector"), where="test")
                assert selector is not None
                picked = sorted(n for n, lab in labels.items() if selector.matches(lab))
                # No namespace picked: a list naming none of them (an empty list is the pod's own).
                term["namespaces"] = picked or ["nowhere"]
    return out


def _answer(raw: dict[str, Any]) -> Any:
    d = case_mod.answer(case_mod.load(raw, where="generated"))
    return d.answer()


@SETTINGS
@given(clusters())
def test_a_namespace_selector_decides_as_the_namespaces_its_labels_pick(raw: dict[str, Any]) -> None:
    assert _answer(raw) == _answer(_as_namespace_lists(raw))


@SETTINGS
@given(clusters())
def test_namespaces_with_only_their_name_label_decide_as_no_namespace_objects(raw: dict[str, Any]) -> None:
    bare = {**raw, "objects": [o for o in raw["objects"] if o["kind"] != "Namespace"]}
    named = {
        **raw,
        "objects": [
            _namespace(o["metadata"]["name"]) if o["kind"] == "Namespace" else o for o in raw["objects"]
        ],
    }
    assert case_mod.answer(case_mod.load(bare, where="bare")) == case_mod.answer(
        case_mod.load(named, where="named")
    )
