"""Histories of watch events that try to make a folded cluster remember its past.

Made to differ from tests/support/churn.py on purpose: churn exercises the caches through
a live cluster's everyday events; this generator goes after what a fold could
keep from the path it took, which a cluster built from the current objects (a
worker restored from a snapshot) cannot know:

- PriorityClasses deleted and re-created (new uid) with other values, classes
  switching globalDefault on and off, global defaults appearing and going, and a
  toleration policy rewritten (0 seconds, forever, a window);
- pods folded without spec.priority (stamped from their class) whose priority is
  written later, equal to the stamp or not, or dropped again;
- resource keys going to zero: a GPU request written as "0" or removed, the last
  GPU pod of a quota or a node going, node allocatable with a zero-valued key;
- nodes and pods deleted and created again under the same name with a new uid;
- stale re-deliveries: an older version of any object (its old resourceVersion)
  delivered again, as ADDED, MODIFIED or DELETED, after newer ones;
- pods bound, nominated, terminating (by a preemption or not), PDB budgets and
  quota bounds changing, time passing through toleration windows.

Every event comes with the objects the API server holds after it, so a test can
build a fresh cluster from them and compare.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from engine import job

NOW = "2026-01-01T00:00:00Z"
VALUES = (-5, 0, 10, 100, 1000, 5000)
CLASSES = ("low", "mid", "guard")
DEFAULTS = ("base-a", "base-b")
GUARD = "preemption-toleration.scheduling.x-k8s.io/"
NODES = ("n1", "n2", "n3")
GPU = "example.com/gpu"
STARTS = ("2025-12-31T22:00:00Z", "2025-12-31T23:00:00Z", "2025-12-31T23:50:00Z", "2025-12-31T23:59:00Z")
# The preemptors every step asks about: a default-flow pod, a job-flow gang member
# charged to a quota, and a DaemonSet pod pinned to n1. They are never re-created, so
# their uids hold through a history; their priority may be written later.
DEFAULT_Q = "q-default"
JOB_Q = "q-job"
DS_Q = "q-ds"


@dataclass
class History:
    # (event type, object or None for a tick, seconds to advance first, the current objects after it)
    events: list[tuple[str, dict[str, Any] | None, int, list[dict[str, Any]]]] = field(default_factory=list)
    questions: list[list[str]] = field(default_factory=list)


class _Server:
    """The API server's side: current objects, every version written, resourceVersions, uids."""

    def __init__(self) -> None:
        self.version = 0
        self.uids = 0
        self.current: dict[tuple[str, str], dict[str, Any]] = {}
        self.past: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.history = History()

    def uid(self, stem: str) -> str:
        self.uids += 1
        return f"{stem}-{self.uids}"

    @staticmethod
    def key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj["metadata"]
        if obj["kind"] in ("Node", "PriorityClass"):
            return obj["kind"], meta["name"]
        return obj["kind"], meta["uid"]

    def write(self, kind: str, obj: dict[str, Any], advance: int = 0) -> dict[str, Any]:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        key = self.key(obj)
        if kind == "DELETED":
            self.current.pop(key, None)
        else:
            self.current[key] = obj
        self.past.setdefault(key, []).append(obj)
        self._emit(kind, obj, advance)
        return obj

    def stale(self, kind: str, obj: dict[str, Any]) -> None:
        """An older version delivered again: the current objects do not change."""
        self._emit(kind, copy.deepcopy(obj), 0)

    def tick(self, seconds: int) -> None:
        self._emit("TICK", None, seconds)

    def _emit(self, kind: str, obj: dict[str, Any] | None, advance: int) -> None:
        snapshot = [self.current[k] for k in sorted(self.current)]
        self.history.events.append((kind, obj, advance, snapshot))

    def find(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        for (k, _), obj in sorted(self.current.items()):
            meta = obj["metadata"]
            if k == kind and meta["name"] == name and meta.get("namespace", "default") == namespace:
                return obj
        return None


def _class(
    name: str, value: int, uid: str, *, default: bool = False, guard: tuple[int, int] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid}
    if guard is not None:
        meta["annotations"] = {
            GUARD + "minimum-preemptable-priority": str(guard[0]),
            GUARD + "toleration-seconds": str(guard[1]),
        }
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": meta,
        "value": value,
    }
    if default:
        obj["globalDefault"] = True
    return obj


