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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine import placement
from engine.cluster import Cluster, NodeState
from engine.constraints import HostPort, PodTerm, Scheduling, Spread
from engine.objects import Node, Pod

UNSCHEDULABLE, UNRESOLVABLE = 1, 2
PORTS = "node(s) didn't have free ports for the requested pod ports"
SPREAD_KEY = "node(s) didn't match pod topology spread constraints (missing required label)"
SPREAD = "node(s) didn't match pod topology spread constraints"
AFFINITY = "node(s) didn't match pod affinity rules"
ANTI = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI = "node(s) didn't satisfy existing pods anti-affinity rules"

Pair = tuple[str, str]
Status = tuple[int, str]
NONE: tuple[Pod, ...] = ()


def _bump(counts: dict[Pair, int], pair: Pair, by: int) -> None:
    left = counts.get(pair, 0) + by
    if left:
        counts[pair] = left
    else:
        counts.pop(pair, None)  # upstream deletes a pair that is down to zero


@dataclass(slots=True)
class _SpreadState:
    constraint: Spread
    counts: dict[str, int]  # domain value -> matching pods, every eligible domain present
    lowest: list[tuple[int, str]]  # the two smallest (count, value), for the minimum without one domain


class Filters:
    """kube-scheduler's PreFilter state of the inter-pod filters for one preemptor."""

    def __init__(self, cluster: Cluster, pod: Pod) -> None:
        self.cluster = cluster
        self.pod = pod
        s: Scheduling | None = pod.scheduling
        self.ports: tuple[HostPort, ...] = s.ports if s is not None else ()
        self.affinity: tuple[PodTerm, ...] = s.affinity if s is not None else ()
        self.anti: tuple[PodTerm, ...] = s.anti_affinity if s is not None else ()
        spread: tuple[Spread, ...] = s.spread if s is not None else ()
        self.spread_keys = tuple(c.topology_key for c in spread)
        nodes = cluster.nodes
        # Existing pods' required anti-affinity terms that match the preemptor, by pair.
        self.existing: dict[Pair, int] = {}
        for uid in sorted(cluster.anti_affine):
            q = cluster.anti_affine[uid]
            state = nodes.get(q.node or "")
            if state is not None:
                for t in self._against_me(q):
                    value = state.node.labels.get(t.topology_key)
                    if value is not None:
                        _bump(self.existing, (t.topology_key, value), 1)
        self.affinity_counts: dict[Pair, int] = {}
        self.anti_counts: dict[Pair, int] = {}
        if self.affinity or self.anti:
            for q, node in self._bound(self._term_namespaces()):
                self._count_incoming(q, node, 1, self.affinity_counts, self.anti_counts)
        self.self_affine = all(t.matches(pod.namespace, pod.labels) for t in self.affinity)
        self.spread = [self._spread_state(c) for c in spread]
        self.active = bool(self.ports or self.affinity or self.anti or self.spread or self.existing)

    # ---- PreFilter ---------------------------------------------------------------------

    def _against_me(self, q: Pod) -> tuple[PodTerm, ...]:
        """Terms of `q`'s required anti-affinity that match the preemptor."""
        if q.scheduling is None or not q.scheduling.anti_affinity:
            return ()
        pod = self.pod
        return tuple(t for t in q.scheduling.anti_affinity if t.matches(pod.namespace, pod.labels))

    def _term_namespaces(self) -> list[str]:
        names: set[str] = set()
        for t in (*self.affinity, *self.anti):
            if t.namespace_selector is not None:
                return self.cluster.bound_namespaces()  # a selector may pick any namespace
            names |= t.namespaces
        return sorted(names)

    def _bound(self, namespaces: Iterable[str]) -> Iterable[tuple[Pod, Node]]:
        nodes = self.cluster.nodes
        for ns in namespaces:
            bound = self.cluster.bound_in(ns)
            for uid in sorted(bound):
                q = bound[uid]
                state = nodes.get(q.node or "")
                if state is not None:
                    yield q, state.node

    def _count_incoming(
        self, q: Pod, node: Node, by: int, affinity: dict[Pair, int], anti: dict[Pair, int]
    ) -> None:
        labels = node.labels
        if self.affinity and all(t.matches(q.namespace, q.labels) for t in self.affinity):
            for t in self.affinity:
                value = labels.get(t.topology_key)
                if value is not None:
                    _bump(affinity, (t.topology_key, value), by)
        for t in self.anti:
            if t.matches(q.namespace, q.labels):
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

    def _spread_state(self, c: Spread) -> _SpreadState:
        counts: dict[str, int] = {}
        eligible: dict[str, bool] = {}
        for name in sorted(self.cluster.nodes):
            node = self.cluster.nodes[name].node
            ok = self._eligible(c, node)
            eligible[name] = ok
            if ok:
                counts.setdefault(node.labels[c.topology_key], 0)
        if not c.counts_nothing:
            for q, node in self._bound([self.pod.namespace]):
                if eligible.get(node.name) and not q.deleting and c.matches(q.labels):
                    counts[node.labels[c.topology_key]] += 1
        return _SpreadState(c, counts, sorted((n, v) for v, n in counts.items())[:2])

    # ---- Filter ------------------------------------------------------------------------

    def ports_conflict(self, state: NodeState, minus: Mapping[str, Pod], plus: Sequence[Pod]) -> bool:
        if not self.ports:
            return False
        for q in (*(p for uid, p in state.pods.items() if uid not in minus), *plus):
            if q.scheduling is not None and q.scheduling.ports:
                for have in q.scheduling.ports:
                    for want in self.ports:
                        if want.conflicts(have):
                            return True
        return False

    def others(self, state: NodeState, minus: Mapping[str, Pod], plus: Sequence[Pod]) -> Status | None:
        """PodTopologySpread, then InterPodAffinity, on `state` less `minus` plus `plus`."""
        labels = state.node.labels
        moved = [(q, -1) for q in minus.values()] + [(q, 1) for q in plus]
        pod = self.pod
        for sp in self.spread:
            c = sp.constraint
            value = labels.get(c.topology_key)
            if value is None:
                return UNRESOLVABLE, SPREAD_KEY
            count = sp.counts.get(value, 0)
            if moved and self._eligible(c, state.node):
                # upstream's updateWithPod: no deletionTimestamp check, unlike the count
                count += sum(by for q, by in moved if q.namespace == pod.namespace and c.matches(q.labels))
            if len(sp.counts) < c.min_domains:
                low = 0
            else:
                low = next((n for n, v in sp.lowest if v != value), count)
                if value in sp.counts:
                    low = min(low, count)
            if count + (1 if c.matches(pod.labels) else 0) - low > c.max_skew:
                return UNSCHEDULABLE, SPREAD
        if self.affinity or self.anti:
            aff = self.affinity_counts
            anti = self.anti_counts
            if moved:
                aff, anti = dict(aff), dict(anti)
                for q, by in moved:
                    self._count_incoming(q, state.node, by, aff, anti)
            if self.affinity:
                exist = True
                for t in self.affinity:
                    value = labels.get(t.topology_key)
                    if value is None:
                        return UNRESOLVABLE, AFFINITY
                    if aff.get((t.topology_key, value), 0) <= 0:
                        exist = False
                if not exist and not (not aff and self.self_affine):
                    return UNRESOLVABLE, AFFINITY
            for t in self.anti:
                value = labels.get(t.topology_key)
                if value is not None and anti.get((t.topology_key, value), 0) > 0:
                    return UNSCHEDULABLE, ANTI
        existing = self.existing
        if moved:
            changed = [(q, by, self._against_me(q)) for q, by in moved]
            if any(terms for _, _, terms in changed):
                existing = dict(existing)
                for _, by, terms in changed:
                    for t in terms:
                        value = labels.get(t.topology_key)
                        if value is not None:
                            _bump(existing, (t.topology_key, value), by)
        if existing:
            for pair in existing.items():
                (key, value), n = pair
                if n > 0 and labels.get(key) == value:
                    return UNSCHEDULABLE, EXISTING_ANTI
        return None

    def blocked(self, state: NodeState, minus: Mapping[str, Pod], nominated: Sequence[Pod]) -> Status | None:
        """Why the preemptor cannot go to `state` less `minus` (resources aside), or None.

        Both passes of RunFilterPluginsWithNominatedPods: with the nominated pods
        added, then without them.
        """
        for plus in (nominated, NONE) if nominated else (NONE,):
            if self.ports_conflict(state, minus, plus):
                return UNSCHEDULABLE, PORTS
            why = self.others(state, minus, plus)
            if why is not None:
                return why
        return None

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
                or any(t.topology_key in labels and t.matches(q.namespace, q.labels) for t in self.anti)
                or any(t.topology_key in labels for t in self._against_me(q))
            ):
                out.append(q)
        return out

    def cycle_status(
        self,
        state: NodeState,
        resources_fit: bool,
        nominated: Sequence[Pod],
        minus: Mapping[str, Pod] | None = None,
    ) -> Status | None:
        """The scheduling cycle's first failing filter on this node, in upstream order
        (NodePorts, NodeResourcesFit, PodTopologySpread, InterPodAffinity); None: it fits."""
        minus = {} if minus is None else minus
        for plus in (nominated, NONE) if nominated else (NONE,):
            if self.ports_conflict(state, minus, plus):
                return UNSCHEDULABLE, PORTS
            if not resources_fit:
                return UNSCHEDULABLE, ""
            why = self.others(state, minus, plus)
            if why is not None:
                return why
        return None
