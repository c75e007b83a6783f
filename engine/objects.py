"""Normalisation of raw Kubernetes objects into the engine's compact records.

Each record keeps only what a decision reads, with quantities already integer
and times already epoch microseconds, so the hot paths never parse anything.
Records are immutable: an update replaces the record, never mutates it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from engine import quantity, timeutil
from engine.errors import InvalidObject, InvalidQuantity
from engine.selectors import LabelSelector, NodeSelectorTerm, parse_required_affinity

Resources = dict[str, int]

GUARANTEED, BURSTABLE, BEST_EFFORT = 2, 1, 0
QOS_NAMES = {GUARANTEED: "Guaranteed", BURSTABLE: "Burstable", BEST_EFFORT: "BestEffort"}
PREEMPT_LOWER = "PreemptLowerPriority"
PREEMPT_NEVER = "Never"
# The DisruptionTarget reason kube-scheduler (and preemptctl's actuator) writes on a victim;
# upstream's PodEligibleToPreemptOthers waits only for pods terminating with it.
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
# kubelet's default --max-pods; used when a node object does not state `pods`.
DEFAULT_MAX_PODS = 110


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Owner:
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Pod:
    uid: str
    namespace: str
    name: str
    resource_version: str
    node: str | None  # spec.nodeName: bound there
    nominated: str | None  # status.nominatedNodeName
    priority: int | None  # spec.priority; None → resolved from the PriorityClass by the cluster
    priority_class: str
    preemption_policy: str | None
    requests: Resources
    qos: int
    start: int  # status.startTime, timeutil.NEVER when not started
    created: int | None
    scheduled_at: int | None  # PodScheduled=True lastTransitionTime
    unschedulable_since: int | None  # PodScheduled=False lastTransitionTime
    unschedulable: bool  # PodScheduled=False reason Unschedulable: asks for preemption
    deleting: bool  # metadata.deletionTimestamp set
    disruption_target: bool  # DisruptionTarget=True: something is evicting it
    # ...with reason PreemptionByScheduler: a preemption (kube-scheduler's or ours) is
    # evicting it, not a drain or an eviction by someone else.
    preempted: bool
    terminal: bool  # Succeeded / Failed: uses nothing
    grace_seconds: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owners: tuple[Owner, ...]
    tolerations: tuple[Toleration, ...]
    node_selector: tuple[tuple[str, str], ...]
    required_affinity: tuple[NodeSelectorTerm, ...] | None
    raw: Mapping[str, Any] = field(compare=False, repr=False)
    # The cluster filled `priority` from the PriorityClass (spec.priority was not written);
    # a record derived from this one (dataclasses.replace) keeps the flag. Not compared:
    # a stamped and a written priority of the same value mean the same pod.
    stamped: bool = field(default=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def daemonset(self) -> bool:
        return any(o.kind == "DaemonSet" for o in self.owners)


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    unschedulable: bool
    taints: tuple[Taint, ...]
    allocatable: Resources


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    uid: str
    resource_version: str
    value: int
    global_default: bool
    preemption_policy: str
    annotations: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Pdb:
    uid: str
    namespace: str
    name: str
    resource_version: str
    selector: LabelSelector | None
    disruptions_allowed: int
    disrupted: frozenset[str]


@dataclass(frozen=True, slots=True)
class ElasticQuota:
    uid: str
    namespace: str
    name: str
    resource_version: str
    min: Resources
    max: Resources


Record = Pod | Node | PriorityClass | Pdb | ElasticQuota


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidObject(f"{where} must be a mapping")
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    return {str(k): "" if v is None else str(v) for k, v in _mapping(value, where).items()}


def _metadata(obj: Mapping[str, Any], kind: str, *, namespaced: bool) -> tuple[str, str, str, str]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name") or not isinstance(meta.get("name"), str):
        raise InvalidObject(f"{kind} without metadata.name")
    name = meta["name"]
    namespace = str(meta.get("namespace") or "default") if namespaced else ""
    # Objects from the API always carry a uid; hand-written cases may not, and a
    # stable stand-in keeps tie-breaks deterministic.
    uid = str(meta.get("uid") or (f"{namespace}/{name}" if namespaced else name))
    rv = str(meta.get("resourceVersion") or "")
    return namespace, name, uid, rv


# Parsed amounts by (resource, text): a cluster repeats a handful of request strings
# millions of times, and parsing is the costliest part of folding a pod event.
_AMOUNTS: dict[tuple[str, Any], int] = {}
_AMOUNTS_MAX = 65_536


def resources(raw: Any, where: str) -> Resources:
    out: Resources = {}
    for name, value in _mapping(raw, where).items():
        key = (str(name), value)
        try:
            amount = _AMOUNTS.get(key) if isinstance(value, (str, int)) else None
            if amount is None:
                amount = quantity.amount(key[0], value)
                if isinstance(value, (str, int)) and len(_AMOUNTS) < _AMOUNTS_MAX:
                    _AMOUNTS[key] = amount
        except InvalidQuantity as exc:
            raise InvalidObject(f"{where}.{name}: {exc}") from exc
        if amount < 0:
            # The API server rejects negative requests, capacities and quota bounds; a
            # negative amount would free room by staying, which no capacity rule allows for.
            raise InvalidObject(f"{where}.{name}: negative quantity {value!r}")
        out[key[0]] = amount
    return out


def _add(into: Resources, other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max(into: Resources, other: Mapping[str, int]) -> None:
    for k, v in other.items():
        if v > into.get(k, 0):
            into[k] = v


def pod_requests(spec: Mapping[str, Any], where: str) -> Resources:
    """Effective requests: containers summed, maxed with init containers, plus overhead.

    Restartable init containers (sidecars, restartPolicy Always) keep running, so
    they add to the main containers and to every later init container's peak, as
    in Kubernetes' resourcehelper.PodRequests. Every pod also takes one `pods` slot.
    """
    total: Resources = {}
    for i, c in enumerate(spec.get("containers") or []):
        _add(
            total, resources((c.get("resources") or {}).get("requests"), f"{where}.containers[{i}].requests")
        )
    init_peak: Resources = {}
    sidecars: Resources = {}
    for i, c in enumerate(spec.get("initContainers") or []):
        req = resources((c.get("resources") or {}).get("requests"), f"{where}.initContainers[{i}].requests")
        if c.get("restartPolicy") == "Always":
            _add(total, req)
            _add(sidecars, req)
            _max(init_peak, sidecars)
        else:
            step = dict(req)
            _add(step, sidecars)
            _max(init_peak, step)
    _max(total, init_peak)
    _add(total, resources(spec.get("overhead"), f"{where}.overhead"))
    total = {k: v for k, v in total.items() if v}
    total["pods"] = 1
    return total


def qos_class(spec: Mapping[str, Any]) -> int:
    """Kubernetes QoS class from requests and limits (cpu and memory only)."""
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
        for r in ("cpu", "memory"):
            if r in req or r in lim:
                any_set = True
            if r not in lim or (r in req and req[r] != lim[r] and not _same_amount(req[r], lim[r])):
                guaranteed = False
    if not any_set:
        return BEST_EFFORT
    return GUARANTEED if guaranteed and containers else BURSTABLE


@functools.lru_cache(maxsize=4096)
def _amount(value: str | int | float) -> Fraction:
    return quantity.parse(value)


def _same_amount(a: Any, b: Any) -> bool:
    """Do two quantities written differently (`1` and `1000m`) mean the same amount?"""
    if isinstance(a, (str, int, float)) and isinstance(b, (str, int, float)):
        return _amount(a) == _amount(b)  # a cluster repeats a handful of request strings
    return quantity.parse(a) == quantity.parse(b)


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == kind:
            return cond
    return None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidObject(f"{where} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError as exc:
        raise InvalidObject(f"{where} must be an integer, got {value!r}") from exc


def pod(obj: Mapping[str, Any]) -> Pod:
    namespace, name, uid, rv = _metadata(obj, "Pod", namespaced=True)
    where = f"Pod {namespace}/{name}"
    meta = obj["metadata"]
    spec = _mapping(obj.get("spec"), f"{where} spec")
    status = _mapping(obj.get("status"), f"{where} status")
    scheduled = _condition(status, "PodScheduled")
    disruption = _condition(status, "DisruptionTarget")
    priority = spec.get("priority")
    owners = tuple(
        Owner(str(o.get("kind", "")), str(o.get("name", "")), str(o.get("uid", "")))
        for o in meta.get("ownerReferences") or []
        if isinstance(o, dict)
    )
    tolerations = tuple(
        Toleration(
            str(t.get("key") or ""),
            str(t.get("operator") or "Equal"),
            str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or []
        if isinstance(t, dict)
    )
    scheduled_true = scheduled is not None and scheduled.get("status") == "True"
    scheduled_false = scheduled is not None and scheduled.get("status") == "False"
    grace = spec.get("terminationGracePeriodSeconds")
    return Pod(
        uid=uid,
        namespace=namespace,
        name=name,
        resource_version=rv,
        node=spec.get("nodeName") or None,
        nominated=status.get("nominatedNodeName") or None,
        priority=None if priority is None else _int(priority, f"{where} spec.priority"),
        priority_class=str(spec.get("priorityClassName") or ""),
        preemption_policy=spec.get("preemptionPolicy") or None,
        requests=pod_requests(spec, f"{where} spec"),
        qos=qos_class(spec),
        start=timeutil.parse(status["startTime"], field=f"{where} status.startTime")
        if status.get("startTime")
        else timeutil.NEVER,
        created=timeutil.parse_optional(meta.get("creationTimestamp"), field=f"{where} creationTimestamp"),
        scheduled_at=timeutil.parse_optional(scheduled.get("lastTransitionTime"))
        if scheduled is not None and scheduled_true
        else None,
        unschedulable_since=timeutil.parse_optional(scheduled.get("lastTransitionTime"))
        if scheduled is not None and scheduled_false
        else None,
        unschedulable=scheduled_false
        and scheduled is not None
        and scheduled.get("reason") == "Unschedulable",
        deleting=bool(meta.get("deletionTimestamp")),
        disruption_target=disruption is not None and disruption.get("status") == "True",
        preempted=disruption is not None
        and disruption.get("status") == "True"
        and disruption.get("reason") == PREEMPTION_BY_SCHEDULER,
        terminal=status.get("phase") in ("Succeeded", "Failed"),
        grace_seconds=30 if grace is None else _int(grace, f"{where} terminationGracePeriodSeconds"),
        labels=_str_map(meta.get("labels"), f"{where} labels"),
        annotations=_str_map(meta.get("annotations"), f"{where} annotations"),
        owners=owners,
        tolerations=tolerations,
        node_selector=tuple(sorted(_str_map(spec.get("nodeSelector"), f"{where} nodeSelector").items())),
        required_affinity=parse_required_affinity(spec, where=where),
        raw=obj,
    )


def node(obj: Mapping[str, Any]) -> Node:
    _, name, uid, rv = _metadata(obj, "Node", namespaced=False)
    where = f"Node {name}"
    spec = _mapping(obj.get("spec"), f"{where} spec")
    status = _mapping(obj.get("status"), f"{where} status")
    alloc_raw = status.get("allocatable")
    if alloc_raw is None:
        alloc_raw = status.get("capacity")
    allocatable = resources(alloc_raw, f"{where} allocatable")
    allocatable.setdefault("pods", DEFAULT_MAX_PODS)
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("taints") or []
        if isinstance(t, dict)
    )
    return Node(
        name=name,
        uid=uid,
        resource_version=rv,
        labels=_str_map((obj.get("metadata") or {}).get("labels"), f"{where} labels"),
        unschedulable=bool(spec.get("unschedulable")),
        taints=taints,
        allocatable=allocatable,
    )


def priority_class(obj: Mapping[str, Any]) -> PriorityClass:
    _, name, uid, rv = _metadata(obj, "PriorityClass", namespaced=False)
    if "value" not in obj:
        raise InvalidObject(f"PriorityClass {name} without value")
    return PriorityClass(
        name=name,
        uid=uid,
        resource_version=rv,
        value=_int(obj["value"], f"PriorityClass {name} value"),
        global_default=bool(obj.get("globalDefault")),
        preemption_policy=str(obj.get("preemptionPolicy") or PREEMPT_LOWER),
        annotations=_str_map(
            (obj.get("metadata") or {}).get("annotations"), f"PriorityClass {name} annotations"
        ),
    )


def pdb(obj: Mapping[str, Any]) -> Pdb:
    namespace, name, uid, rv = _metadata(obj, "PodDisruptionBudget", namespaced=True)
    where = f"PodDisruptionBudget {namespace}/{name}"
    spec = _mapping(obj.get("spec"), f"{where} spec")
    status = _mapping(obj.get("status"), f"{where} status")
    return Pdb(
        uid=uid,
        namespace=namespace,
        name=name,
        resource_version=rv,
        selector=LabelSelector.parse(spec.get("selector"), where=where),
        disruptions_allowed=_int(status.get("disruptionsAllowed") or 0, f"{where} status.disruptionsAllowed"),
        disrupted=frozenset(_mapping(status.get("disruptedPods"), f"{where} disruptedPods")),
    )


def elastic_quota(obj: Mapping[str, Any]) -> ElasticQuota:
    namespace, name, uid, rv = _metadata(obj, "ElasticQuota", namespaced=True)
    where = f"ElasticQuota {namespace}/{name}"
    spec = _mapping(obj.get("spec"), f"{where} spec")
    return ElasticQuota(
        uid=uid,
        namespace=namespace,
        name=name,
        resource_version=rv,
        min=resources(spec.get("min"), f"{where} spec.min"),
        max=resources(spec.get("max"), f"{where} spec.max"),
    )


KINDS: dict[str, Callable[[Mapping[str, Any]], Record]] = {
    "Pod": pod,
    "Node": node,
    "PriorityClass": priority_class,
    "PodDisruptionBudget": pdb,
    "ElasticQuota": elastic_quota,
}


def normalize(obj: Any) -> Record:
    """Normalise any supported object; InvalidObject for anything else."""
    if not isinstance(obj, dict):
        raise InvalidObject(f"object must be a mapping, got {type(obj).__name__}")
    kind = obj.get("kind")
    fn = KINDS.get(kind) if isinstance(kind, str) else None
    if fn is None:
        raise InvalidObject(f"unsupported kind {kind!r}")
    return fn(obj)


def object_uid(obj: Mapping[str, Any]) -> str:
    """The identity a table keys an object by (used for DELETED events with partial objects)."""
    kind = obj.get("kind")
    namespaced = kind in ("Pod", "PodDisruptionBudget", "ElasticQuota")
    return _metadata(obj, str(kind), namespaced=namespaced)[2]