def _node(name: str, uid: str, cpu: int, gpu: int | None) -> dict[str, Any]:
    alloc = {"cpu": str(cpu), "memory": "8Gi", "pods": "10"}
    if gpu is not None:
        alloc[GPU] = str(gpu)  # "0" is a key with nothing behind it
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": uid, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"allocatable": alloc},
    }


def _pod(
    name: str,
    uid: str,
    *,
    namespace: str = "default",
    node: str | None,
    cpu_m: int,
    gpu: str | None = None,
    priority: int | None = None,
    klass: str = "",
    labels: dict[str, str] | None = None,
    start: str = STARTS[0],
    scheduled: bool = True,
    nominated: str | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": f"{cpu_m}m"}
    if gpu is not None:
        requests[GPU] = gpu
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    if priority is not None:
        spec["priority"] = priority
    if klass:
        spec["priorityClassName"] = klass
    status: dict[str, Any] = {"phase": "Pending", "conditions": []}
    if node is not None:
        spec["nodeName"] = node
        status = {"phase": "Running", "startTime": start, "conditions": []}
        if scheduled:
            status["conditions"].append(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": start}
            )
    else:
        status["conditions"].append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": start,
            }
        )
    if nominated:
        status["nominatedNodeName"] = nominated
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": dict(labels or {})},
        "spec": spec,
        "status": status,
    }


def _pdb(uid: str, allowed: int, *, not_in: bool) -> dict[str, Any]:
    selector: dict[str, Any] = (
        {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["b"]}]}
        if not_in
        else {"matchLabels": {"app": "a"}}
    )
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "not-b" if not_in else "app-a", "namespace": "default", "uid": uid},
        "spec": {"selector": selector},
        "status": {"disruptionsAllowed": allowed},
    }


def _quota(uid: str, max_cpu: int, max_gpu: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {"name": "qa", "namespace": "team-a", "uid": uid},
        "spec": {"min": {"cpu": "2"}, "max": {"cpu": str(max_cpu), GPU: str(max_gpu)}},
    }


ACTIONS = (
    "class-recreate",
    "class-recreate",
    "class-retune",
    "default-appears",
    "default-goes",
    "write-priority",
    "write-priority",
    "drop-priority",
    "pod-recreate",
    "gpu-zero",
    "gpu-zero",
    "node-recreate",
    "stale",
    "stale",
    "stale",
    "bind",
    "terminate",
    "nominate",
    "pdb",
    "quota",
    "tick",
)


def _stamp_value(server: _Server, pod: dict[str, Any]) -> int:
    """What admission would write: the class's value, else the first global default's, else 0."""
    klass = pod["spec"].get("priorityClassName")
    held = server.find("PriorityClass", klass) if klass else None
    if held is not None:
        return int(held["value"])
    defaults = sorted(
        o["metadata"]["name"]
        for (k, _), o in server.current.items()
        if k == "PriorityClass" and o.get("globalDefault")
    )
    return int(server.find("PriorityClass", defaults[0])["value"]) if defaults else 0  # type: ignore[index]


