"""Normalisation of raw Kubernetes objects into the engine's compact records.

Each record keeps only what a decision reads, with quantities already integer
and times already epoch microseconds, so the hot paths never parse anything.
Records are immutable: an update replaces the record, never mutates it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, make_dataclass
from fractions import Fraction
from typing import Any

import orjson

from engine import constraints, quantity, timeutil
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
    # Host ports, required pod (anti-)affinity, topology spread (engine.constraints), or
    # None: what the inter-pod filters read (engine.interpod).
    scheduling: constraints.Scheduling | None
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


# Pods are built by the hundred thousand (a cluster's state, every watch event), and a
# frozen dataclass sets each of its 30 fields through object.__setattr__: a third of
# normalising a pod. `_PodFields` is the same layout without the freeze; a pod is built
# as one (plain slot stores) and then becomes a Pod (`__class__` assignment, which
# CPython allows between classes of identical slots). The result is a Pod in every
# respect, as frozen as one built by Pod(...) (tests/test_objects.py checks both).
_PodFields = make_dataclass(
    "_PodFields",
    [(f.name, f.type, field(default=f.default)) for f in fields(Pod)],
    slots=True,
    eq=False,
    repr=False,
)


def _new_pod(*values: Any) -> Pod:
    built = _PodFields(*values)
    built.__class__ = Pod
    return built  # type: ignore[no-any-return]


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


@dataclass(frozen=True, slots=True)
class Namespace:
    """A namespace's labels, which a pod (anti-)affinity term's namespaceSelector reads."""

    name: str
    uid: str
    resource_version: str
    # Always holds constraints.NAMESPACE_NAME_LABEL: the name, as the API server sets it.
    labels: Mapping[str, str]


Record = Pod | Node | PriorityClass | Pdb | ElasticQuota | Namespace

# Nodes the same way as pods (`_new_pod`): one per node event, 7 fields.
_NodeFields = make_dataclass(
    "_NodeFields",
    [(f.name, f.type, field(default=f.default)) for f in fields(Node)],
    slots=True,
    eq=False,
    repr=False,
)


def _new_node(*values: Any) -> Node:
    built = _NodeFields(*values)
    built.__class__ = Node
    return built  # type: ignore[no-any-return]


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


# Kubernetes priorities are int32 (PodSpec.priority, PriorityClass.value): the API server
# refuses anything else, so such an object is dead-lettered here, and every priority the
# engine holds fits the node table's int64 sums (engine.nodetable).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _priority(value: Any, where: str) -> int:
    number = _int(value, where)
    if not INT32_MIN <= number <= INT32_MAX:
        raise InvalidObject(f"{where} must be a 32-bit integer ({INT32_MIN} to {INT32_MAX}), got {number}")
    return number


# What a pod's spec gives the engine besides its node and priority (which the index may
# overwrite in a record: a stamp, a binding), in Pod field order: priority_class,
# preemption_policy, requests, qos, grace_seconds, tolerations, node_selector,
# required_affinity.
_SpecFields = tuple[
    str,
    str | None,
    Resources,
    int,
    int,
    tuple[Toleration, ...],
    tuple[tuple[str, str], ...],
    tuple[NodeSelectorTerm, ...] | None,
    constraints.Scheduling | None,
]


def _plain_requests(spec: Mapping[str, Any]) -> tuple[Resources, int] | None:
    """Requests and QoS class of the common pod (containers only, amounts seen before), or None.

    None sends the pod to `pod_requests` and `qos_class`, which handle (and reject)
    everything else: init containers, overhead, unseen or invalid amounts.
    """
    if spec.get("initContainers") or spec.get("overhead"):
        return None
    total: Resources = {}
    any_set = False
    guaranteed = True
    containers = spec.get("containers")
    if not containers:
        return None
    amounts = _AMOUNTS
    for c in containers:
        if type(c) is not dict:
            return None
        res = c.get("resources")
        if not res:
            guaranteed = False
            continue
        if type(res) is not dict:
            return None
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
        if type(req) is not dict or type(lim) is not dict:
            return None
        for name, value in req.items():
            amount = amounts.get((name, value))
            if amount is None or amount < 0 or type(name) is not str:
                return None
            total[name] = total.get(name, 0) + amount
        for r in ("cpu", "memory"):
            if r in req or r in lim:
                any_set = True
            if r not in lim or (r in req and req[r] != lim[r]):
                guaranteed = False  # `1` and `1000m` differ as text: pod_requests decides those
                if r in lim and r in req:
                    return None
    total = {k: v for k, v in total.items() if v}
    total["pods"] = 1
    if not any_set:
        return total, BEST_EFFORT
    return total, GUARANTEED if guaranteed else BURSTABLE


def _check_containers(spec: Mapping[str, Any], where: str) -> None:
    """Containers are a list of mappings whose `resources` is a mapping (the API server's
    schema): anything else is a bad object, refused with its reason, never a crash."""
    for field_name in ("containers", "initContainers"):
        items = spec.get(field_name)
        if items is None:
            continue
        if not isinstance(items, list):
            raise InvalidObject(f"{where} {field_name} must be a list")
        for i, c in enumerate(items):
            if not isinstance(c, dict):
                raise InvalidObject(f"{where} {field_name}[{i}] must be a mapping")
            res = c.get("resources")
            if res is not None and not isinstance(res, dict):
                raise InvalidObject(f"{where} {field_name}[{i}].resources must be a mapping")


def _spec_fields(spec: Mapping[str, Any], where: str) -> _SpecFields:
    _check_containers(spec, where)
    grace = spec.get("terminationGracePeriodSeconds")
    tolerations = spec.get("tolerations")
    selector = spec.get("nodeSelector")
    plain = _plain_requests(spec)
    requests, qos = plain if plain is not None else (pod_requests(spec, f"{where} spec"), qos_class(spec))
    return (
        str(spec.get("priorityClassName") or ""),
        spec.get("preemptionPolicy") or None,
        requests,
        qos,
        30 if grace is None else _int(grace, f"{where} terminationGracePeriodSeconds"),
        tuple(
            Toleration(
                str(t.get("key") or ""),
                str(t.get("operator") or "Equal"),
                str(t.get("value") or ""),
                str(t.get("effect") or ""),
            )
            for t in tolerations
            if isinstance(t, dict)
        )
        if tolerations
        else (),
        tuple(sorted(_str_map(selector, f"{where} nodeSelector").items())) if selector is not None else (),
        parse_required_affinity(spec, where=where) if spec.get("affinity") else None,
        constraints.parse(spec, where),
    )


# Parsed pod parts by their raw text: the replicas of a workload share their spec but for
# the node and their metadata but for name, uid and times, and parsing them is most of
# normalising a pod. Keys are orjson's bytes of the raw part (dicts in their order);
# values are shared, immutable results, so equal parts give equal records.
_SPECS: dict[bytes, Any] = {}
_METAS: dict[bytes, Any] = {}
_ALLOCATABLE: dict[bytes, Resources] = {}
# Entries kept per memo: a cluster has thousands of pod shapes, not millions.
_MEMO_MAX = 16_384
# Anything orjson would write ambiguously is not memoised: datetimes from YAML (written
# as text, while str() of one differs), and NaN or infinities (written as null, hence
# every key with a null: it only costs a parse).
_KEY_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME
_NO_KEY = b""
# timeutil's parsed instants, read directly: most pod timestamps were seen before.
_TIMES = timeutil._PARSED
# Spec fields that differ between replicas and are read fresh, never memoised.
_OWN_SPEC = ("nodeName", "priority")


def _key(value: Any) -> bytes:
    try:
        key = orjson.dumps(value, option=_KEY_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: a datetime, a subclass, a big int, a non-str key
        return _NO_KEY
    return _NO_KEY if b"null" in key else key


def _spec_key(spec: dict[str, Any]) -> bytes:
    if "nodeName" in spec or "priority" in spec:
        spec = dict(spec)
        for k in _OWN_SPEC:
            spec.pop(k, None)
    return _key(spec)


def _memo(memo: dict[bytes, Any], key: bytes, parse: Callable[..., Any], *args: Any) -> Any:
    if key:
        hit = memo.get(key)
        if hit is not None:
            return hit
    value = parse(*args)  # raises for bad input, and nothing is kept
    if key:
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[key] = value
    return value


def _meta_fields(
    meta: Mapping[str, Any], where: str
) -> tuple[Mapping[str, str], Mapping[str, str], tuple[Owner, ...]]:
    return (
        _str_map(meta.get("labels"), f"{where} labels"),
        _str_map(meta.get("annotations"), f"{where} annotations"),
        _owners(meta),
    )


def _owners(meta: Mapping[str, Any]) -> tuple[Owner, ...]:
    refs = meta.get("ownerReferences")
    if not refs:
        return ()
    return tuple(
        Owner(str(o.get("kind", "")), str(o.get("name", "")), str(o.get("uid", "")))
        for o in refs
        if isinstance(o, dict)
    )


def pod(obj: Mapping[str, Any], previous: Pod | None = None) -> Pod:
    """A Pod record; `previous`, the record this object replaces, lends what did not change.

    A MODIFIED event mostly changes status or metadata (a kubelet heartbeat, a
    condition, a resourceVersion): when the raw spec, labels, annotations or owners
    equal those `previous` was made from (`previous.raw`, compared as plain data in
    C), their parsed form is taken from it instead of being parsed again. Only
    fields nothing overwrites in a record are lent (never node, priority, deleting,
    nominated: the index stamps and the controller replaces those), so the result
    equals `pod(obj)`, field for field. The raw objects handed here are never
    mutated afterwards (records hold them).
    """
    meta: dict[str, Any] = obj.get("metadata")  # type: ignore[assignment]  # checked just below
    name = meta.get("name") if type(meta) is dict else None
    if not name or type(name) is not str:
        namespace, name, uid, rv = _metadata(obj, "Pod", namespaced=True)  # raises, or a str subclass
        meta = obj["metadata"]
    else:
        # _metadata(obj, "Pod", namespaced=True), inline: it runs for every pod event.
        namespace = str(meta.get("namespace") or "default")
        uid = str(meta.get("uid") or f"{namespace}/{name}")
        rv = str(meta.get("resourceVersion") or "")
    where = f"Pod {namespace}/{name}"
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    elif not isinstance(spec, dict):
        raise InvalidObject(f"{where} spec must be a mapping")
    status = obj.get("status")
    if status is None:
        status = {}
    elif not isinstance(status, dict):
        raise InvalidObject(f"{where} status must be a mapping")
    before = previous.raw if previous is not None else None
    if before is not None and before.get("spec") == spec and previous is not None:
        # The same spec as the record this replaces: lend its parsed fields.
        fields: _SpecFields = (
            previous.priority_class,
            previous.preemption_policy,
            previous.requests,
            previous.qos,
            previous.grace_seconds,
            previous.tolerations,
            previous.node_selector,
            previous.required_affinity,
            # Parsed again, not lent: the record's own is resolved against labels that may
            # have changed since (matchLabelKeys). Only pods with such requirements pay.
            None if previous.scheduling is None else constraints.parse(spec, where),
        )
    else:
        key = _spec_key(spec)
        hit = _SPECS.get(key) if key else None
        fields = hit if hit is not None else _memo(_SPECS, key, _spec_fields, spec, where)
    klass, policy, requests, qos, grace, tolerations, node_selector, affinity, scheduling = fields
    before_meta = before.get("metadata") if before is not None else None
    labels_raw = meta.get("labels")
    annotations_raw = meta.get("annotations")
    owners_raw = meta.get("ownerReferences")
    if (
        previous is not None
        and isinstance(before_meta, dict)
        and before_meta.get("labels") == labels_raw
        and before_meta.get("annotations") == annotations_raw
        and before_meta.get("ownerReferences") == owners_raw
    ):
        # The same labels, annotations and owners as the record this replaces.
        labels, annotations, owners = previous.labels, previous.annotations, previous.owners
    elif labels_raw is None and annotations_raw is None and owners_raw is None:
        labels, annotations, owners = {}, {}, ()
    else:
        labels, annotations, owners = _memo(
            _METAS, _key((labels_raw, annotations_raw, owners_raw)), _meta_fields, meta, where
        )
    scheduled: Mapping[str, Any] | None = None
    disruption: Mapping[str, Any] | None = None
    for cond in status.get("conditions") or ():
        if isinstance(cond, dict):
            kind = cond.get("type")
            if kind == "PodScheduled":
                if scheduled is None:
                    scheduled = cond
            elif kind == "DisruptionTarget" and disruption is None:
                disruption = cond
    scheduled_true = scheduled_false = False
    scheduled_at = unschedulable_since = None
    if scheduled is not None:
        state = scheduled.get("status")
        if state == "True":
            scheduled_true = True
            scheduled_at = timeutil.parse_optional(scheduled.get("lastTransitionTime"))
            if scheduled_at is None:  # Go's zero time, as PreemptionToleration reads it: long scheduled
                scheduled_at = timeutil.GO_ZERO
        elif state == "False":
            scheduled_false = True
            unschedulable_since = timeutil.parse_optional(scheduled.get("lastTransitionTime"))
    priority = spec.get("priority")
    if priority is not None and (type(priority) is not int or not INT32_MIN <= priority <= INT32_MAX):
        priority = _priority(priority, f"{where} spec.priority")
    started = status.get("startTime")
    start: int | None = timeutil.NEVER
    if started:
        start = _TIMES.get(started) if type(started) is str else None
        if start is None:
            start = timeutil.parse(started, field=f"{where} status.startTime")
    created_raw = meta.get("creationTimestamp")
    created = _TIMES.get(created_raw) if type(created_raw) is str else None
    if created is None:
        created = timeutil.parse_optional(created_raw, field=f"{where} creationTimestamp")
    # Positional, in Pod field order (the fastest call there is, once per event).
    return _new_pod(
        uid,
        namespace,
        name,
        rv,
        spec.get("nodeName") or None,
        status.get("nominatedNodeName") or None,
        priority,
        klass,
        policy,
        requests,
        qos,
        start,
        created,
        scheduled_at if scheduled_true else None,
        unschedulable_since if scheduled_false else None,
        scheduled_false and scheduled is not None and scheduled.get("reason") == "Unschedulable",
        bool(meta.get("deletionTimestamp")),
        disruption is not None and disruption.get("status") == "True",
        disruption is not None
        and disruption.get("status") == "True"
        and disruption.get("reason") == PREEMPTION_BY_SCHEDULER,
        status.get("phase") in ("Succeeded", "Failed"),
        grace,
        labels,
        annotations,
        owners,
        tolerations,
        node_selector,
        affinity,
        scheduling.resolve(namespace, labels) if scheduling is not None else None,
        obj,
    )


def node(obj: Mapping[str, Any]) -> Node:
    _, name, uid, rv = _metadata(obj, "Node", namespaced=False)
    spec = obj.get("spec")
    status = obj.get("status")
    if type(spec) is not dict or type(status) is not dict:
        spec = _mapping(spec, f"Node {name} spec")
        status = _mapping(status, f"Node {name} status")
    alloc_raw = status.get("allocatable")
    if alloc_raw is None:
        alloc_raw = status.get("capacity")
    key = _key(alloc_raw) if alloc_raw else _NO_KEY
    # Nodes come in a few shapes: their parsed capacity is shared (and never mutated).
    parsed = _ALLOCATABLE.get(key) if key else None
    if parsed is None:
        parsed = resources(alloc_raw, f"Node {name} allocatable")
        parsed.setdefault("pods", DEFAULT_MAX_PODS)
        if key:
            if len(_ALLOCATABLE) >= _MEMO_MAX:
                _ALLOCATABLE.clear()
            _ALLOCATABLE[key] = parsed
    raw_taints = spec.get("taints")
    taints = (
        tuple(
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in raw_taints
            if isinstance(t, dict)
        )
        if raw_taints
        else ()
    )
    labels = obj["metadata"].get("labels")
    return _new_node(
        name,
        uid,
        rv,
        _str_map(labels, f"Node {name} labels") if labels is not None else {},
        bool(spec.get("unschedulable")),
        taints,
        parsed,
    )


def priority_class(obj: Mapping[str, Any]) -> PriorityClass:
    _, name, uid, rv = _metadata(obj, "PriorityClass", namespaced=False)
    if "value" not in obj:
        raise InvalidObject(f"PriorityClass {name} without value")
    return PriorityClass(
        name=name,
        uid=uid,
        resource_version=rv,
        value=_priority(obj["value"], f"PriorityClass {name} value"),
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


def namespace(obj: Mapping[str, Any]) -> Namespace:
    _, name, uid, rv = _metadata(obj, "Namespace", namespaced=False)
    labels = _str_map(obj["metadata"].get("labels"), f"Namespace {name} labels")
    # The API server sets this label to the name on every namespace (and refuses another
    # value); a hand-written object may leave it out or get it wrong.
    labels[constraints.NAMESPACE_NAME_LABEL] = name
    return Namespace(name=name, uid=uid, resource_version=rv, labels=labels)


KINDS: dict[str, Callable[[Mapping[str, Any]], Record]] = {
    "Pod": pod,
    "Node": node,
    "PriorityClass": priority_class,
    "PodDisruptionBudget": pdb,
    "ElasticQuota": elastic_quota,
    "Namespace": namespace,
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
