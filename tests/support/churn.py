"""Hypothesis strategies for a small mixed cluster and the churn a live cluster puts it through.

The cluster mixes what the engine's caches depend on: several node sizes, zones,
a taint and a cordon; pods of several priorities, QoS classes, namespaces and
start times; PriorityClasses with toleration windows; PDBs with overlapping
selectors, disruptedPods and budgets of 0-2; ElasticQuotas with preemptible and
non-preemptible pods; pod groups, owner references, DaemonSet pods, nominated,
terminating and soft-evicted pods. The churn is a sequence of watch events
applied with `Cluster.apply` (resourceVersions and all), as the worker folds
them: pods bound, deleted, terminating, nominated and renominated, relabelled,
moved, status-only updates; PDB status (budget, disruptedPods) and selector
changes, PDBs created and deleted; a toleration policy changed; a PriorityClass
that pods without spec.priority name (or the global default) created, changed
and deleted; quotas resized; nodes added, cordoned, resized, deleted and
created again; time passing through toleration windows.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from tests.support import flowgen, gen

NAMESPACES = ("default", "team-a", "team-b")
APPS = ("web", "db", "batch")
PRIORITIES = (-5, 0, 10, 100, 1000)
STARTS = ("2025-12-31T20:00:00Z", "2025-12-31T22:00:00Z", "2025-12-31T23:30:00Z", "2025-12-31T23:59:00Z")
TOLERANT = "tolerant"  # class value 10: tolerates preemptors below 1000 for an hour
LATE = "late"  # a class some pods name without spec.priority; created, changed and deleted by churn


def tolerant_class(seconds: int = 3600) -> dict[str, Any]:
    prefix = "preemption-toleration.scheduling.x-k8s.io/"
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": TOLERANT,
            "uid": f"{TOLERANT}-uid",
            "annotations": {
                prefix + "minimum-preemptable-priority": "1000",
                prefix + "toleration-seconds": str(seconds),
            },
        },
        "value": 10,
    }


def pdb(
    name: str, namespace: str, labels: dict[str, str], allowed: int, disrupted: tuple[str, ...] = ()
) -> dict[str, Any]:
    status: dict[str, Any] = {"disruptionsAllowed": allowed}
    if disrupted:
        status["disruptedPods"] = {p: "2025-12-31T23:59:00Z" for p in disrupted}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}-pdb"},
        "spec": {"selector": {"matchLabels": labels}},
        "status": status,
    }


@st.composite
def bound_pod(draw: st.DrawFn, name: str, nodes: list[str]) -> dict[str, Any]:
    namespace = draw(st.sampled_from(NAMESPACES))
    prio = draw(st.sampled_from(PRIORITIES))
    labels = {"app": draw(st.sampled_from(APPS))}
    if draw(st.integers(0, 2)) == 0:
        labels["tier"] = "front"  # a second PDB covers these: overlapping budgets
    deleting = draw(st.integers(0, 9)) == 0
    obj = flowgen.jpod(
        name,
        namespace=namespace,
        node=draw(st.sampled_from(nodes)),
        priority=prio,
        cpu_m=draw(st.sampled_from((250, 500, 1000, 1000, 1500))),
        mem_gi=draw(st.sampled_from((0, 1, 2))),
        start=draw(st.sampled_from(STARTS)),
        labels=labels,
        preemptible=draw(st.sampled_from((None, "true", "false"))) if namespace != "default" else None,
        group="g-bound" if namespace == "team-a" and draw(st.integers(0, 4)) == 0 else None,
        soft_evicted=draw(st.integers(0, 11)) == 0,
        deleting=deleting,
        disruption=deleting and draw(st.booleans()),
        priority_class=TOLERANT if prio == 10 and draw(st.booleans()) else None,
        guaranteed=draw(st.booleans()),
    )
    if draw(st.integers(0, 6)) == 0:
        obj["metadata"]["ownerReferences"] = [flowgen.daemonset_owner("agent")]
    if "priorityClassName" not in obj["spec"] and draw(st.integers(0, 3)) == 0:
        # No spec.priority (a hand-written object): it comes from the class LATE, else the
        # global default, whichever exists when the pod is looked at.
        del obj["spec"]["priority"]
        if draw(st.booleans()):
            obj["spec"]["priorityClassName"] = LATE
    obj["metadata"]["creationTimestamp"] = obj["status"].get("startTime", STARTS[0])
    return obj


def late_class(value: int, *, default: bool) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": LATE, "uid": f"{LATE}-uid"},
        "value": value,
        "globalDefault": default,
    }


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    """{objects, now}: a small mixed cluster (no preemptor: the tests bring their own)."""
    names = [f"n{i}" for i in range(1, draw(st.integers(2, 5)) + 1)]
    objects: list[dict[str, Any]] = [tolerant_class()]
    if draw(st.booleans()):
        objects.append(late_class(draw(st.sampled_from((5, 50))), default=draw(st.booleans())))
    for i, name in enumerate(names):
        objects.append(
            gen.node(
                name,
                draw(st.sampled_from((2, 3, 4))),
                draw(st.sampled_from((4, 16))),
                draw(st.sampled_from((4, 110))),
                taint=i == 0 and draw(st.booleans()),
                cordon=draw(st.integers(0, 9)) == 0,
            )
        )
    pods = [draw(bound_pod(f"p{i}", names)) for i in range(draw(st.integers(len(names), 18)))]
    objects += pods
    for i in range(draw(st.integers(0, 2))):
        objects.append(
            gen.pod(
                f"nom{i}",
                node=None,
                priority=draw(st.sampled_from((100, 1000, 5000))),
                cpu_m=500,
                nominated=draw(st.sampled_from(names)),
            )
        )
    for namespace in NAMESPACES:
        for app in draw(st.lists(st.sampled_from(APPS), unique=True, max_size=2)):
            disrupted = (
                (draw(st.sampled_from([p["metadata"]["name"] for p in pods])),)
                if draw(st.integers(0, 3)) == 0
                else ()
            )
            objects.append(pdb(f"pdb-{app}", namespace, {"app": app}, draw(st.integers(0, 2)), disrupted))
    if draw(st.booleans()):
        objects.append(pdb("pdb-front", "default", {"tier": "front"}, draw(st.integers(0, 1))))
    for team in ("team-a", "team-b"):
        if draw(st.booleans()):
            lo = draw(st.sampled_from((2, 4, 8)))
            objects.append(
                flowgen.quota(f"q-{team}", team, min_cpu=lo, max_cpu=lo + draw(st.sampled_from((4, 8, 16))))
            )
    for n, obj in enumerate(objects):
        obj["metadata"]["resourceVersion"] = str(n + 1)
    return {"objects": objects, "now": gen.NOW}


@st.composite
def changes(draw: st.DrawFn, base: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, int]]:
    """A sequence of (watch event type, object, seconds of log time passing first); a TICK has no object."""
    objects = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")): o for o in base["objects"]}
    names = sorted(o["metadata"]["name"] for o in base["objects"] if o["kind"] == "Node")
    rv = len(base["objects"]) + 100
    out: list[tuple[str, dict[str, Any] | None, int]] = []

    def event(kind: str, obj: dict[str, Any]) -> None:
        nonlocal rv
        rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(rv)
        if kind != "DELETED":
            objects[(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))] = obj
        else:
            objects.pop((obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")), None)
        out.append((kind, obj, advance))

    for i in range(draw(st.integers(1, 8))):
        advance = draw(st.sampled_from((0, 0, 0, 1800, 4000)))
        what = draw(
            st.sampled_from(
                (
                    "bind",
                    "bind",
                    "delete",
                    "terminate",
                    "nominate",
                    "heartbeat",
                    "pdb-status",
                    "pdb-status",
                    "pdb-selector",
                    "pdb-new",
                    "pdb-delete",
                    "policy",
                    "quota",
                    "cordon",
                    "resize",
                    "node-new",
                    "node-replace",
                    "relabel",
                    "move",
                    "pdb-disrupted",
                    "renominate",
                    "late-class",
                    "late-class",
                    "tick",
                )
            )
        )
        pods = sorted((k for k, o in objects.items() if k[0] == "Pod" and o["spec"].get("nodeName")), key=str)
        pdbs = sorted((k for k in objects if k[0] == "PodDisruptionBudget"), key=str)
        if what == "bind":
            event("ADDED", draw(bound_pod(f"x{i}", names)))
        elif what in ("delete", "terminate", "heartbeat") and pods:
            obj = copy.deepcopy(objects[draw(st.sampled_from(pods))])
            if what == "terminate":
                obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                # Mostly a preemption's victim; sometimes a pod someone else evicts or drains,
                # which no preemptor waits for (docs/semantics.md §3).
                reason = draw(st.sampled_from(("PreemptionByScheduler", "EvictionByEvictionAPI")))
                obj["status"]["conditions"].append(
                    {"type": "DisruptionTarget", "status": "True", "reason": reason}
                )
            event("DELETED" if what == "delete" else "MODIFIED", obj)
        elif what == "nominate":
            event(
                "ADDED",
                gen.pod(
                    f"x{i}",
                    node=None,
                    priority=draw(st.sampled_from((100, 1000, 5000))),
                    cpu_m=draw(st.sampled_from((500, 1000))),
                    nominated=draw(st.sampled_from(names)),
                ),
            )
        elif what in ("pdb-status", "pdb-selector", "pdb-delete") and pdbs:
            obj = copy.deepcopy(objects[draw(st.sampled_from(pdbs))])
            if what == "pdb-status":
                obj["status"]["disruptionsAllowed"] = draw(st.integers(0, 2))
            elif what == "pdb-selector":
                obj["spec"]["selector"] = {"matchLabels": {"app": draw(st.sampled_from(APPS))}}
            event("DELETED" if what == "pdb-delete" else "MODIFIED", obj)
        elif what == "pdb-new":
            event(
                "ADDED",
                pdb(
                    f"pdb-new{i}",
                    draw(st.sampled_from(NAMESPACES)),
                    {"app": draw(st.sampled_from(APPS))},
                    draw(st.integers(0, 1)),
                ),
            )
        elif what == "policy":
            event("MODIFIED", tolerant_class(draw(st.sampled_from((0, 600, 3600, -1)))))
        elif what == "quota":
            team = draw(st.sampled_from(("team-a", "team-b")))
            lo = draw(st.sampled_from((0, 2, 8)))
            event(
                "ADDED",
                flowgen.quota(f"q-{team}", team, min_cpu=lo, max_cpu=lo + draw(st.sampled_from((2, 16)))),
            )
        elif what in ("cordon", "resize"):
            name = draw(st.sampled_from(names))
            obj = copy.deepcopy(objects[("Node", name, None)])
            if what == "cordon":
                obj["spec"]["unschedulable"] = not obj["spec"].get("unschedulable")
            else:
                obj["status"]["allocatable"]["cpu"] = str(draw(st.sampled_from((2, 3, 4))))
            event("MODIFIED", obj)
        elif what == "node-new":
            names.append(f"m{i}")  # empty at first; later events may bind pods to it
            event("ADDED", gen.node(names[-1], draw(st.sampled_from((2, 4))), 16, 110))
        elif what == "node-replace":
            # A node deleted and created again under its name (a machine replaced), with
            # pods bound to it meanwhile: they wait as orphans until the node is back.
            name = draw(st.sampled_from(names))
            obj = copy.deepcopy(objects[("Node", name, None)])
            event("DELETED", obj)
            if draw(st.booleans()):
                event("ADDED", draw(bound_pod(f"x{i}", [name])))
            obj["status"]["allocatable"]["cpu"] = str(draw(st.sampled_from((2, 3, 4))))
            event("ADDED", obj)
        elif what in ("relabel", "move") and pods:
            # Changes a watch delivers as MODIFIED that move a pod between PDBs or nodes.
            obj = copy.deepcopy(objects[draw(st.sampled_from(pods))])
            if what == "relabel":
                obj["metadata"]["labels"]["app"] = draw(st.sampled_from(APPS))
            else:
                obj["spec"]["nodeName"] = draw(st.sampled_from(names))
            event("MODIFIED", obj)
        elif what == "pdb-disrupted" and pdbs and pods:
            obj = copy.deepcopy(objects[draw(st.sampled_from(pdbs))])
            if draw(st.booleans()):
                obj["status"]["disruptedPods"] = {draw(st.sampled_from(pods))[1]: "2025-12-31T23:59:00Z"}
            else:
                obj["status"].pop("disruptedPods", None)
            event("MODIFIED", obj)
        elif what == "renominate":
            pending = sorted(
                (k for k, o in objects.items() if k[0] == "Pod" and o["status"].get("nominatedNodeName")),
                key=str,
            )
            if pending:
                obj = copy.deepcopy(objects[draw(st.sampled_from(pending))])
                target = draw(st.sampled_from([None, *names]))
                if target is None:
                    del obj["status"]["nominatedNodeName"]
                else:
                    obj["status"]["nominatedNodeName"] = target
                event("MODIFIED", obj)
        elif what == "late-class":
            # PriorityClass values are immutable in a real cluster; classes still come and go.
            if ("PriorityClass", LATE, None) in objects and draw(st.booleans()):
                event("DELETED", objects[("PriorityClass", LATE, None)])
            else:
                event("ADDED", late_class(draw(st.sampled_from((5, 500, 2000))), default=draw(st.booleans())))
        else:
            out.append(("TICK", None, advance))
    return out


# ---- wide workloads --------------------------------------------------------------------

WIDE_APPS = ("fleet", "array")


@st.composite
def wide_clusters(draw: st.DrawFn) -> dict[str, Any]:
    """{objects, now}: a few workloads spread over every node, each under a PDB of budget 0-2.

    The shape big clusters have (a PDB's pods on most nodes, several budgets read on
    every node), small enough for the reference: what a PDB status change or a
    victim becoming terminating must invalidate exactly, no more and no less.
    """
    names = [f"n{i}" for i in range(1, draw(st.integers(3, 7)) + 1)]
    objects: list[dict[str, Any]] = [tolerant_class()]
    for name in names:
        objects.append(gen.node(name, draw(st.sampled_from((2, 3))), 16, 110))
    serial = 0
    for name in names:
        for _ in range(draw(st.integers(3, 7))):
            serial += 1
            app = draw(st.sampled_from((*WIDE_APPS, *WIDE_APPS, "single")))
            objects.append(
                gen.pod(
                    f"p{serial}",
                    node=name,
                    priority=draw(st.sampled_from((0, 10, 100))),
                    cpu_m=draw(st.sampled_from((250, 500, 750))),
                    start=draw(st.sampled_from(STARTS)),
                    labels={"app": app},
                )
            )
    for app in WIDE_APPS:
        objects.append(pdb(f"pdb-{app}", "default", {"app": app}, draw(st.integers(0, 2))))
    for n, obj in enumerate(objects):
        obj["metadata"]["resourceVersion"] = str(n + 1)
    return {"objects": objects, "now": gen.NOW}


def wide_change(draw: st.DrawFn, objects: dict[str, dict[str, Any]], i: int) -> tuple[str, dict[str, Any]]:
    """One watch event of a wide cluster's life: mostly budget moves and pods terminating or leaving."""
    pods = sorted(u for u, o in objects.items() if o["kind"] == "Pod" and o["spec"].get("nodeName"))
    pdbs = sorted(u for u, o in objects.items() if o["kind"] == "PodDisruptionBudget")
    nodes = sorted(o["metadata"]["name"] for o in objects.values() if o["kind"] == "Node")
    what = draw(st.sampled_from(("budget", "budget", "budget", "disrupted", "terminate", "delete", "bind")))
    if what in ("budget", "disrupted") and pdbs:
        obj = copy.deepcopy(objects[draw(st.sampled_from(pdbs))])
        if what == "budget":
            obj["status"]["disruptionsAllowed"] = draw(st.integers(0, 2))
        elif pods and draw(st.booleans()):
            obj["status"]["disruptedPods"] = {
                objects[draw(st.sampled_from(pods))]["metadata"]["name"]: "2025-12-31T23:59:00Z"
            }
        else:
            obj["status"].pop("disruptedPods", None)
        return "MODIFIED", obj
    if what in ("terminate", "delete") and pods:
        obj = copy.deepcopy(objects[draw(st.sampled_from(pods))])
        if what == "delete":
            return "DELETED", obj
        obj["metadata"]["deletionTimestamp"] = "2025-12-31T23:59:50Z"
        obj["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True"})
        return "MODIFIED", obj
    return "ADDED", gen.pod(
        f"w{i}",
        node=draw(st.sampled_from(nodes)),
        priority=draw(st.sampled_from((0, 10, 100))),
        cpu_m=draw(st.sampled_from((250, 500))),
        labels={"app": draw(st.sampled_from(WIDE_APPS))},
    )
