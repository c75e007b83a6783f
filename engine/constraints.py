"""What a pod asks of the pods around it: host ports, required pod (anti-)affinity, topology spread.

Parsed once per pod spec (engine.objects memoises it with the rest of the spec)
into immutable records. The filters that read them are in `engine.interpod`;
docs/semantics.md §1 states the rules.

Parsing follows kube-scheduler v1.34 (pkg/scheduler/framework/types.go,
plugins/podtopologyspread/common.go, pkg/scheduler/util GetHostPorts):
- host ports come from containers and from restartable (sidecar) init
  containers, only where `hostPort` > 0; an empty protocol is TCP and an empty
  hostIP is 0.0.0.0;
- an affinity term with neither `namespaces` nor `namespaceSelector` is the
  pod's own namespace; a nil `labelSelector` matches nothing, an empty one
  everything; a `namespaceSelector` matches the namespace's labels (the
  Namespace object's, `engine.cluster.Cluster.namespace_labels`);
- `matchLabelKeys`/`mismatchLabelKeys` add `key In/NotIn (the pod's value)` to
  the term's selector, as the API server does when it admits the pod (adding a
  requirement it already merged changes nothing);
- only `whenUnsatisfiable: DoNotSchedule` spread constraints filter;
  `minDomains` defaults to 1, `nodeAffinityPolicy` to Honor and
  `nodeTaintsPolicy` to Ignore.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidObject
from engine.selectors import LabelSelector, Requirement

# Every namespace carries this label with its own name (Kubernetes sets it at admission):
# the one label known of a namespace whose Namespace object was not seen (docs/semantics.md §1).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
ANY_IP = "0.0.0.0"
PROTOCOLS = ("TCP", "UDP", "SCTP")


@dataclass(frozen=True, slots=True)
class HostPort:
    protocol: str
    ip: str
    port: int

    def conflicts(self, other: HostPort) -> bool:
        """kube-scheduler's HostPortInfo.CheckConflict: same protocol and port, and either
        address is 0.0.0.0 or both are the same address."""
        if self.port != other.port or self.protocol != other.protocol:
            return False
        return self.ip == ANY_IP or other.ip == ANY_IP or self.ip == other.ip


@dataclass(frozen=True, slots=True)
class PodTerm:
    """One required pod (anti-)affinity term."""

    selector: LabelSelector | None  # None: a nil selector, which matches no pod
    namespaces: frozenset[str]
    # namespaceSelector: None when absent; an empty selector means every namespace.
    namespace_selector: LabelSelector | None
    topology_key: str
    # Neither namespaces nor namespaceSelector: the pod's own namespace, filled in by
    # `Scheduling.resolve` (specs are parsed once for every namespace that shares them).
    own_namespace: bool = False

    def matches(self, namespace: str, labels: Mapping[str, str], namespace_labels: Mapping[str, str]) -> bool:
        """Does a pod of `namespace` with `labels` match, `namespace_labels` that namespace's
        labels? (An existing pod's term against the preemptor: upstream matches the namespace
        selector with the labels of the preemptor's namespace, GetNamespaceLabelsSnapshot.)"""
        if self.selector is None:
            return False
        if namespace not in self.namespaces:
            ns = self.namespace_selector
            if ns is None or not (ns.empty or ns.matches(namespace_labels)):
                return False
        return self.selector.matches(labels)

    def matches_incoming(
        self, namespace: str, labels: Mapping[str, str], namespace_labels: Mapping[str, str]
    ) -> bool:
        """`matches` for the preemptor's own terms, as kube-scheduler evaluates them: the
        namespaces its selector picks (those whose labels it matches) are added to the term's,
        and the selector itself is then still matched against no labels at all
        (mergeAffinityTermNamespacesIfNotEmpty takes the term by value, so its reset of the
        selector is lost), so a selector that an empty label set satisfies (`NotIn`,
        `DoesNotExist`, `{}`) admits every namespace."""
        if self.selector is None:
            return False
        if namespace not in self.namespaces:
            ns = self.namespace_selector
            if ns is None or not (ns.matches({}) or ns.matches(namespace_labels)):
                return False
        return self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class Spread:
    """One `DoNotSchedule` topology spread constraint."""

    max_skew: int
    topology_key: str
    selector: LabelSelector | None  # None: a nil selector, which matches no pod
    min_domains: int
    honor_affinity: bool  # nodeAffinityPolicy Honor (the default)
    honor_taints: bool  # nodeTaintsPolicy Honor (default Ignore)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.selector is not None and self.selector.matches(labels)

    @property
    def counts_nothing(self) -> bool:
        """Upstream's countPodsMatchSelector counts no pod for a selector without requirements
        (while the filter's self-match and the preemption's removals do match it)."""
        return self.selector is None or self.selector.empty


@dataclass(frozen=True, slots=True)
class Scheduling:
    ports: tuple[HostPort, ...]
    affinity: tuple[PodTerm, ...]
    anti_affinity: tuple[PodTerm, ...]
    spread: tuple[Spread, ...]
    # (term kind, index, match keys, mismatch keys) still to merge with the pod's labels.
    label_keys: tuple[tuple[str, int, tuple[str, ...], tuple[str, ...]], ...] = ()
    resolved: bool = False
    # What kube-scheduler filters on that preemptctl does not model (`UNMODELLED_VOLUMES`,
    # resource claims), each as "<what> (<the filter plugins that read it>)".
    unmodelled: tuple[str, ...] = ()

    def resolve(self, namespace: str, labels: Mapping[str, str]) -> Scheduling:
        """The terms of a pod in `namespace` with these labels: own-namespace terms named,
        `matchLabelKeys`/`mismatchLabelKeys` merged."""
        if self.resolved:
            return self
        own = frozenset({namespace})
        affinity = [
            PodTerm(t.selector, own, t.namespace_selector, t.topology_key) if t.own_namespace else t
            for t in self.affinity
        ]
        anti = [
            PodTerm(t.selector, own, t.namespace_selector, t.topology_key) if t.own_namespace else t
            for t in self.anti_affinity
        ]
        spread = list(self.spread)
        for kind, i, match, mismatch in self.label_keys:
            extra = tuple(Requirement(k, "In", (labels[k],)) for k in match if k in labels) + tuple(
                Requirement(k, "NotIn", (labels[k],)) for k in mismatch if k in labels
            )
            if not extra:
                continue
            if kind == "spread":
                c = spread[i]
                if c.selector is not None:
                    spread[i] = Spread(
                        c.max_skew,
                        c.topology_key,
                        _merged(c.selector, extra),
                        c.min_domains,
                        c.honor_affinity,
                        c.honor_taints,
                    )
            else:
                terms = affinity if kind == "affinity" else anti
                t = terms[i]
                if t.selector is not None:
                    terms[i] = PodTerm(
                        _merged(t.selector, extra), t.namespaces, t.namespace_selector, t.topology_key
                    )
        return Scheduling(
            self.ports, tuple(affinity), tuple(anti), tuple(spread), resolved=True, unmodelled=self.unmodelled
        )


def _merged(selector: LabelSelector, extra: tuple[Requirement, ...]) -> LabelSelector:
    new = tuple(r for r in extra if r not in selector.expressions)
    return LabelSelector(selector.match_labels, selector.expressions + new) if new else selector


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidObject(f"{where} must be a list")
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidObject(f"{where} must be a mapping")
    return value


def _keys(value: Any, where: str) -> tuple[str, ...]:
    items = _list(value, where)
    if not all(isinstance(k, str) for k in items):
        raise InvalidObject(f"{where} must be a list of strings")
    return tuple(items)


def _whole(value: Any, where: str, *, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise InvalidObject(f"{where} must be an integer from {low} to {high}")
    return value


def _ports(spec: Mapping[str, Any], where: str) -> tuple[HostPort, ...]:
    out: list[HostPort] = []
    containers = [
        c
        for c in _list(spec.get("initContainers"), f"{where} initContainers")
        if isinstance(c, dict) and c.get("restartPolicy") == "Always"
    ] + [c for c in _list(spec.get("containers"), f"{where} containers") if isinstance(c, dict)]
    for c in containers:
        for p in _list(c.get("ports"), f"{where} container ports"):
            if not isinstance(p, dict):
                raise InvalidObject(f"{where} container port must be a mapping")
            host = p.get("hostPort")
            if host is None:
                continue
            port = _whole(host, f"{where} hostPort", low=0, high=65535)
            if port == 0:
                continue  # no host port: upstream's GetHostPorts keeps only hostPort > 0
            protocol = p.get("protocol") or "TCP"
            if protocol not in PROTOCOLS:
                raise InvalidObject(
                    f"{where} port protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
                )
            ip = p.get("hostIP") or ANY_IP
            try:
                ipaddress.ip_address(ip)
            except (TypeError, ValueError):
                raise InvalidObject(f"{where} hostIP must be an IP address, got {ip!r}") from None
            out.append(HostPort(protocol, ip, port))
    return tuple(out)


def _term(raw: Any, where: str) -> tuple[PodTerm, tuple[str, ...], tuple[str, ...]]:
    term = _mapping(raw, where)
    key = term.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise InvalidObject(f"{where} needs a topologyKey")
    names = _keys(term.get("namespaces"), f"{where} namespaces")
    ns_raw = term.get("namespaceSelector")
    ns_selector = LabelSelector.parse(ns_raw, where=f"{where} namespaceSelector")
    own = not names and ns_raw is None
    selector = LabelSelector.parse(term.get("labelSelector"), where=f"{where} labelSelector")
    match = _keys(term.get("matchLabelKeys"), f"{where} matchLabelKeys")
    mismatch = _keys(term.get("mismatchLabelKeys"), f"{where} mismatchLabelKeys")
    return PodTerm(selector, frozenset(names), ns_selector, key, own), match, mismatch


def _policy(value: Any, default: str, where: str) -> bool:
    value = default if value is None else value
    if value not in ("Honor", "Ignore"):
        raise InvalidObject(f"{where} must be Honor or Ignore")
    return bool(value == "Honor")


# Volume sources whose filters preemptctl does not evaluate, with those filters: a claim
# (VolumeBinding and VolumeZone read its PersistentVolume's node affinity and zone,
# NodeVolumeLimits counts it against the node's CSI attach limit, VolumeRestrictions its
# ReadWriteOncePod access), and the inline disks VolumeRestrictions checks for conflicts.
UNMODELLED_VOLUMES = {
    "persistentVolumeClaim": "VolumeBinding, VolumeZone, NodeVolumeLimits, VolumeRestrictions",
    "ephemeral": "VolumeBinding, VolumeZone, NodeVolumeLimits",
    "csi": "NodeVolumeLimits",
    "gcePersistentDisk": "VolumeRestrictions",
    "awsElasticBlockStore": "VolumeRestrictions",
    "rbd": "VolumeRestrictions",
    "iscsi": "VolumeRestrictions",
}


def _unmodelled(spec: Mapping[str, Any], where: str) -> tuple[str, ...]:
    out = []
    for volume in _list(spec.get("volumes"), f"{where} volumes"):
        if isinstance(volume, dict):
            for source, plugins in UNMODELLED_VOLUMES.items():
                if source in volume:
                    claim = volume[source].get("claimName") if isinstance(volume[source], dict) else None
                    what = f"{source} volume" + (f" of claim {claim}" if isinstance(claim, str) else "")
                    out.append(f"{what} ({plugins})")
    for claim in _list(spec.get("resourceClaims"), f"{where} resourceClaims"):
        name = claim.get("name") if isinstance(claim, dict) else None
        out.append(f"resource claim {name if isinstance(name, str) else ''}".rstrip() + " (DynamicResources)")
    return tuple(out)


def parse(spec: Mapping[str, Any], where: str) -> Scheduling | None:
    """The pod's inter-pod requirements, or None when it has none (most pods).

    Not yet `resolve`d: the same spec serves pods of every namespace and label set.
    """
    affinity = spec.get("affinity")
    spread_raw = spec.get("topologySpreadConstraints")
    ports = _ports(spec, where)
    unmodelled = _unmodelled(spec, where) if spec.get("volumes") or spec.get("resourceClaims") else ()
    if (
        not ports
        and not unmodelled
        and not spread_raw
        and not (
            isinstance(affinity, dict) and (affinity.get("podAffinity") or affinity.get("podAntiAffinity"))
        )
    ):
        return None
    label_keys: list[tuple[str, int, tuple[str, ...], tuple[str, ...]]] = []
    kinds: dict[str, tuple[PodTerm, ...]] = {}
    aff = _mapping(affinity, f"{where} affinity")
    for kind, field_name in (("affinity", "podAffinity"), ("anti", "podAntiAffinity")):
        block = _mapping(aff.get(field_name), f"{where} {field_name}")
        terms = []
        raw_terms = _list(
            block.get("requiredDuringSchedulingIgnoredDuringExecution"), f"{where} {field_name}"
        )
        for i, raw in enumerate(raw_terms):
            term, match, mismatch = _term(raw, f"{where} {field_name} term {i}")
            terms.append(term)
            if match or mismatch:
                label_keys.append((kind, i, match, mismatch))
        kinds[kind] = tuple(terms)
    spread: list[Spread] = []
    for raw in _list(spread_raw, f"{where} topologySpreadConstraints"):
        c = _mapping(raw, f"{where} topologySpreadConstraint")
        when = c.get("whenUnsatisfiable")
        if when not in ("DoNotSchedule", "ScheduleAnyway"):
            raise InvalidObject(
                f"{where} whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway, got {when!r}"
            )
        if when == "ScheduleAnyway":
            continue  # only scores
        key = c.get("topologyKey")
        if not isinstance(key, str) or not key:
            raise InvalidObject(f"{where} topologySpreadConstraint needs a topologyKey")
        min_domains = c.get("minDomains")
        constraint = Spread(
            _whole(c.get("maxSkew"), f"{where} maxSkew", low=1, high=2**31 - 1),
            key,
            LabelSelector.parse(
                c.get("labelSelector"), where=f"{where} topologySpreadConstraint labelSelector"
            ),
            1 if min_domains is None else _whole(min_domains, f"{where} minDomains", low=1, high=2**31 - 1),
            _policy(c.get("nodeAffinityPolicy"), "Honor", f"{where} nodeAffinityPolicy"),
            _policy(c.get("nodeTaintsPolicy"), "Ignore", f"{where} nodeTaintsPolicy"),
        )
        match = _keys(c.get("matchLabelKeys"), f"{where} matchLabelKeys")
        if match:
            label_keys.append(("spread", len(spread), match, ()))
        spread.append(constraint)
    if not (ports or kinds["affinity"] or kinds["anti"] or spread or unmodelled):
        return None
    return Scheduling(
        ports, kinds["affinity"], kinds["anti"], tuple(spread), tuple(label_keys), unmodelled=unmodelled
    )
