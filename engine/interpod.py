"""The filters that read other pods: NodePorts, PodTopologySpread, InterPodAffinity, inside preemption.

kube-scheduler v1.34 runs every Filter plugin inside preemption: for each node,
`SelectVictimsOnNode` removes the potential victims from the node (updating
each plugin's PreFilter state through `RemovePod`), runs the filters, and gives
pods back one at a time (`AddPod`), keeping each only if the filters still pass.
Pods nominated to the node with at least the preemptor's priority are added for
a first pass, and the filters must pass without them too.

`Filters` is that PreFilter state for one preemptor over one cluster: the
counts per topology domain, computed once per decision. `blocked(state, minus,
plus)` answers for one node with `minus` (pods of that node taken away) and
`plus` (nominated pods added), which is all preemption ever changes: evicting a
pod changes the counts of its own node's domains only.

Statuses follow upstream: a missing topology key for a spread constraint and an
unmet required pod affinity are UnschedulableAndUnresolvable in the scheduling
cycle (the node is no candidate when that is the first filter to fail there);
a host-port conflict, a spread skew, the preemptor's anti-affinity and an
existing pod's anti-affinity are Unschedulable (evicting pods on that node may
cure them). docs/semantics.md §1 states the rules and §10 the departures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine import placement
from engine.cluster import Cluster, NodeState
from engine.constraints import HostPort, PodTerm, Scheduling, Spread
from engine.objects import Node, Pod
from engine.selectors import LabelSelector

UNSCHEDULABLE, UNRESOLVABLE = 1, 2
PORTS = "node(s) didn't have free ports for the requested pod ports"
SPREAD_KEY = "node(s) didn't match pod topology spread constraints (missing required label)"
SPREAD = "node(s) didn't match pod topology spread constraints"
AFFINITY = "node(s) didn't match pod affinity rules"
ANTI = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI = "node(s) didn't satisfy existing pods anti-affinity rules"

NOT_MODELLED = "notModelled"  # the explanation key listing what was not evaluated

Pair = tuple[str, str]
Status = tuple[int, str]
NONE: tuple[Pod, ...] = ()


def _bump(counts: dict[Pair, int], pair: Pair, by: int) -> None:
    left = counts.get(pair, 0) + by
    if left:
        counts[pair] = left
    else:
        counts.pop(pair, None)  # upstream deletes a pair that is down to zero


@dataclass(frozen=True, slots=True)
class Overlay:
    """Pods a gang's plan assumes and takes away, for the job flow (engine.job): `placed`, the
    members placed before this one with their nodes (assumed there, as kube-scheduler assumes
    a pod it has placed), and `gone`, the uids of the victims chosen so far. `members` are the
    whole gang's uids: a member nominated by an earlier round counts where the plan places it,
    not where it was nominated."""

    placed: tuple[tuple[Pod, str], ...] = ()
    gone: frozenset[str] = frozenset()
    members: frozenset[str] = frozenset()

    def on(self, node: str) -> list[Pod]:
        return [q for q, where in self.placed if where == node]


@dataclass(slots=True)
class _SpreadState:
    constraint: Spread
    counts: dict[str, int]  # domain value -> matching pods, every eligible domain present
    lowest: list[tuple[int, str]]  # the two smallest (count, value), for the minimum without one domain
    movers: set[str]  # nodes hosting a pod whose eviction changes a count


def _narrowings(selectors: Sequence[LabelSelector | None]) -> list[tuple[str, tuple[str, ...]]] | None:
    """One (label key, values) per selector that can match anything, or None when some
    selector has none (`LabelSelector.narrowing`): every pod must then be read."""
    out = []
    for sel in selectors:
        if sel is None:
            continue  # a nil selector matches no pod
        narrow = sel.narrowing()
        if narrow is None:
            return None
        out.append(narrow)
    return out


def _narrowest(selectors: Iterable[LabelSelector | None]) -> LabelSelector | None:
    """Of terms that must all match, one whose selector narrows (a nil one matches nothing,
    so it narrows best); the first when none does."""
    listed = list(selectors)
    for sel in listed:
        if sel is None or sel.narrowing() is not None:
            return sel
    return listed[0]


class Filters:
    """kube-scheduler's PreFilter state of the inter-pod filters for one preemptor."""

    def __init__(
        self,
        cluster: Cluster,
        pod: Pod,
        overlay: Overlay | None = None,
        memo: dict[Any, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        self.pod = pod
        self.overlay = overlay
        # Shared by the Filters of one decision over one unchanging cluster (a gang's members):
        # what depends only on the nodes and the pod's node constraints is computed once.
        self._memo = memo if memo is not None else {}
        # Namespaces' labels, for the terms' namespace selectors (Cluster.namespace_labels).
        self._ns_labels: dict[str, Mapping[str, str]] = {}
        self.pod_ns_labels = self.ns_labels(pod.namespace)
        gone = overlay.gone if overlay is not None else frozenset()
        self._placed = frozenset(q.uid for q, _ in overlay.placed) if overlay is not None else frozenset()
        s: Scheduling | None = pod.scheduling
        self.ports: tuple[HostPort, ...] = s.ports if s is not None else ()
        self.affinity: tuple[PodTerm, ...] = s.affinity if s is not None else ()
        self.anti: tuple[PodTerm, ...] = s.anti_affinity if s is not None else ()
        spread: tuple[Spread, ...] = s.spread if s is not None else ()
        self.spread_keys = tuple(c.topology_key for c in spread)
        nodes = cluster.nodes
        # Existing pods' required anti-affinity terms that match the preemptor, by pair, and
        # the nodes hosting such pods (only evicting them can lift what they forbid).
        self.existing: dict[Pair, int] = {}
        self.existing_hosts: set[str] = set()
        for terms, group in cluster.anti_groups.items():
            matching = [t for t in terms if t.matches(pod.namespace, pod.labels, self.pod_ns_labels)]
            if not matching:
                continue
            for uid in sorted(group):
                if uid in gone:
                    continue
                state = nodes.get(group[uid].node or "")
                if state is not None:
                    self.existing_hosts.add(state.node.name)
                    for t in matching:
                        value = state.node.labels.get(t.topology_key)
                        if value is not None:
                            _bump(self.existing, (t.topology_key, value), 1)
        if overlay is not None:
            # Members placed before this one are assumed on their nodes: their anti-affinity
            # holds against it there (never evictable, so their nodes are no hosts).
            for q, where in overlay.placed:
                state = nodes.get(where)
                if state is not None:
                    for t in self._against_me(q):
                        value = state.node.labels.get(t.topology_key)
                        if value is not None:
                            _bump(self.existing, (t.topology_key, value), 1)
        self.affinity_counts: dict[Pair, int] = {}
        self.anti_counts: dict[Pair, int] = {}
        # Nodes hosting a pod that counts for the preemptor's affinity (evicting it may undo
        # it), and for its anti-affinity (only evicting those can lift it).
        self.affinity_hosts: set[str] = set()
        self.anti_hosts: set[str] = set()
        if self.affinity or self.anti:
            # A pod counts when it matches every affinity term or any anti-affinity term: one
            # affinity term's candidates and each anti-affinity term's hold all of them.
            wanted = [t.selector for t in self.anti]
            if self.affinity:
                wanted.append(_narrowest(t.selector for t in self.affinity))
            for q, node in self._bound(self._term_namespaces(), wanted):
                self._count_incoming(q, node, 1, self.affinity_counts, self.anti_counts)
                if self._assumed(q):
                    continue
                if self.affinity and all(
                    t.matches_incoming(q.namespace, q.labels, self.ns_labels(q.namespace))
                    for t in self.affinity
                ):
                    self.affinity_hosts.add(node.name)
                if any(
                    t.matches_incoming(q.namespace, q.labels, self.ns_labels(q.namespace)) for t in self.anti
                ):
                    self.anti_hosts.add(node.name)
        self.self_affine = all(
            t.matches_incoming(pod.namespace, pod.labels, self.pod_ns_labels) for t in self.affinity
        )
        self.spread = [self._spread_state(c) for c in spread]
        self.active = bool(self.ports or self.affinity or self.anti or self.spread or self.existing)
        # InterPodAffinity's PreFilter says Skip when no existing pod's anti-affinity matches
        # the preemptor and it has no terms of its own: its AddPod and Filter never run, so a
        # nominated pod's anti-affinity is not read either.
        self.interpod = bool(self.affinity or self.anti or self.existing)
        self._touched: frozenset[str] | None = None

    # ---- PreFilter ---------------------------------------------------------------------

    def ns_labels(self, namespace: str) -> Mapping[str, str]:
        """The labels a namespace selector matches for `namespace`, looked up once per decision."""
        held = self._ns_labels.get(namespace)
        if held is None:
            held = self._ns_labels[namespace] = self.cluster.namespace_labels(namespace)
        return held

    def _against_me(self, q: Pod) -> tuple[PodTerm, ...]:
        """Terms of `q`'s required anti-affinity that match the preemptor."""
        if q.scheduling is None or not q.scheduling.anti_affinity:
            return ()
        pod = self.pod
        return tuple(
            t for t in q.scheduling.anti_affinity if t.matches(pod.namespace, pod.labels, self.pod_ns_labels)
        )

    def _term_namespaces(self) -> list[str]:
        names: set[str] = set()
        for t in (*self.affinity, *self.anti):
            if t.namespace_selector is not None:
                # A selector may pick any namespace, the placed members' too (the overlay's
                # members are pending, so their namespace may have no bound pod yet).
                every = set(self.cluster.bound_namespaces())
                if self.overlay is not None:
                    every.update(q.namespace for q, _ in self.overlay.placed)
                return sorted(every)
            names |= t.namespaces
        return sorted(names)

    def _bound(
        self, namespaces: Iterable[str], selectors: Sequence[LabelSelector | None] | None = None
    ) -> Iterable[tuple[Pod, Node]]:
        """Bound pods of `namespaces` with their nodes, as the overlay (if any) changes them.

        With `selectors`, only the pods one of them can match are needed: those are read
        from the cluster's label index when every selector narrows to one label (a nil
        selector matches nothing); otherwise every pod of the namespaces is listed."""
        nodes = self.cluster.nodes
        overlay = self.overlay
        names = list(namespaces)
        narrow = _narrowings(selectors) if selectors is not None else None
        for ns in names:
            if narrow is None:
                bound: Mapping[str, Pod] = self.cluster.bound_in(ns)
            else:
                bound = {}
                for key, values in narrow:
                    bound.update(self.cluster.bound_labelled(ns, key, values))
            for uid in sorted(bound):
                q = bound[uid]
                if overlay is not None and uid in overlay.gone:
                    continue
                state = nodes.get(q.node or "")
                if state is not None:
                    yield q, state.node
        if overlay is not None:
            wanted = set(names)
            for q, where in overlay.placed:
                state = nodes.get(where)
                if state is not None and q.namespace in wanted:
                    yield q, state.node

    def _assumed(self, q: Pod) -> bool:
        """Is `q` a member the overlay placed (counted, but never evicted)?"""
        return q.uid in self._placed

    def _count_incoming(
        self, q: Pod, node: Node, by: int, affinity: dict[Pair, int], anti: dict[Pair, int]
    ) -> None:
        labels = node.labels
        if self.affinity and all(
            t.matches_incoming(q.namespace, q.labels, self.ns_labels(q.namespace)) for t in self.affinity
        ):
            for t in self.affinity:
                value = labels.get(t.topology_key)
                if value is not None:
                    _bump(affinity, (t.topology_key, value), by)
        for t in self.anti:
            if t.matches_incoming(q.namespace, q.labels, self.ns_labels(q.namespace)):
                value = labels.get(t.topology_key)
                if value is not None:
                    _bump(anti, (t.topology_key, value), by)

    def _eligible(self, c: Spread, node: Node) -> bool:
        """Does `node` count for constraint `c` (its inclusion policies)?"""
        if any(k not in node.labels for k in self.spread_keys):
            return False
        if c.honor_affinity and not placement.selects(node, self.pod):
            return False
        return not (c.honor_taints and placement.untolerated_taint(node, self.pod) is not None)

    def _domains(self, c: Spread) -> tuple[dict[str, bool], dict[str, int]]:
        """Which nodes count for `c`, and its eligible domains (each at 0): a function of the
        nodes and the pod's node constraints alone, kept in the memo."""
        pod = self.pod
        key = ("spread", c, self.spread_keys, pod.node_selector, pod.required_affinity, pod.tolerations)
        held = self._memo.get(key)
        if held is None:
            counts: dict[str, int] = {}
            eligible: dict[str, bool] = {}
            # In the index's order, not sorted: only lookups and `lowest` (sorted) read the counts.
            for name, state in self.cluster.nodes.items():
                node = state.node
                ok = self._eligible(c, node)
                eligible[name] = ok
                if ok:
                    counts.setdefault(node.labels[c.topology_key], 0)
            held = self._memo[key] = (eligible, counts)
        return held[0], dict(held[1])

    def _spread_state(self, c: Spread) -> _SpreadState:
        eligible, counts = self._domains(c)
        movers: set[str] = set()
        for q, node in self._bound([self.pod.namespace], [c.selector]):
            if eligible.get(node.name) and c.matches(q.labels):
                # Evicting it lowers its domain's count (terminating too: upstream's update).
                # A member the overlay placed is never evicted.
                if not self._assumed(q):
                    movers.add(node.name)
                if not q.deleting and not c.counts_nothing:
                    counts[node.labels[c.topology_key]] += 1
        return _SpreadState(c, counts, sorted((n, v) for v, n in counts.items())[:2], movers)

    def hopeless(self, state: NodeState) -> str | None:
        """Why no eviction on this node can make a filter pass here, checked without
        evaluating it: a spread skew, an anti-affinity or an existing pod's anti-affinity
        that fails with every pod present, and no pod of this node counts for it. The
        pods elsewhere in the domain stay whatever is evicted here."""
        labels, name, pod_labels = state.node.labels, state.node.name, self.pod.labels
        for sp in self.spread:
            c = sp.constraint
            value = labels.get(c.topology_key)
            if value is None or name in sp.movers:
                continue
            count = sp.counts.get(value, 0)
            low = 0 if len(sp.counts) < c.min_domains or not sp.lowest else sp.lowest[0][0]
            if count + (1 if c.matches(pod_labels) else 0) - low > c.max_skew:
                return SPREAD
        if name not in self.anti_hosts:
            for t in self.anti:
                value = labels.get(t.topology_key)
                if value is not None and self.anti_counts.get((t.topology_key, value), 0) > 0:
                    return ANTI
        if self.existing and name not in self.existing_hosts:
            for (key, value), n in self.existing.items():
                if n > 0 and labels.get(key) == value:
                    return EXISTING_ANTI
        return None

    def reads(self, name: str) -> tuple[Any, ...]:
        """All an evaluation of node `name` reads of this state beyond the node's own pods and
        the preemptor itself (`view`, `hopeless`, `status`): the counts of the node's own
        domains and pairs, each spread's domain count and minimum, and whether the node hosts
        a pod that counts. Two states that read alike here evaluate the node alike; the job
        flow keys its kept evaluations on it as members are placed elsewhere."""
        labels = self.cluster.nodes[name].node.labels
        spread = tuple(
            (
                sp.counts.get(labels.get(sp.constraint.topology_key, ""), -1),
                tuple(sp.lowest),
                len(sp.counts),
                name in sp.movers,
            )
            for sp in self.spread
        )
        own_affinity = [
            (t.topology_key, labels[t.topology_key]) for t in self.affinity if t.topology_key in labels
        ]
        affinity = tuple(self.affinity_counts.get(p, 0) for p in own_affinity)
        elsewhere = any(p not in own_affinity for p in self.affinity_counts)
        anti = tuple(
            self.anti_counts.get((t.topology_key, labels[t.topology_key]), 0)
            for t in self.anti
            if t.topology_key in labels
        )
        existing = tuple(sorted((p, n) for p, n in self.existing.items() if labels.get(p[0]) == p[1]))
        hosts = (name in self.affinity_hosts, name in self.anti_hosts, name in self.existing_hosts)
        if self._touched is None:
            self._touched = self._find_touched()
        return (spread, affinity, elsewhere, anti, existing, hosts, self.interpod, name in self._touched)

    def touched(self) -> set[str]:
        """`_touched`, computed once per decision (the state is the cluster as it is now)."""
        if self._touched is None:
            self._touched = self._find_touched()
        return set(self._touched)

    def _find_touched(self) -> frozenset[str]:
        """The nodes where these filters can change an evaluation; on every other node every
        filter passes whatever is evicted there (and nothing is nominated there), so the
        node's evaluation is the one that reads resources alone (`index.Index.scan`).

        A filter that passes with all pods present keeps passing as pods of that node leave:
        ports and anti-affinity counts only fall, and a spread skew only falls or meets the
        minimum. Only affinity can be undone, by evicting the pods that satisfy it: their nodes
        are in the set. So are nodes nominated pods are promised to, whose counts they add to.
        """
        cluster = self.cluster
        nodes = cluster.nodes
        # Only nodes that exist: a pod can name a node that is gone or not seen yet (an
        # orphan, a nomination to a scaled-down node), which no evaluation reads.
        out: set[str] = {name for name in cluster.nominated_nodes if name in nodes}
        if self.overlay is not None:
            # Where the plan placed members or took victims, the node is not as the index has it.
            out.update(where for _, where in self.overlay.placed if where in nodes)
            for uid in self.overlay.gone:
                held = cluster.pods.get(uid)
                if held is not None and held.node in nodes:
                    out.add(held.node)
        for want in self.ports:
            for q in cluster.host_ports.get(want.port, {}).values():
                ports = q.scheduling.ports if q.scheduling is not None else ()
                if q.node in nodes and any(want.conflicts(have) for have in ports):
                    out.add(q.node)
        out |= self.affinity_hosts
        if not (self.spread or self.affinity or self.anti or self.existing):
            return frozenset(out)
        anti = [
            (t.topology_key, {v for (k, v), n in self.anti_counts.items() if n > 0 and k == t.topology_key})
            for t in self.anti
        ]
        anti = [(k, values) for k, values in anti if values]
        existing: dict[str, set[str]] = {}
        for (key, value), n in self.existing.items():
            if n > 0:
                existing.setdefault(key, set()).add(value)
        affinity_keys = tuple(t.topology_key for t in self.affinity)
        # No pod anywhere counts and the preemptor matches its own terms: upstream lets it
        # through on any node that has every topology key.
        affinity = self.affinity if not (not self.affinity_counts and self.self_affine) else ()
        pod_labels = self.pod.labels
        spread = [
            (
                sp.constraint.topology_key,
                sp.counts,
                sp.constraint.max_skew
                + (0 if len(sp.counts) < sp.constraint.min_domains or not sp.lowest else sp.lowest[0][0])
                - (1 if sp.constraint.matches(pod_labels) else 0),
            )
            for sp in self.spread
        ]
        # By domain, not by node: the cluster's node label index names the nodes of a domain.
        every = frozenset(nodes)
        empty: frozenset[str] = frozenset()

        def having(key: str) -> frozenset[str]:
            return empty.union(*cluster.nodes_labelled(key).values())

        for key, values in (*anti, *existing.items()):
            by_value = cluster.nodes_labelled(key)
            for value in values:
                out |= by_value.get(value, empty)
        for key in {*affinity_keys, *(key for key, _, _ in spread)}:
            out |= every - having(key)  # the key missing: affinity and spread fail there
        for t in affinity:
            by_value = cluster.nodes_labelled(t.topology_key)
            for value, names in by_value.items():
                if self.affinity_counts.get((t.topology_key, value), 0) <= 0:
                    out |= names
        for key, counts, most in spread:
            for value, names in cluster.nodes_labelled(key).items():
                if counts.get(value, 0) > most:
                    out |= names
        return frozenset(out)

    # ---- Filter ------------------------------------------------------------------------

    def view(self, state: NodeState, nominated: Sequence[Pod] = NONE) -> NodeView:
        """`state` as preemption changes it, with the counts kept as pods leave and come back."""
        return NodeView(self, state, nominated)

    def blockers(self, state: NodeState, minus: Mapping[str, Pod]) -> list[Pod]:
        """Pods of this node that hold a port the preemptor wants, match its anti-affinity, or
        whose anti-affinity matches it: what must leave before those filters can pass here."""
        labels = state.node.labels
        out = []
        for uid in sorted(state.pods):
            q = state.pods[uid]
            if uid in minus:
                continue
            ports = q.scheduling.ports if q.scheduling is not None else ()
            if (
                any(w.conflicts(h) for w in self.ports for h in ports)
                or any(
                    t.topology_key in labels
                    and t.matches_incoming(q.namespace, q.labels, self.ns_labels(q.namespace))
                    for t in self.anti
                )
                or any(t.topology_key in labels for t in self._against_me(q))
            ):
                out.append(q)
        return out


@dataclass(slots=True)
class _Part:
    """One pod's part in the counts at one node (upstream's updateWithPod, per plugin)."""

    ports: tuple[HostPort, ...]
    spread: tuple[int, ...]  # per constraint: 1 where the pod counts for it here
    affinity: tuple[Pair, ...]
    anti: tuple[Pair, ...]
    existing: tuple[Pair, ...]


class NodeView:
    """One node with pods taken away (`remove`) and given back (`add`), and the filters' verdict
    on it (`status`): each change costs one pod's part, not a recount."""

    def __init__(self, filters: Filters, state: NodeState, nominated: Sequence[Pod]) -> None:
        self.f = filters
        self.state = state
        node = state.node
        self.labels = labels = node.labels
        self.eligible = tuple(filters._eligible(sp.constraint, node) for sp in filters.spread)
        self._parts: dict[str, _Part] = {}
        overlay = filters.overlay
        if overlay is not None:
            # The job flow hands its own view of the node (only its eligible victims listed):
            # ports are read from every pod the plan leaves there, and the gang's own members
            # count where the plan places them, not where an earlier round nominated them.
            real = filters.cluster.nodes.get(node.name, state)
            held: list[Pod] = [q for q in real.pods.values() if q.uid not in overlay.gone]
            held.extend(overlay.on(node.name))
            nominated = [q for q in nominated if q.uid not in overlay.members]
        else:
            held = list(state.pods.values())
        # The node's used ports as kube-scheduler keeps them, a set (HostPortInfo): removing
        # any holder frees the port, adding one takes it, whoever else holds it.
        self.ports: dict[HostPort, int] = {}
        if filters.ports:
            for q in held:
                if q.scheduling is not None:
                    for port in q.scheduling.ports:
                        self.ports[port] = 1
        self.spread = [0] * len(filters.spread)
        self.affinity: dict[Pair, int] = {}
        self.anti: dict[Pair, int] = {}
        self.existing: dict[Pair, int] = {}
        # This node's pairs, and whether any other pair holds an affinity count (upstream's
        # "no pod in the cluster matches" exception looks at the whole map).
        self.own_affinity = {
            (t.topology_key, labels[t.topology_key]) for t in filters.affinity if t.topology_key in labels
        }
        self.affinity_elsewhere = any(p not in self.own_affinity for p in filters.affinity_counts)
        self.existing_here = [p for p in filters.existing if labels.get(p[0]) == p[1]]
        self.nominated = [self.part(q) for q in nominated]

    def part(self, q: Pod) -> _Part:
        held = self._parts.get(q.uid)
        if held is not None:
            return held
        f, labels, pod = self.f, self.labels, self.f.pod
        sched = q.scheduling
        affinity: tuple[Pair, ...] = ()
        if f.affinity and all(
            t.matches_incoming(q.namespace, q.labels, f.ns_labels(q.namespace)) for t in f.affinity
        ):
            affinity = tuple(
                (t.topology_key, labels[t.topology_key]) for t in f.affinity if t.topology_key in labels
            )
        made = _Part(
            sched.ports if sched is not None and f.ports else (),
            tuple(
                1 if ok and q.namespace == pod.namespace and sp.constraint.matches(q.labels) else 0
                for sp, ok in zip(f.spread, self.eligible, strict=True)
            ),
            affinity,
            tuple(
                (t.topology_key, labels[t.topology_key])
                for t in f.anti
                if t.topology_key in labels
                and t.matches_incoming(q.namespace, q.labels, f.ns_labels(q.namespace))
            ),
            tuple(
                (t.topology_key, labels[t.topology_key]) for t in f._against_me(q) if t.topology_key in labels
            ),
        )
        self._parts[q.uid] = made
        return made

    def _apply(self, part: _Part, by: int) -> None:
        for port in part.ports:
            self.ports[port] = 1 if by > 0 else 0
        for i, n in enumerate(part.spread):
            if n:
                self.spread[i] += by
        for pair in part.affinity:
            self.affinity[pair] = self.affinity.get(pair, 0) + by
        for pair in part.anti:
            self.anti[pair] = self.anti.get(pair, 0) + by
        for pair in part.existing:
            self.existing[pair] = self.existing.get(pair, 0) + by

    def remove(self, q: Pod) -> None:
        self._apply(self.part(q), -1)

    def add(self, q: Pod) -> None:
        self._apply(self.part(q), 1)

    def status(self, resources_fit: bool) -> Status | None:
        """The first failing filter, in upstream order (NodePorts, NodeResourcesFit,
        PodTopologySpread, InterPodAffinity), over both passes of
        RunFilterPluginsWithNominatedPods (with the nominated pods, then without); None: all pass.
        `resources_fit` is NodeResourcesFit's verdict (of the first pass)."""
        if not self.nominated:
            return self._check(resources_fit)
        with self._with_nominated():
            why = self._check(resources_fit)
        return why if why is not None else self._check(True)

    def ports_blocked(self) -> bool:
        """NodePorts alone, first pass (with the nominated pods)."""
        with self._with_nominated():
            return self._ports_blocked()

    @contextlib.contextmanager
    def _with_nominated(self) -> Iterator[None]:
        """The first pass: the nominated pods added to a copy (upstream clones the node and
        the state), so taking them away again cannot free a port another pod holds."""
        ports = dict(self.ports)
        for part in self.nominated:
            self._apply(part, 1)
        try:
            yield
        finally:
            for part in self.nominated:
                self._apply(part, -1)
            self.ports = ports

    def _ports_blocked(self) -> bool:
        for want in self.f.ports:
            for have, n in self.ports.items():
                if n > 0 and want.conflicts(have):
                    return True
        return False

    def _check(self, resources_fit: bool) -> Status | None:
        f, labels = self.f, self.labels
        if f.ports and self._ports_blocked():
            return UNSCHEDULABLE, PORTS
        if not resources_fit:
            return UNSCHEDULABLE, ""
        pod_labels = f.pod.labels
        for i, sp in enumerate(f.spread):
            c = sp.constraint
            value = labels.get(c.topology_key)
            if value is None:
                return UNRESOLVABLE, SPREAD_KEY
            count = sp.counts.get(value, 0) + self.spread[i]
            if len(sp.counts) < c.min_domains:
                low = 0
            else:
                low = next((n for n, v in sp.lowest if v != value), count)
                if value in sp.counts:
                    low = min(low, count)
            if count + (1 if c.matches(pod_labels) else 0) - low > c.max_skew:
                return UNSCHEDULABLE, SPREAD
        if f.affinity:
            base, delta = f.affinity_counts, self.affinity
            exist = True
            for t in f.affinity:
                value = labels.get(t.topology_key)
                if value is None:
                    return UNRESOLVABLE, AFFINITY
                pair = (t.topology_key, value)
                if base.get(pair, 0) + delta.get(pair, 0) <= 0:
                    exist = False
            if not exist:
                empty = not self.affinity_elsewhere and all(
                    base.get(p, 0) + delta.get(p, 0) == 0 for p in self.own_affinity
                )
                if not (empty and f.self_affine):
                    return UNRESOLVABLE, AFFINITY
        if f.anti:
            base, delta = f.anti_counts, self.anti
            for t in f.anti:
                value = labels.get(t.topology_key)
                if value is not None:
                    pair = (t.topology_key, value)
                    if base.get(pair, 0) + delta.get(pair, 0) > 0:
                        return UNSCHEDULABLE, ANTI
        if not f.interpod:
            return None
        base, delta = f.existing, self.existing
        for pair in self.existing_here:
            if base[pair] + delta.get(pair, 0) > 0:
                return UNSCHEDULABLE, EXISTING_ANTI
        for pair, n in delta.items():
            if n > 0 and pair not in base and labels.get(pair[0]) == pair[1]:
                return UNSCHEDULABLE, EXISTING_ANTI
        return None


def concerns(q: Pod, pod: Pod, cluster: Cluster) -> bool:
    """Can `q`'s presence change a filter's verdict for `pod`: a port they both want, a term of
    `pod`'s (anti-)affinity or spread that counts `q`, or `q`'s anti-affinity against `pod`?
    When not, taking `q` away or giving it back leaves every filter of `pod` as it was."""
    mine, theirs = pod.scheduling, q.scheduling
    labels_of = cluster.namespace_labels
    if mine is not None:
        if theirs is not None and any(w.conflicts(h) for w in mine.ports for h in theirs.ports):
            return True
        if any(
            t.matches_incoming(q.namespace, q.labels, labels_of(q.namespace))
            for t in (*mine.affinity, *mine.anti_affinity)
        ):
            return True
        if q.namespace == pod.namespace and any(c.matches(q.labels) for c in mine.spread):
            return True
    return theirs is not None and any(
        t.matches(pod.namespace, pod.labels, labels_of(pod.namespace)) for t in theirs.anti_affinity
    )


def not_modelled(pods: Sequence[Pod]) -> list[str]:
    """What of these pods' requirements preemptctl does not evaluate (volumes, resource
    claims), as "<pod>: <requirement> (<filters>)"; such a preemptor is answered
    `unschedulable` with this list, never placed nor preempted for."""
    return [f"{p.key}: {u}" for p in pods if p.scheduling is not None for u in p.scheduling.unmodelled]


def not_modelled_reason(missing: Sequence[str]) -> str:
    return (
        f"not modelled: {missing[0]}: preemptctl does not evaluate that filter, so it neither "
        "places nor evicts for this pod (docs/semantics.md §10)"
    )
