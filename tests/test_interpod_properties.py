"""The inter-pod filters (host ports, pod (anti-)affinity, topology spread) against a direct oracle.

The oracle below recomputes every filter from the raw objects for one node and
one set of pods taken away, with nothing shared with engine.interpod: no
counts kept, no deltas, every pod looked at again. On generated clusters whose
pods carry host ports, anti-affinity by hostname and zone, affinity, and spread
constraints near their skew, the engine's answer must agree with it:

- `fits` on N: every filter and the resources pass on N as it is;
- `preempt` on N: they pass on N once the victims are gone, every victim is of
  lower priority and on N, and no node fits as it is;
- `unschedulable`: no node passes with every lower-priority pod of it gone,
  unless the scheduling cycle already called it unresolvable there.

The job flow places a gang's members one at a time, each seeing the members placed
before it: for any gang of such pods, every member must pass the same oracle on its
node with the victims gone and the members before it bound where they were placed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import default, index
from engine.decision import FITS, PREEMPT, UNSCHEDULABLE

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOST, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
APPS = ("x", "y", "web")
PREEMPTOR_PRIORITY = 1000


# ---- generation ----------------------------------------------------------------------


def _term(app: str, key: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}


@st.composite
def clusters(draw: st.DrawFn, *, nominated: bool = False) -> dict[str, Any]:
    n_nodes = draw(st.integers(1, 5))
    objects: list[dict[str, Any]] = []
    for i in range(n_nodes):
        labels = {HOST: f"n{i}"}
        zone = draw(st.sampled_from(["a", "b", "c", None]))
        if zone is not None:
            labels[ZONE] = zone
        cpu = draw(st.sampled_from([2, 4]))
        objects.append(
            {
                "kind": "Node",
                "metadata": {"name": f"n{i}", "labels": labels},
                "status": {"allocatable": {"cpu": str(cpu), "memory": "8Gi", "pods": "110"}},
            }
        )
    held: dict[str, list[tuple[str, str, int]]] = {}
    for j in range(draw(st.integers(0, 10))):
        pod = _pod(draw, f"p{j}", node=f"n{draw(st.integers(0, n_nodes - 1))}")
        # No two bound pods clash on a port of one node: kubelet admits only one, and with
        # two, upstream's set of used ports frees the port when either goes (bug for bug).
        mine = _ports(pod)
        others = held.setdefault(pod["spec"]["nodeName"], [])
        if any(_clash(a, b) for a in mine for b in others):
            del pod["spec"]["containers"][0]["ports"]
        else:
            others.extend(mine)
        objects.append(pod)
    if nominated:
        # Pending pods promised to a node (kube-scheduler's nomination): they count there.
        for j in range(draw(st.integers(0, 3))):
            pod = _pod(draw, f"nom{j}", node=None)
            pod["spec"]["priority"] = draw(st.sampled_from([500, 1000, 2000]))
            pod["status"]["nominatedNodeName"] = f"n{draw(st.integers(0, n_nodes - 1))}"
            objects.append(pod)
    pre = _pod(draw, "pre", node=None)
    if nominated and draw(st.booleans()):
        pre["status"]["nominatedNodeName"] = f"n{draw(st.integers(0, n_nodes - 1))}"
    return {"now": "2026-01-01T00:00:00Z", "objects": objects, "preemptor": [pre]}


def _pod(draw: st.DrawFn, name: str, *, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "priority": PREEMPTOR_PRIORITY if node is None else draw(st.sampled_from([0, 500, 2000])),
        "containers": [
            {"name": "c", "resources": {"requests": {"cpu": draw(st.sampled_from(["500m", "1", "2"]))}}}
        ],
    }
    if draw(st.booleans()):
        port = {"containerPort": 1, "hostPort": draw(st.sampled_from([8080, 9090]))}
        protocol = draw(st.sampled_from([None, "TCP", "UDP"]))
        if protocol:
            port["protocol"] = protocol
        ip = draw(st.sampled_from([None, "0.0.0.0", "10.0.0.1", "10.0.0.2"]))
        if ip:
            port["hostIP"] = ip
        spec["containers"][0]["ports"] = [port]
    affinity: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        key = draw(st.sampled_from([HOST, ZONE]))
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [_term(draw(st.sampled_from(APPS)), key)]
        }
    if node is None and draw(st.integers(0, 3)) == 0:
        key = draw(st.sampled_from([HOST, ZONE]))
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [_term(draw(st.sampled_from(APPS)), key)]
        }
    if affinity:
        spec["affinity"] = affinity
    if node is None and draw(st.integers(0, 2)) == 0:
        c: dict[str, Any] = {
            "maxSkew": draw(st.integers(1, 2)),
            "topologyKey": draw(st.sampled_from([HOST, ZONE])),
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": draw(st.sampled_from(APPS))}},
        }
        if draw(st.booleans()):
            c["minDomains"] = draw(st.integers(1, 4))
        spec["topologySpreadConstraints"] = [c]
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"{name}-uid"}
    app = draw(st.sampled_from([*APPS, None]))
    if app:
        meta["labels"] = {"app": app}
    pod: dict[str, Any] = {"kind": "Pod", "metadata": meta, "spec": spec}
    if node is not None:
        spec["nodeName"] = node
        pod["status"] = {"phase": "Running", "startTime": "2025-12-31T00:00:00Z"}
    else:
        pod["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        }
    return pod


# ---- the oracle ----------------------------------------------------------------------


def _cpu(pod: Mapping[str, Any]) -> int:
    text = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    return int(text[:-1]) if text.endswith("m") else int(text) * 1000


def _ports(pod: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    return [
        (p.get("protocol") or "TCP", p.get("hostIP") or "0.0.0.0", p["hostPort"])
        for p in pod["spec"]["containers"][0].get("ports", [])
    ]


def _clash(w: tuple[str, str, int], h: tuple[str, str, int]) -> bool:
    return w[2] == h[2] and w[0] == h[0] and (w[1] == "0.0.0.0" or h[1] == "0.0.0.0" or w[1] == h[1])


def _app(pod: Mapping[str, Any]) -> str | None:
    return pod["metadata"].get("labels", {}).get("app")


def _terms(pod: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    block = pod["spec"].get("affinity", {}).get(kind, {})
    return list(block.get("requiredDuringSchedulingIgnoredDuringExecution", []))


def _wants(term: Mapping[str, Any]) -> str:
    return str(term["labelSelector"]["matchLabels"]["app"])


def oracle(
    raw: Mapping[str, Any],
    node: str,
    gone: set[str],
    pre: Mapping[str, Any] | None = None,
    placed: Sequence[tuple[Mapping[str, Any], str]] = (),
) -> tuple[bool, bool]:
    """(passes, unresolvable): do resources and every filter pass for `pre` (the case's first
    preemptor by default) on `node` with `gone` taken away and the `placed` pods bound where
    they are placed; and would the scheduling cycle (nothing taken away) call it unresolvable?"""
    nodes = {o["metadata"]["name"]: o for o in raw["objects"] if o["kind"] == "Node"}
    pods = [o for o in raw["objects"] if o["kind"] == "Pod" and o["metadata"]["name"] not in gone]
    pods += [{**p, "spec": {**p["spec"], "nodeName": where}} for p, where in placed]
    pre = raw["preemptor"][0] if pre is None else pre
    labels = nodes[node]["metadata"]["labels"]

    def on(name: str) -> list[dict[str, Any]]:
        return [p for p in pods if p["spec"]["nodeName"] == name]

    def label(pod: Mapping[str, Any], key: str) -> str | None:
        return nodes[pod["spec"]["nodeName"]]["metadata"]["labels"].get(key)

    used = sum(_cpu(p) for p in on(node))
    allocatable = int(nodes[node]["status"]["allocatable"]["cpu"]) * 1000
    resources_ok = used + _cpu(pre) <= allocatable
    ports_ok = not any(_clash(w, h) for p in on(node) for h in _ports(p) for w in _ports(pre))
    spread_ok, spread_unresolvable = True, False
    for c in pre["spec"].get("topologySpreadConstraints", []):
        key, app = c["topologyKey"], c["labelSelector"]["matchLabels"]["app"]
        if key not in labels:
            spread_ok, spread_unresolvable = False, True
            break
        domains: dict[str, int] = {}
        for n in nodes.values():
            if key in n["metadata"]["labels"]:
                domains.setdefault(n["metadata"]["labels"][key], 0)
        for p in pods:
            if _app(p) == app and label(p, key) is not None:
                domains[str(label(p, key))] += 1
        low = 0 if len(domains) < c.get("minDomains", 1) else min(domains.values())
        if domains[labels[key]] + (1 if _app(pre) == app else 0) - low > c["maxSkew"]:
            spread_ok = False
    affinity_ok = True
    terms = _terms(pre, "podAffinity")
    if terms:
        matching = [p for p in pods if all(_app(p) == _wants(t) for t in terms)]
        if any(t["topologyKey"] not in labels for t in terms):
            affinity_ok = False
        elif not all(
            any(label(p, t["topologyKey"]) == labels[t["topologyKey"]] for p in matching) for t in terms
        ):
            anywhere = any(label(p, t["topologyKey"]) is not None for p in matching for t in terms)
            affinity_ok = not anywhere and all(_app(pre) == _wants(t) for t in terms)
    anti_ok = not any(
        t["topologyKey"] in labels
        and _app(p) == _wants(t)
        and label(p, t["topologyKey"]) == labels[t["topologyKey"]]
        for t in _terms(pre, "podAntiAffinity")
        for p in pods
    )
    existing_ok = not any(
        t["topologyKey"] in labels
        and _app(pre) == _wants(t)
        and label(p, t["topologyKey"]) == labels[t["topologyKey"]]
        for p in pods
        for t in _terms(p, "podAntiAffinity")
    )
    passes = resources_ok and ports_ok and spread_ok and affinity_ok and anti_ok and existing_ok
    # The cycle's first failing filter in order: NodePorts, NodeResourcesFit, spread, affinity.
    unresolvable = ports_ok and resources_ok and (spread_unresolvable or (spread_ok and not affinity_ok))
    return passes, unresolvable


def _lower_on(raw: Mapping[str, Any], node: str) -> set[str]:
    return {
        o["metadata"]["name"]
        for o in raw["objects"]
        if o["kind"] == "Pod" and o["spec"]["nodeName"] == node and o["spec"]["priority"] < PREEMPTOR_PRIORITY
    }


@SETTINGS
@given(clusters())
def test_answers_agree_with_the_direct_filters(raw: dict[str, Any]) -> None:
    c = case_mod.load(raw, where="generated")
    d = case_mod.answer(c)
    names = sorted(o["metadata"]["name"] for o in raw["objects"] if o["kind"] == "Node")
    fitting = [n for n in names if oracle(raw, n, set())[0]]
    if d.outcome == FITS:
        assert d.node in fitting
        return
    assert not fitting, (d.outcome, fitting)
    if d.outcome == PREEMPT:
        assert d.node is not None
        victims = {v.name for v in d.victims}
        assert victims <= _lower_on(raw, d.node)
        assert oracle(raw, d.node, victims)[0]
        return
    assert d.outcome == UNSCHEDULABLE, d.reason
    for n in names:
        passes = oracle(raw, n, _lower_on(raw, n))[0]
        assert not passes or oracle(raw, n, set())[1] or not _lower_on(raw, n), n


@SETTINGS
@given(clusters(nominated=True), st.sampled_from(("kubernetes", "minimal")))
def test_the_index_answers_as_every_node_evaluated_afresh(raw: dict[str, Any], mode: str) -> None:
    """`Index.scan` reads the shape's ranking on the nodes the filters leave alone
    (`Filters.touched`) and evaluates the rest: the answer and every figure of the
    explanation must be those of `index.full_scan`, which evaluates every node with them."""
    c = case_mod.load(raw, where="generated")
    pod = c.preemptors[0]
    pre = default.preemptor(c.cluster, pod)
    now = c.now
    idx = index.Index(c.cluster)
    # A ranking made before (another decision of the shape) must serve as well as a new one.
    plain = default.Preemptor(pod, pre.priority, pre.requests)
    idx.scan(plain, now, mode)
    got, want = idx.scan(pre, now, mode), index.full_scan(c.cluster, pre, now, mode)
    assert got.fitting == want.fitting
    assert got.explanation == want.explanation
    assert (
        (got.best.node, got.best.victims) == (want.best.node, want.best.victims)
        if want.best
        else not got.best
    )


# ---- the job flow: a gang's members, each with the members before it placed ----------


@st.composite
def gangs(draw: st.DrawFn) -> dict[str, Any]:
    raw = draw(clusters())
    members = []
    for i in range(draw(st.integers(1, 3))):
        m = _pod(draw, f"m{i}", node=None)
        m["metadata"].setdefault("labels", {})[GROUP] = "g"
        members.append(m)
    raw["preemptor"] = members
    return raw


GROUP = "pod-group.scheduling.sigs.k8s.io"


@SETTINGS
@given(gangs(), st.sampled_from(("kubernetes", "minimal")))
def test_a_gang_is_placed_only_where_every_member_passes_the_filters(raw: dict[str, Any], mode: str) -> None:
    raw["config"] = {"victimSelection": mode}
    c = case_mod.load(raw, where="generated")
    d = case_mod.answer(c)
    assert d.flow == "job"
    assert not d.reason.startswith("not modelled"), d.reason
    if d.outcome not in (FITS, PREEMPT):
        assert d.outcome == UNSCHEDULABLE, d.reason
        return
    members = sorted(raw["preemptor"], key=lambda p: p["metadata"]["name"])
    where = dict(d.placements) if d.placements else {f"default/{members[0]['metadata']['name']}": d.node}
    victims = {v.name for v in d.victims}
    nodes = {where[f"default/{m['metadata']['name']}"] for m in members}
    assert victims <= set().union(*(_lower_on(raw, n) for n in nodes)), (victims, nodes)
    if d.outcome == FITS:
        assert not victims
    placed: list[tuple[Mapping[str, Any], str]] = []
    for m in members:
        node = where[f"default/{m['metadata']['name']}"]
        assert oracle(raw, node, victims, m, placed)[0], (m["metadata"]["name"], node, d.reason)
        placed.append((m, node))
