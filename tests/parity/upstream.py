"""kube-scheduler's preemption, transcribed, with a switch for each of preemptctl's departures.

The differential tests (tests/parity) put the same API objects before the real
kube-scheduler v1.34.2 and before preemptctl. When the two answers differ, this
model says whether the difference is a documented departure: with every switch
in DEPARTURES off it must give the real scheduler's answer (it transcribes
DefaultPreemption, and scheduler-plugins v0.34.7's PreemptionToleration in its
place); with every switch on it must give preemptctl's; and the switches whose
flip turns one into the other are the departures that explain the difference.
A difference the switches cannot explain fails the test: an undocumented
departure (or a model that is wrong, which the same checks catch on every
cluster, agreeing ones included).

It reads the raw objects as the API server returned them (defaulted and
admitted: spec.priority filled in, status.qosClass set), never preemptctl's
engine: only quantities are parsed with engine.quantity. Where kube-scheduler
breaks a tie at random (candidate nodes equal on every criterion, victims equal
in priority and start time whose order `sort.Slice` leaves to the input), the
answer is the set of every outcome it may pick; with every switch on, ties are
broken as preemptctl breaks them (node name; QoS class, then uid), so that
answer is a single one.

The upstream sources, by function:
k8s.io/kubernetes@v1.34.2 pkg/scheduler/framework/plugins/defaultpreemption/
default_preemption.go (SelectVictimsOnNode, PodEligibleToPreemptOthers,
filterPodsWithPDBViolation), pkg/scheduler/framework/preemption/preemption.go
(DryRunPreemption, pickOneNodeForPreemption), pkg/scheduler/util/utils.go
(MoreImportantPod, GetEarliestPodStartTime), plugins/noderesources/fit.go
(fitsRequest), tainttoleration, nodeaffinity, nodeunschedulable; and
sigs.k8s.io/scheduler-plugins@v0.34.7 pkg/preemptiontoleration
(ExemptedFromPreemption, parsePreemptionTolerationPolicy, its own
PodEligibleToPreemptOthers).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine import quantity

# preemptctl's departures from the upstream rules, each documented in docs/semantics.md
# (section "Departures from kube-scheduler", under this id) with its reason and shown by
# tests/conformance/cases/departures/<id>.yaml.
DEPARTURES: dict[str, str] = {
    "pdb-violations-on-final-victims": "a node's PDB violations are counted on its final victims, "
    "not on the pods flagged before the reprieve",
    "qos-class-in-importance": "importance orders equal priorities by QoS class before start time",
    "pods-allocatable-default": "a node without a pods figure in allocatable holds kubelet's default 110 "
    "(and one without allocatable at all its capacity)",
    "toleration-in-every-profile": "PriorityClass toleration annotations protect pods from every "
    "preemptor, not only under the PreemptionToleration plugin",
    "toleration-annotation-alias": "the preemption-toleration.scheduling.sigs.k8s.io/ prefix is read too",
    "toleration-boundary-inclusive": "a pod scheduled exactly toleration-seconds ago is still protected",
    "toleration-waits-only-for-preemptions": "under PreemptionToleration, only a preemption's victims "
    "hold a nominated preemptor (DefaultPreemption's rule), not any terminating pod",
    "nominations-of-every-scheduler": "pods nominated by any scheduler count on their node, "
    "not only those of the deciding scheduler's profiles",
}
ALL = frozenset(DEPARTURES)
UPSTREAM: frozenset[str] = frozenset()

PREEMPT, FITS, WAIT, UNSCHEDULABLE = "preempt", "fits", "wait", "unschedulable"
DEFAULT, TOLERATION = "default", "toleration"
TOLERATION_PREFIX = "preemption-toleration.scheduling.x-k8s.io/"
TOLERATION_ALIAS = "preemption-toleration.scheduling.sigs.k8s.io/"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
SHIFT = 2**31
# A tie within one node (victims equal in priority and start time) is resolved by trying
# every order of the tied pods; past this many orders the cluster is too tied to judge.
MAX_ORDERS = 5040
_INT = re.compile(r"^[+-]?[0-9]+$")
# strconv.ParseInt(s, 10, bits)'s syntax: an optional sign, then ASCII digits and nothing else
# (no whitespace, underscores, other Unicode digits, nor the trailing newline `$` lets through).
_GO_DECIMAL = re.compile(r"[+-]?[0-9]+")
# Go's zero time.Time, 0001-01-01T00:00:00Z, in epoch seconds: what an unset metav1.Time reads as.
GO_ZERO_S = -62_135_596_800
NANOS = 10**9


class TooTied(Exception):
    """More orders of equally important victims than the model tries: the generator avoids these."""


@dataclass(frozen=True)
class Answer:
    outcome: str
    # preempt: every (node, victims) the scheduler may choose; fits: unused (any node).
    options: frozenset[tuple[str, frozenset[str]]] = frozenset()

    def admits(self, outcome: str, node: str | None, victims: Iterable[str]) -> bool:
        if outcome != self.outcome:
            return False
        if outcome != PREEMPT:
            return True
        return (node or "", frozenset(victims)) in self.options

    def describe(self) -> str:
        if self.outcome != PREEMPT:
            return self.outcome
        shown = sorted((n, sorted(v)) for n, v in self.options)
        return f"preempt on one of {shown}"


# ---- reading the objects --------------------------------------------------------------


def _time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _resources(raw: Mapping[str, Any] | None) -> dict[str, int]:
    return {str(k): quantity.amount(str(k), v) for k, v in (raw or {}).items()}


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = max(into.get(k, 0), v)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """k8s.io/component-helpers resource.PodRequests (no pod-level resources)."""
    spec = pod["spec"]
    reqs: dict[str, int] = {}
    for c in spec.get("containers") or []:
        _add(reqs, _resources((c.get("resources") or {}).get("requests")))
    restartable: dict[str, int] = {}
    init: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        r = _resources((c.get("resources") or {}).get("requests"))
        if c.get("restartPolicy") == "Always":
            _add(reqs, r)
            _add(restartable, r)
            step = dict(restartable)
        else:
            step = dict(r)
            _add(step, restartable)
        _max(init, step)
    _max(reqs, init)
    _add(reqs, _resources(spec.get("overhead")))
    return reqs


# (hostIP, protocol, hostPort), sanitized as HostPortInfo does: "" is 0.0.0.0, no protocol is TCP.
Port = tuple[str, str, int]
BIND_ALL = "0.0.0.0"


def host_ports(raw: Mapping[str, Any]) -> tuple[Port, ...]:
    """scheduler util.GetHostPorts: restartable (sidecar) init containers, then containers."""
    spec = raw["spec"]
    containers = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    containers += list(spec.get("containers") or [])
    out = []
    for c in containers:
        for p in c.get("ports") or []:
            if int(p.get("hostPort") or 0) > 0:
                out.append((p.get("hostIP") or BIND_ALL, p.get("protocol") or "TCP", int(p["hostPort"])))
    return tuple(out)


def port_conflict(used: set[Port], want: Port) -> bool:
    """HostPortInfo.CheckConflict."""
    ip, protocol, port = want
    if ip == BIND_ALL:
        return any((p[1], p[2]) == (protocol, port) for p in used)
    return (BIND_ALL, protocol, port) in used or want in used


@dataclass(frozen=True)
class Selector:
    """labels.Selector from metav1.LabelSelectorAsSelector: nil is Nothing, {} Everything."""

    requirements: tuple[tuple[str, str, tuple[str, ...]], ...] | None  # None: Nothing

    @staticmethod
    def of(raw: Mapping[str, Any] | None) -> Selector:
        if raw is None:
            return Selector(None)
        reqs = [(str(k), "In", (str(v),)) for k, v in sorted((raw.get("matchLabels") or {}).items())]
        for e in raw.get("matchExpressions") or []:
            reqs.append((e["key"], e["operator"], tuple(e.get("values") or ())))
        return Selector(tuple(reqs))

    def empty(self) -> bool:
        return self.requirements is not None and not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.requirements is None:
            return False
        return all(
            _match_expression(labels, {"operator": op, "values": list(values)}, labels.get(key))
            for key, op, values in self.requirements
        )

    def merged(self, keys: Iterable[str], operator: str, labels: Mapping[str, str]) -> Selector:
        """The pod's values of `keys` merged in (matchLabelKeys In, mismatchLabelKeys NotIn), as the API
        server does at creation and the scheduler again: a requirement already there changes nothing."""
        if self.requirements is None:
            return self
        extra = [(k, operator, (labels[k],)) for k in keys if k in labels]
        return Selector(self.requirements + tuple(r for r in extra if r not in self.requirements))


def namespace_labels(namespace: str) -> dict[str, str]:
    """The labels of a namespace whose Namespace object is not among the objects: only the one the
    API server sets (World.of gives each pod its namespace's own, GetNamespaceLabelsSnapshot)."""
    return {"kubernetes.io/metadata.name": namespace}


@dataclass(frozen=True)
class Term:
    """framework.AffinityTerm of a required PodAffinityTerm. The incoming pod's namespaceSelector is
    unrolled into namespaces upstream (mergeAffinityTermNamespacesIfNotEmpty); matching the selector
    against the target's namespace labels is the same for every namespace that exists."""

    namespaces: frozenset[str]
    selector: Selector
    key: str
    namespace_selector: Selector

    @staticmethod
    def of(raw: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> Term:
        names = list(raw.get("namespaces") or [])
        if not names and raw.get("namespaceSelector") is None:
            names = [namespace]
        selector = Selector.of(raw.get("labelSelector"))
        selector = selector.merged(raw.get("matchLabelKeys") or [], "In", labels)
        selector = selector.merged(raw.get("mismatchLabelKeys") or [], "NotIn", labels)
        return Term(
            frozenset(names),
            selector,
            str(raw.get("topologyKey") or ""),
            Selector.of(raw.get("namespaceSelector")),
        )

    def matches(self, pod: Pod) -> bool:
        if pod.namespace in self.namespaces or self.namespace_selector.matches(pod.namespace_labels):
            return self.selector.matches(pod.labels)
        return False


@dataclass
class Pod:
    raw: dict[str, Any]
    key: str
    name: str
    namespace: str
    priority: int
    requests: dict[str, int]
    start: float | None
    qos: int
    labels: dict[str, str]
    node: str
    nominated: str
    deleting: bool
    scheduler: str
    klass: str
    uid: str
    ports: tuple[Port, ...] = ()
    # Required (anti-)affinity terms, read against this pod (its namespace, its labels' keys).
    affinity_terms: tuple[Term, ...] = ()
    anti_terms: tuple[Term, ...] = ()
    # Its namespace's labels, as a namespaceSelector matches them (set by World.of).
    namespace_labels: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def of(raw: dict[str, Any]) -> Pod:
        meta, spec, status = raw["metadata"], raw["spec"], raw.get("status") or {}
        qos = {"Guaranteed": 2, "Burstable": 1, "BestEffort": 0}[status.get("qosClass") or "BestEffort"]
        affinity = spec.get("affinity") or {}
        namespace, labels = meta["namespace"], dict(meta.get("labels") or {})

        def terms(kind: str) -> tuple[Term, ...]:
            raw_terms = (affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []
            return tuple(Term.of(t, namespace, labels) for t in raw_terms)

        return Pod(
            raw=raw,
            key=f"{meta['namespace']}/{meta['name']}",
            name=meta["name"],
            namespace=meta["namespace"],
            priority=int(spec.get("priority") or 0),
            requests=pod_requests(raw),
            start=_time(status.get("startTime")),
            qos=qos,
            labels=dict(meta.get("labels") or {}),
            node=spec.get("nodeName") or "",
            nominated=status.get("nominatedNodeName") or "",
            deleting=bool(meta.get("deletionTimestamp")),
            scheduler=spec.get("schedulerName") or "default-scheduler",
            klass=spec.get("priorityClassName") or "",
            uid=meta["uid"],
            ports=host_ports(raw),
            affinity_terms=terms("podAffinity"),
            anti_terms=terms("podAntiAffinity"),
        )

    def condition(self, kind: str) -> dict[str, Any] | None:
        for c in (self.raw.get("status") or {}).get("conditions") or []:
            if c.get("type") == kind:
                return dict(c)
        return None


@dataclass
class Node:
    raw: dict[str, Any]
    name: str
    allocatable: dict[str, int]
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool
    pods: list[Pod] = field(default_factory=list)


@dataclass
class World:
    nodes: dict[str, Node]
    pods: list[Pod]
    classes: dict[str, dict[str, Any]]
    pdbs: list[dict[str, Any]]
    # Scheduler names of the deciding kube-scheduler's profiles: the pods it tracks.
    schedulers: frozenset[str]

    @staticmethod
    def of(objects: Sequence[dict[str, Any]], schedulers: Iterable[str], departures: frozenset[str]) -> World:
        nodes: dict[str, Node] = {}
        pods: list[Pod] = []
        classes: dict[str, dict[str, Any]] = {}
        pdbs: list[dict[str, Any]] = []
        labels_of: dict[str, dict[str, str]] = {}
        for obj in objects:
            kind = obj["kind"]
            if kind == "Node":
                status = obj.get("status") or {}
                alloc_raw = status.get("allocatable")
                if alloc_raw is None and "pods-allocatable-default" in departures:
                    alloc_raw = status.get("capacity")
                alloc = _resources(alloc_raw)
                if "pods" not in alloc and "pods-allocatable-default" in departures:
                    alloc["pods"] = 110
                spec = obj.get("spec") or {}
                nodes[obj["metadata"]["name"]] = Node(
                    obj,
                    obj["metadata"]["name"],
                    alloc,
                    dict(obj["metadata"].get("labels") or {}),
                    list(spec.get("taints") or []),
                    bool(spec.get("unschedulable")),
                )
            elif kind == "Pod":
                if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue  # the scheduler's informer never lists terminal pods
                pods.append(Pod.of(obj))
            elif kind == "PriorityClass":
                classes[obj["metadata"]["name"]] = obj
            elif kind == "PodDisruptionBudget":
                pdbs.append(obj)
            elif kind == "Namespace":
                name = obj["metadata"]["name"]
                labels_of[name] = {**(obj["metadata"].get("labels") or {}), **namespace_labels(name)}
        for pod in pods:
            pod.namespace_labels = labels_of.get(pod.namespace) or namespace_labels(pod.namespace)
            if pod.node in nodes:
                nodes[pod.node].pods.append(pod)
        return World(nodes, pods, classes, pdbs, frozenset(schedulers))


# ---- filters ---------------------------------------------------------------------------


def _tolerates_taint(pod: Pod, taint: Mapping[str, Any]) -> bool:
    for t in pod.raw["spec"].get("tolerations") or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("key") and t.get("key") != taint.get("key"):
            continue
        if (t.get("operator") or "Equal") == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _match_expression(labels: Mapping[str, str], expr: Mapping[str, Any], value: str | None) -> bool:
    op, values = expr.get("operator"), list(expr.get("values") or [])
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and _INT.match(value) and values and _INT.match(values[0]):
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    return False


def _node_matches(pod: Pod, node: Node) -> bool:
    spec = pod.raw["spec"]
    for k, v in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(k) != v:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    for term in terms:
        exprs = list(term.get("matchExpressions") or [])
        fields = list(term.get("matchFields") or [])
        if not exprs and not fields:
            continue
        if all(_match_expression(node.labels, e, node.labels.get(e["key"])) for e in exprs) and all(
            _match_expression({}, f, node.name if f.get("key") == "metadata.name" else None) for f in fields
        ):
            return True
    return False


SUCCESS, UNSCHEDULABLE_CODE, UNRESOLVABLE = "Success", "Unschedulable", "UnschedulableAndUnresolvable"
# The filters this model can switch off one at a time (classify: which of them decide a cluster).
NODE_PORTS, INTER_POD_AFFINITY, POD_TOPOLOGY_SPREAD = "NodePorts", "InterPodAffinity", "PodTopologySpread"
FILTERS = frozenset({NODE_PORTS, INTER_POD_AFFINITY, POD_TOPOLOGY_SPREAD})


def _node_static(pod: Pod, node: Node) -> str | None:
    """NodeUnschedulable, TaintToleration, NodeAffinity: UnschedulableAndUnresolvable or None."""
    if node.unschedulable and not _tolerates_taint(
        pod, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    ):
        return UNRESOLVABLE
    if _untolerated(pod, node):
        return UNRESOLVABLE
    if not _node_matches(pod, node):
        return UNRESOLVABLE
    return None


def _untolerated(pod: Pod, node: Node) -> bool:
    """FindMatchingUntoleratedTaint with DoNotScheduleTaintsFilterFunc (NoSchedule, NoExecute)."""
    return any(
        taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates_taint(pod, taint)
        for taint in node.taints
    )


def _resources_status(pod: Pod, node: Node, present: Sequence[Pod]) -> str | None:
    """NodeResourcesFit's fitsRequest with `present` on the node: every shortfall is Unschedulable,
    UnschedulableAndUnresolvable when one request exceeds the node's allocatable (the pod count never)."""
    short = len(present) + 1 > node.allocatable.get("pods", 0)
    used: dict[str, int] = {}
    for p in present:
        _add(used, p.requests)
    for r, v in pod.requests.items():
        if r == "pods" or v == 0:
            continue
        if v > node.allocatable.get(r, 0):
            return UNRESOLVABLE
        if v > node.allocatable.get(r, 0) - used.get(r, 0):
            short = True
    return UNSCHEDULABLE_CODE if short else None


@dataclass(frozen=True)
class Constraint:
    """podtopologyspread.topologySpreadConstraint (DoNotSchedule only: the Filter's)."""

    max_skew: int
    key: str
    selector: Selector
    min_domains: int
    affinity_policy: str
    taints_policy: str

    def includes(self, pod: Pod, node: Node) -> bool:
        """matchNodeInclusionPolicies."""
        if self.affinity_policy == "Honor" and not _node_matches(pod, node):
            return False
        return not (self.taints_policy == "Honor" and _untolerated(pod, node))


def _constraints(pod: Pod) -> list[Constraint]:
    out = []
    for c in pod.raw["spec"].get("topologySpreadConstraints") or []:
        if c.get("whenUnsatisfiable") != "DoNotSchedule":
            continue
        selector = Selector.of(c.get("labelSelector")).merged(c.get("matchLabelKeys") or [], "In", pod.labels)
        out.append(
            Constraint(
                int(c["maxSkew"]),
                str(c["topologyKey"]),
                selector,
                int(c.get("minDomains") or 1),
                c.get("nodeAffinityPolicy") or "Honor",
                c.get("nodeTaintsPolicy") or "Ignore",
            )
        )
    return out


Pair = tuple[str, str]


def _bump(counts: dict[Pair, int], node: Node, key: str, delta: int) -> None:
    """topologyToMatchedTermCount.update: only where the node has the key; a zero count is dropped."""
    if key in node.labels:
        pair = (key, node.labels[key])
        counts[pair] = counts.get(pair, 0) + delta
        if counts[pair] == 0:
            del counts[pair]


@dataclass
class State:
    """The cycle state PreFilter writes and AddPod/RemovePod update (cloned per node, as upstream)."""

    spread: list[dict[str, int]]  # PodTopologySpread TpValueToMatchNum, per constraint
    existing_anti: dict[Pair, int]  # InterPodAffinity: existing pods' anti-affinity matching the pod
    affinity: dict[Pair, int]
    anti: dict[Pair, int]

    def clone(self) -> State:
        return State(
            [dict(m) for m in self.spread], dict(self.existing_anti), dict(self.affinity), dict(self.anti)
        )


@dataclass
class Cycle:
    """One scheduling cycle's PreFilter results for `pod` (what kube-scheduler's preemption reuses)."""

    world: World
    pod: Pod
    filters: frozenset[str]
    ports: tuple[Port, ...]
    constraints: list[Constraint]
    affinity_skipped: bool
    state: State

    @staticmethod
    def of(world: World, pod: Pod, filters: frozenset[str]) -> Cycle:
        ports = pod.ports if NODE_PORTS in filters else ()
        constraints = _constraints(pod) if POD_TOPOLOGY_SPREAD in filters else []
        spread: list[dict[str, int]] = [{} for _ in constraints]
        for node in world.nodes.values():
            if any(c.key not in node.labels for c in constraints):
                continue  # nodeLabelsMatchSpreadConstraints
            for i, c in enumerate(constraints):
                if not c.includes(pod, node):
                    continue
                count = 0
                if not c.selector.empty():  # countPodsMatchSelector: terminating pods do not count
                    count = sum(
                        1
                        for p in node.pods
                        if not p.deleting and p.namespace == pod.namespace and c.selector.matches(p.labels)
                    )
                value = node.labels[c.key]
                spread[i][value] = spread[i].get(value, 0) + count
        existing: dict[Pair, int] = {}
        affinity: dict[Pair, int] = {}
        anti: dict[Pair, int] = {}
        skipped = True
        if INTER_POD_AFFINITY in filters:
            for node in world.nodes.values():
                for p in node.pods:  # terminating pods count here
                    for t in p.anti_terms:
                        if t.matches(pod):
                            _bump(existing, node, t.key, 1)
                    if pod.affinity_terms and all(t.matches(p) for t in pod.affinity_terms):
                        for t in pod.affinity_terms:
                            _bump(affinity, node, t.key, 1)
                    for t in pod.anti_terms:
                        if t.matches(p):
                            _bump(anti, node, t.key, 1)
            skipped = not existing and not pod.affinity_terms and not pod.anti_terms
        return Cycle(
            world, pod, filters, ports, constraints, skipped, State(spread, existing, affinity, anti)
        )

    def update(self, state: State, p: Pod, node: Node, delta: int) -> None:
        """AddPod (+1) and RemovePod (-1) of every PreFilter extension, for `p` on `node`."""
        pod = self.pod
        if (
            self.constraints
            and p.namespace == pod.namespace
            and all(c.key in node.labels for c in self.constraints)
        ):
            for i, c in enumerate(self.constraints):
                # No check of a deletionTimestamp here, unlike PreFilter's count.
                if c.selector.matches(p.labels) and c.includes(pod, node):
                    value = node.labels[c.key]
                    state.spread[i][value] = state.spread[i].get(value, 0) + delta
        if not self.affinity_skipped:
            for t in p.anti_terms:
                if t.matches(pod):
                    _bump(state.existing_anti, node, t.key, delta)
            if pod.affinity_terms and all(t.matches(p) for t in pod.affinity_terms):
                for t in pod.affinity_terms:
                    _bump(state.affinity, node, t.key, delta)
            for t in pod.anti_terms:
                if t.matches(p):
                    _bump(state.anti, node, t.key, delta)

    def status(self, state: State, node: Node, present: Sequence[Pod], used: set[Port]) -> str:
        """RunFilterPlugins in the default profile's order; the first failure's code."""
        pod = self.pod
        code = _node_static(pod, node)
        if code is not None:
            return code
        if any(port_conflict(used, want) for want in self.ports):
            return UNSCHEDULABLE_CODE
        code = _resources_status(pod, node, present)
        if code is not None:
            return code
        for i, c in enumerate(self.constraints):
            if c.key not in node.labels:
                return UNRESOLVABLE
            counts = state.spread[i]
            # criticalPaths[0] is the least count (each clone changes one domain only).
            least = min(counts.values()) if counts else 2**31 - 1
            if len(counts) < c.min_domains:
                least = 0
            skew = counts.get(node.labels[c.key], 0) + (1 if c.selector.matches(pod.labels) else 0) - least
            if skew > c.max_skew:
                return UNSCHEDULABLE_CODE
        if not self.affinity_skipped:
            if not self._affinity(state, node):
                return UNRESOLVABLE
            if state.anti and any(
                state.anti.get((t.key, node.labels[t.key]), 0) > 0
                for t in pod.anti_terms
                if t.key in node.labels
            ):
                return UNSCHEDULABLE_CODE
            if state.existing_anti and any(
                state.existing_anti.get(pair, 0) > 0 for pair in node.labels.items()
            ):
                return UNSCHEDULABLE_CODE
        return SUCCESS

    def _affinity(self, state: State, node: Node) -> bool:
        """satisfyPodAffinity."""
        terms = self.pod.affinity_terms
        exist = True
        for t in terms:
            if t.key not in node.labels:
                return False
            if state.affinity.get((t.key, node.labels[t.key]), 0) <= 0:
                exist = False
        if exist:
            return True
        # The first of a group that has affinity to itself.
        return not state.affinity and bool(terms) and all(t.matches(self.pod) for t in terms)

    def with_nominated(
        self, state: State, node: Node, present: Sequence[Pod], used: set[Port], nominated: Sequence[Pod]
    ) -> str:
        """RunFilterPluginsWithNominatedPods: with the nominated pods added, then (when they were and
        that passed) without them."""
        if nominated:
            added = state.clone()
            ports = set(used)
            for p in nominated:
                self.update(added, p, node, 1)
                ports.update(p.ports)
            code = self.status(added, node, [*present, *nominated], ports)
            if code != SUCCESS:
                return code
        return self.status(state, node, present, used)


def _used_ports(pods: Iterable[Pod]) -> set[Port]:
    used: set[Port] = set()
    for p in pods:
        used.update(p.ports)
    return used


def _nominated(world: World, node: str, pod: Pod, departures: frozenset[str]) -> list[Pod]:
    """RunFilterPluginsWithNominatedPods: pods nominated here, at least as important, not this one."""
    out = []
    for p in world.pods:
        if p.node or p.nominated != node or p.uid == pod.uid or p.priority < pod.priority:
            continue
        if p.scheduler not in world.schedulers and "nominations-of-every-scheduler" not in departures:
            continue  # the scheduler's nominator holds only the pods of its profiles
        out.append(p)
    return out


# ---- preemption toleration --------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    minimum: int
    seconds: int


def _go_int(text: str, bits: int) -> int | None:
    """strconv.ParseInt(text, 10, bits); None on an error (bad syntax or out of range)."""
    if not _GO_DECIMAL.fullmatch(text):
        return None
    out = int(text)
    return out if -(1 << (bits - 1)) <= out < 1 << (bits - 1) else None


def _go_duration(seconds: int) -> int:
    """time.Duration(seconds) * time.Second in nanoseconds: an int64 product, which wraps past
    about 292 years (9223372036 s) as Go's multiplication does."""
    out = (seconds * NANOS) & (2**64 - 1)
    return out - 2**64 if out >= 2**63 else out


def _nanos(epoch: float) -> int:
    """Epoch seconds (whole, or to the microsecond) as integer nanoseconds."""
    return round(epoch * 1_000_000) * 1000


def _policy(pc: Mapping[str, Any], departures: frozenset[str]) -> Policy | None:
    """parsePreemptionTolerationPolicy; None when it does not parse (then nothing is exempt).

    The minimum is ParseInt(s, 10, 32), the seconds ParseInt(s, 10, 64), on the annotation's
    text as it is: preemptctl reads them the same way (no switch). The default minimum is
    `pc.Value + 1` in int32, which no PriorityClass the API server admits (at most 2000001000)
    overflows.
    """
    annotations = (pc.get("metadata") or {}).get("annotations") or {}

    def read(name: str) -> str | None:
        if TOLERATION_PREFIX + name in annotations:
            return str(annotations[TOLERATION_PREFIX + name])
        if "toleration-annotation-alias" in departures and TOLERATION_ALIAS + name in annotations:
            return str(annotations[TOLERATION_ALIAS + name])
        return None

    minimum, seconds = read("minimum-preemptable-priority"), read("toleration-seconds")
    if "toleration-in-every-profile" in departures and minimum is None and seconds is None:
        return None  # preemptctl: a class without annotations has no policy at all
    value = int(pc.get("value") or 0)
    min_value = value + 1 if minimum is None else _go_int(minimum, 32)
    sec_value = 0 if seconds is None else _go_int(seconds, 64)
    if min_value is None or sec_value is None:
        return None
    return Policy(min_value, sec_value)


def exempt(world: World, victim: Pod, preemptor: Pod, now: float, departures: frozenset[str]) -> bool:
    """ExemptedFromPreemption.

    A PodScheduled=True condition without lastTransitionTime reads as Go's zero time (long
    past every window). The window is `scheduledAt.Add(time.Duration(seconds) * time.Second)`,
    a product that wraps in int64 nanoseconds (`_go_duration`) under either switch position:
    no documented departure says otherwise. 0 seconds are no special case: a scheduled time
    ahead of now (a skewed clock) protects until then.
    """
    if not victim.klass:
        return False
    pc = world.classes.get(victim.klass)
    if pc is None:
        return False
    policy = _policy(pc, departures)
    if policy is None or preemptor.priority >= policy.minimum:
        return False
    if policy.seconds < 0:
        return True
    scheduled = victim.condition("PodScheduled")
    if scheduled is None or scheduled.get("status") != "True":
        return True
    at = _time(scheduled.get("lastTransitionTime"))
    until = (GO_ZERO_S * NANOS if at is None else _nanos(at)) + _go_duration(policy.seconds)
    if "toleration-boundary-inclusive" in departures:
        return _nanos(now) <= until  # preemptctl: still protected at the window's last instant
    return until > _nanos(now)  # upstream: scheduledAt.Add(d).After(now)


# ---- victims on one node ----------------------------------------------------------------


def _selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector(...).Matches, with Empty() (and nil) matching nothing."""
    if selector is None:
        return False
    match_labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not match_labels and not exprs:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    return all(_match_expression(labels, e, labels.get(e["key"])) for e in exprs)


def _pdb_flags(world: World, pods: Sequence[Pod]) -> list[bool]:
    """filterPodsWithPDBViolation over `pods` in order: which exceed a budget."""
    allowed = [int((pdb.get("status") or {}).get("disruptionsAllowed") or 0) for pdb in world.pdbs]
    out = []
    for pod in pods:
        violated = False
        if pod.labels:
            for i, pdb in enumerate(world.pdbs):
                if pdb["metadata"]["namespace"] != pod.namespace:
                    continue
                if not _selector_matches((pdb.get("spec") or {}).get("selector"), pod.labels):
                    continue
                if pod.name in ((pdb.get("status") or {}).get("disruptedPods") or {}):
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        out.append(violated)
    return out


def _start(pod: Pod, now: float) -> float:
    # GetPodStartTime: a pod that has not started counts as starting now (later than any start).
    return now if pod.start is None else pod.start


def _importance(pod: Pod, now: float, departures: frozenset[str]) -> tuple[Any, ...]:
    if "qos-class-in-importance" in departures:
        return (-pod.priority, -pod.qos, _start(pod, now), pod.uid)
    return (-pod.priority, _start(pod, now))


def _orders(pods: list[Pod], now: float, departures: frozenset[str]) -> list[list[Pod]]:
    """MoreImportantPod order; every order of pods it finds equal (sort.Slice is not stable)."""
    ordered = sorted(pods, key=lambda p: _importance(p, now, departures))
    groups = [list(g) for _, g in itertools.groupby(ordered, key=lambda p: _importance(p, now, departures))]
    count = 1
    for g in groups:
        for k in range(2, len(g) + 1):
            count *= k
    if count > MAX_ORDERS:
        raise TooTied(f"{count} orders of equally important pods")
    return [
        [p for perm in choice for p in perm]
        for choice in itertools.product(*(itertools.permutations(g) for g in groups))
    ]


@dataclass(frozen=True)
class Candidate:
    node: str
    victims: tuple[Pod, ...]  # the candidate's Pods list, most important first
    violations: int

    def key(self, now: float) -> tuple[int, ...]:
        prios = [v.priority for v in self.victims]
        highest = prios[0]  # upstream reads the first victim
        earliest = min(_start(v, now) for v in self.victims if v.priority == highest)
        return (self.violations, highest, sum(p + SHIFT for p in prios), len(prios), -int(earliest * 1e6))


def select_victims(
    cycle: Cycle, node: Node, *, profile: str, now: float, departures: frozenset[str]
) -> list[Candidate]:
    """SelectVictimsOnNode, once per order of equally important pods: the node's possible candidates.
    Each works on its own copy of the cycle state and of the node's used ports, as upstream's
    DryRunPreemption clones both per node."""
    world, pod = cycle.world, cycle.pod
    nominated = _nominated(world, node.name, pod, departures)
    state = cycle.state.clone()
    used = _used_ports(node.pods)
    potential = []
    for p in node.pods:
        if p.priority >= pod.priority:
            continue
        toleration = profile == TOLERATION or "toleration-in-every-profile" in departures
        if toleration and exempt(world, p, pod, now, departures):
            continue
        potential.append(p)
        used.difference_update(p.ports)  # NodeInfo.RemovePod: HostPortInfo is a set
        cycle.update(state, p, node, -1)
    if not potential:
        return []
    kept = [p for p in node.pods if p not in potential]
    if cycle.with_nominated(state, node, kept, used, nominated) != SUCCESS:
        return []
    out = []
    for order in _orders(potential, now, departures):
        flags = _pdb_flags(world, order)
        violating = [p for p, v in zip(order, flags, strict=True) if v]
        non_violating = [p for p, v in zip(order, flags, strict=True) if not v]
        present = list(kept)
        trial = state.clone()
        ports = set(used)
        victims: list[Pod] = []
        violations = 0
        for group, counts in ((violating, True), (non_violating, False)):
            for p in group:
                present.append(p)
                ports.update(p.ports)
                cycle.update(trial, p, node, 1)
                if cycle.with_nominated(trial, node, present, ports, nominated) != SUCCESS:
                    present.remove(p)
                    ports.difference_update(p.ports)
                    cycle.update(trial, p, node, -1)
                    victims.append(p)
                    violations += counts
        if not victims:
            continue  # upstream: an error status for the node, not a candidate
        if violating and non_violating:
            victims.sort(key=lambda p: _importance(p, now, departures))
        if "pdb-violations-on-final-victims" in departures:
            ordered = sorted(victims, key=lambda p: _importance(p, now, departures))
            violations = _final_violations(world, ordered)
        out.append(Candidate(node.name, tuple(victims), violations))
    return out


def _final_violations(world: World, victims: Sequence[Pod]) -> int:
    """preemptctl: each budget spent by the final victims it matches, most important first."""
    return sum(_pdb_flags(world, victims))


# ---- the decision -----------------------------------------------------------------------


def _waits(
    world: World, pod: Pod, statuses: Mapping[str, str], *, profile: str, departures: frozenset[str]
) -> bool:
    """Not PodEligibleToPreemptOthers because of a terminating pod on the nominated node (whose
    status in the scheduling cycle was not UnschedulableAndUnresolvable)."""
    node = world.nodes.get(pod.nominated) if pod.nominated else None
    if node is None or statuses[node.name] == UNRESOLVABLE:
        return False
    plugin_rule = profile == TOLERATION and "toleration-waits-only-for-preemptions" not in departures
    for p in node.pods:
        if p.priority >= pod.priority or not p.deleting:
            continue
        if plugin_rule:
            return True
        target = p.condition("DisruptionTarget")
        if (
            target is not None
            and target.get("status") == "True"
            and target.get("reason") == PREEMPTION_BY_SCHEDULER
        ):
            return True
    return False


def decide(
    objects: Sequence[dict[str, Any]],
    preemptor: dict[str, Any],
    *,
    profile: str,
    schedulers: Iterable[str],
    now: float,
    departures: frozenset[str],
    filters: frozenset[str] = FILTERS,
) -> Answer:
    """What the scheduler does with `preemptor` (a pending pod among `objects`) at `now`; `filters`
    leaves out some of NodePorts, InterPodAffinity and PodTopologySpread (to see which decide)."""
    world = World.of(objects, schedulers, departures)
    pod = next(p for p in world.pods if p.uid == preemptor["metadata"]["uid"])
    cycle = Cycle.of(world, pod, filters)
    statuses = {
        node.name: cycle.with_nominated(
            cycle.state,
            node,
            node.pods,
            _used_ports(node.pods),
            _nominated(world, node.name, pod, departures),
        )
        for node in world.nodes.values()
    }
    if SUCCESS in statuses.values():
        return Answer(FITS)
    if (pod.raw["spec"].get("preemptionPolicy") or "PreemptLowerPriority") == "Never":
        return Answer(UNSCHEDULABLE)
    if _waits(world, pod, statuses, profile=profile, departures=departures):
        return Answer(WAIT)
    candidates = []
    for name in sorted(world.nodes):
        if statuses[name] != UNSCHEDULABLE_CODE:
            continue  # nodesWherePreemptionMightHelp: only Unschedulable nodes
        node = world.nodes[name]
        candidates.extend(select_victims(cycle, node, profile=profile, now=now, departures=departures))
    if not candidates:
        return Answer(UNSCHEDULABLE)
    best = min(c.key(now) for c in candidates)
    tied = [c for c in candidates if c.key(now) == best]
    if departures == ALL:
        tied = [min(tied, key=lambda c: c.node)]  # preemptctl: the node name breaks the last tie
    return Answer(PREEMPT, frozenset((c.node, frozenset(v.key for v in c.victims)) for c in tied))