@st.composite
def histories(draw: st.DrawFn, *, max_steps: int = 40) -> History:
    s = _Server()
    value = st.sampled_from(VALUES)
    for name in CLASSES:
        guard = (1000, draw(st.sampled_from((0, -1, 600)))) if name == "guard" else None
        s.write("ADDED", _class(name, draw(value), s.uid(name), guard=guard))
    for name in NODES:
        s.write(
            "ADDED", _node(name, s.uid(name), draw(st.integers(2, 4)), draw(st.sampled_from((None, 0, 2))))
        )
    s.write("ADDED", _pdb(s.uid("pdb"), draw(st.integers(0, 1)), not_in=False))
    s.write("ADDED", _pdb(s.uid("pdb"), 0, not_in=True))
    s.write("ADDED", _quota(s.uid("quota"), draw(st.integers(4, 8)), 2))
    names: list[tuple[str, str]] = []  # (namespace, name) of bound pods, re-created under the same name
    for i in range(draw(st.integers(5, 12))):
        namespace = draw(st.sampled_from(("default", "default", "team-a")))
        name = f"p{i}"
        labels: dict[str, str] = {}
        app = draw(st.sampled_from((None, "a", "b")))
        if app:
            labels["app"] = app
        if namespace == "team-a":
            labels[job.QUOTA_NAME] = "qa"
            labels[job.PREEMPTIBLE] = draw(st.sampled_from(("true", "false")))
        klass = draw(st.sampled_from(("", *CLASSES)))
        s.write(
            "ADDED",
            _pod(
                name,
                s.uid(name),
                namespace=namespace,
                node=draw(st.sampled_from(NODES)),
                cpu_m=draw(st.sampled_from((500, 1000, 1500))),
                gpu=draw(st.sampled_from((None, None, "1"))),
                priority=None if klass and draw(st.booleans()) else draw(value),
                klass=klass,
                labels=labels,
                start=draw(st.sampled_from(STARTS)),
                scheduled=draw(st.booleans()) or klass != "guard",
            ),
        )
        names.append((namespace, name))
    # The preemptors: without spec.priority (stamped) or with it, written later or not.
    s.write(
        "ADDED",
        _pod(
            DEFAULT_Q, DEFAULT_Q + "-uid", node=None, cpu_m=draw(st.sampled_from((1500, 2500))), klass="mid"
        ),
    )
    member = _pod(JOB_Q, JOB_Q + "-uid", namespace="team-a", node=None, cpu_m=1000, gpu="1", klass="mid")
    member["metadata"]["labels"] = {job.POD_GROUP: "g", job.QUOTA_NAME: "qa", job.PREEMPTIBLE: "true"}
    s.write("ADDED", member)
    ds = _pod(DS_Q, DS_Q + "-uid", node=None, cpu_m=1000, klass="mid")
    ds["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "agent", "uid": "agent-uid"}]
    ds["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            }
        }
    }
    s.write("ADDED", ds)
    s.history.questions = [[DEFAULT_Q + "-uid"], [JOB_Q + "-uid"], [DS_Q + "-uid"]]

    for _ in range(draw(st.integers(max_steps // 4, max_steps))):
        what = draw(st.sampled_from(ACTIONS))
        if what == "class-recreate":
            name = draw(st.sampled_from((*CLASSES, *DEFAULTS)))
            held = s.find("PriorityClass", name)
            if held is not None:
                s.write("DELETED", held)
            guard = (
                (draw(st.sampled_from((100, 1000))), draw(st.sampled_from((0, -1, 600))))
                if name == "guard"
                else None
            )
            s.write(
                "ADDED",
                _class(
                    name,
                    draw(value),
                    s.uid(name),
                    default=name in DEFAULTS or (draw(st.booleans()) and draw(st.booleans())),
                    guard=guard,
                ),
            )
        elif what == "class-retune":
            held = s.find("PriorityClass", draw(st.sampled_from(CLASSES)))
            if held is not None:
                obj = copy.deepcopy(held)
                obj["metadata"]["annotations"] = {
                    GUARD + "minimum-preemptable-priority": str(draw(st.sampled_from((100, 1000, 6000)))),
                    GUARD + "toleration-seconds": str(draw(st.sampled_from((0, -1, 30, 600)))),
                }
                s.write("MODIFIED", obj)
        elif what == "default-appears":
            name = draw(st.sampled_from(DEFAULTS))
            if s.find("PriorityClass", name) is None:
                s.write("ADDED", _class(name, draw(value), s.uid(name), default=True))
        elif what == "default-goes":
            held = s.find("PriorityClass", draw(st.sampled_from(DEFAULTS)))
            if held is not None:
                s.write("DELETED", held)
        elif what in ("write-priority", "drop-priority", "gpu-zero", "terminate", "bind", "nominate"):
            pods = [o for (k, _), o in sorted(s.current.items()) if k == "Pod"]
            if what in ("bind", "nominate"):
                pods = [p for p in pods if not p["spec"].get("nodeName")]
            if not pods:
                continue
            obj = copy.deepcopy(draw(st.sampled_from(pods)))
            spec, status = obj["spec"], obj["status"]
            if what == "write-priority":
                # Mostly admission's own value, the stamp the fold already holds; sometimes another.
                spec["priority"] = _stamp_value(s, obj) if draw(st.integers(0, 3)) else draw(value)
            elif what == "drop-priority":
                spec.pop("priority", None)
            elif what == "gpu-zero":
                requests = spec["containers"][0]["resources"]["requests"]
                if draw(st.booleans()):
                    requests[GPU] = draw(st.sampled_from(("0", "1")))
                else:
                    requests.pop(GPU, None)
            elif what == "terminate":
                if not spec.get("nodeName"):
                    continue
                obj["metadata"]["deletionTimestamp"] = "2025-12-31T23:59:30Z"
                reason = draw(st.sampled_from(("PreemptionByScheduler", "EvictionByEvictionAPI")))
                status["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": reason})
            elif what == "bind":
                spec["nodeName"] = status.get("nominatedNodeName") or draw(st.sampled_from(NODES))
                status.clear()
                status.update({"phase": "Running", "startTime": STARTS[-1], "conditions": []})
            else:
                status["nominatedNodeName"] = draw(st.sampled_from(NODES))
            s.write("MODIFIED", obj)
        elif what == "pod-recreate":
            namespace, name = draw(st.sampled_from(names))
            held = s.find("Pod", name, namespace)
            if held is not None:
                s.write("DELETED", held)
                obj = copy.deepcopy(held)
                obj["metadata"]["uid"] = s.uid(name)
                obj["metadata"].pop("deletionTimestamp", None)
                obj["spec"]["nodeName"] = draw(st.sampled_from(NODES))
                if draw(st.booleans()):
                    obj["spec"].pop("priority", None)
                s.write("ADDED", obj)
        elif what == "node-recreate":
            name = draw(st.sampled_from(NODES))
            held = s.find("Node", name)
            if held is not None:
                s.write("DELETED", held)
            s.write(
                "ADDED",
                _node(name, s.uid(name), draw(st.integers(1, 4)), draw(st.sampled_from((None, 0, 1, 2)))),
            )
        elif what == "stale":
            older = sorted(k for k, versions in s.past.items() if len(versions) > 1 or k not in s.current)
            if not older:
                continue
            key = draw(st.sampled_from(older))
            # Every version before the current one; of a deleted object, any (the deletion too).
            versions = s.past[key][:-1] if key in s.current else s.past[key]
            s.stale(draw(st.sampled_from(("ADDED", "MODIFIED", "DELETED"))), draw(st.sampled_from(versions)))
        elif what == "pdb":
            pdbs = [o for (k, _), o in sorted(s.current.items()) if k == "PodDisruptionBudget"]
            obj = copy.deepcopy(draw(st.sampled_from(pdbs)))
            obj["status"]["disruptionsAllowed"] = draw(st.integers(0, 2))
            s.write("MODIFIED", obj)
        elif what == "quota":
            held = s.find("ElasticQuota", "qa", "team-a")
            if held is not None:
                obj = copy.deepcopy(held)
                obj["spec"]["max"] = {"cpu": str(draw(st.integers(3, 8))), GPU: str(draw(st.integers(0, 2)))}
                s.write("MODIFIED", obj)
        else:
            s.tick(draw(st.sampled_from((30, 300, 900))))
    return s.history
