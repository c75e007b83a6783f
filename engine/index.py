"""Incremental per-preemptor node rankings: how a decision evaluates every node cheaply.

Evaluating a node for a preemptor (engine.default.evaluate_node) depends only on
that node's state, the cluster-wide epoch (classes, PDBs, quotas), the
preemptor's scheduling signature (priority, requests, tolerations, selectors,
affinity, victim-selection mode) and, through toleration windows, on "now"
until a known instant. So the index keeps, per signature, every node's result
in sorted containers: nodes that fit, candidates ranked by the upstream key, and
rejected nodes with their reasons. A change to a node (a pod bound, deleted,
nominated) is replayed from the cluster's touch log into every live ranking:
one node re-evaluated and O(log n) container updates. A decision then reads the
best node off the top instead of walking 5,000 nodes.

The answer is exactly that of evaluating every node afresh (property-tested
against engine.reference); only the work differs. The first decision for a new
signature pays one full evaluation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from engine import default, minimal
from engine.cluster import Cluster
from engine.default import CANDIDATE, FITS, REJECTED, NodeEval, Preemptor

# Live rankings kept at once (one per distinct preemptor signature); the least
# recently used is dropped past this, bounding memory with many pod shapes.
MAX_RANKINGS = 64
# Touch-log entries kept before the log is trimmed to what every ranking has read.
TOUCH_LOG_TRIM = 50_000
EXPLAIN_CANDIDATES = default.EXPLAIN_CANDIDATES
EXPLAIN_REJECTED = default.EXPLAIN_REJECTED

# No Kubernetes uid is empty, so this pod excludes no nomination.
ANONYMOUS = ""

NodeEvaluator = Callable[[Cluster, Any, Preemptor, int], NodeEval]


def signature(pre: Preemptor, mode: str) -> Hashable:
    pod = pre.pod
    return (
        mode,
        pre.priority,
        tuple(sorted(pre.requests.items())),
        pod.tolerations,
        pod.node_selector,
        pod.required_affinity,
    )


@dataclass(slots=True)
class Ranking:
    """Every node's evaluation for one preemptor signature."""

    evaluate: NodeEvaluator
    pre: Preemptor
    epoch: int
    position: int  # touch-log position this ranking reflects
    now: int
    evals: dict[str, NodeEval] = field(default_factory=dict)
    ranked: SortedList[tuple[Any, ...]] = field(
        default_factory=SortedList
    )  # (0, name) fits; (1, key, name) candidates
    rejected: SortedList[str] = field(default_factory=SortedList)  # names
    reasons: dict[str, int] = field(default_factory=dict)
    expiring: SortedList[tuple[int, str]] = field(default_factory=SortedList)  # (expires, name)

    def _entry(self, ev: NodeEval) -> tuple[Any, ...]:
        return (0, ev.node) if ev.status == FITS else (1, ev.key, ev.node)

    def drop(self, name: str) -> None:
        ev = self.evals.pop(name, None)
        if ev is None:
            return
        if ev.status == REJECTED:
            self.rejected.remove(name)
            left = self.reasons[ev.reason] - 1
            if left:
                self.reasons[ev.reason] = left
            else:
                del self.reasons[ev.reason]
        else:
            self.ranked.remove(self._entry(ev))
        if ev.expires is not None:
            self.expiring.remove((ev.expires, name))

    def put(self, ev: NodeEval) -> None:
        self.evals[ev.node] = ev
        if ev.status == REJECTED:
            self.rejected.add(ev.node)
            self.reasons[ev.reason] = self.reasons.get(ev.reason, 0) + 1
        else:
            self.ranked.add(self._entry(ev))
        if ev.expires is not None:
            self.expiring.add((ev.expires, ev.node))

    def refresh(self, cluster: Cluster, name: str, now: int) -> None:
        self.drop(name)
        state = cluster.nodes.get(name)
        if state is not None:
            self.put(self.evaluate(cluster, state, self.pre, now))


@dataclass(frozen=True, slots=True)
class Scan:
    """What a default-flow decision needs from evaluating every node."""

    fitting: str | None  # a node where the preemptor fits now (its nominated node first)
    best: NodeEval | None  # the best-ranked candidate
    explanation: dict[str, Any]


class Index:
    """Rankings over one Cluster; call `scan` for each decision."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._rankings: dict[Hashable, Ranking] = {}

    def _evaluator(self, mode: str) -> NodeEvaluator:
        return minimal.evaluate_node if mode == "minimal" else default.evaluate_node

    def ranking(self, pre: Preemptor, now: int, mode: str) -> Ranking:
        cluster = self.cluster
        sig = signature(pre, mode)
        # Rankings are shared by every pod of a signature, so they are computed for
        # an anonymous pod: no real pod's own nomination is excluded from its node.
        pre = Preemptor(dataclasses.replace(pre.pod, uid=ANONYMOUS), pre.priority, pre.requests)
        r = self._rankings.pop(sig, None)
        if r is not None and (r.epoch != cluster.epoch or now < r.now):
            r = None  # cluster-wide inputs changed, or time went backwards: start over
        changed = None if r is None else cluster.touched_since(r.position)
        if r is None or changed is None:
            r = Ranking(self._evaluator(mode), pre, cluster.epoch, cluster.touched_end, now)
            for name in cluster.nodes:
                r.put(r.evaluate(cluster, cluster.nodes[name], pre, now))
        else:
            r.pre = pre
            for name in dict.fromkeys(changed):  # each touched node once, in first-touch order
                r.refresh(cluster, name, now)
            while r.expiring and r.expiring[0][0] < now:
                r.refresh(cluster, r.expiring[0][1], now)
            r.position = cluster.touched_end
            r.now = now
        self._rankings[sig] = r  # most recently used last
        while len(self._rankings) > MAX_RANKINGS:
            del self._rankings[next(iter(self._rankings))]
        if len(cluster.touched) > TOUCH_LOG_TRIM:
            cluster.trim_touched(min(x.position for x in self._rankings.values()))
        return r

    def scan(self, pre: Preemptor, now: int, mode: str) -> Scan:
        r = self.ranking(pre, now, mode)
        own: NodeEval | None = None
        nominated = pre.pod.nominated
        if nominated is not None and nominated in self.cluster.nodes:
            # The preemptor's own nomination is excluded from its node's promised
            # capacity, which the shared ranking (keyed by signature) cannot know.
            own = r.evaluate(self.cluster, self.cluster.nodes[nominated], pre, now)
        fitting = None
        if own is not None and own.status == FITS:
            fitting = own.node
        elif r.ranked and r.ranked[0][0] == 0:
            fitting = r.ranked[0][1]
            if own is not None and fitting == own.node:
                fitting = next((e[1] for e in r.ranked if e[0] == 0 and e[1] != own.node), None)
        top = self._top(r, own)
        best = top[0] if top else None
        return Scan(fitting, best, self._explain(r, own, top))

    def _top(self, r: Ranking, own: NodeEval | None) -> list[NodeEval]:
        """The best EXPLAIN_CANDIDATES candidates, with the preemptor's own node re-ranked."""
        out: list[NodeEval] = []
        for entry in r.ranked.irange((1,)):
            ev = r.evals[entry[-1]]
            if own is not None and ev.node == own.node:
                continue
            out.append(ev)
            if len(out) > EXPLAIN_CANDIDATES:
                break
        if own is not None and own.status == CANDIDATE:
            out.append(own)
        out.sort(key=lambda e: (e.key, e.node))
        return out[:EXPLAIN_CANDIDATES]

    def _explain(self, r: Ranking, own: NodeEval | None, top: list[NodeEval]) -> dict[str, Any]:
        rejected_names = list(r.rejected.islice(0, EXPLAIN_REJECTED + 1))
        reasons = dict(r.reasons)
        rejected_count = len(r.rejected)
        candidate_count = len(r.ranked) - r.ranked.bisect_left((1,))
        if own is not None:
            # Swap the shared view of the nominated node for its own evaluation.
            shared = r.evals.get(own.node)
            if shared is not None:
                if shared.status == REJECTED:
                    rejected_count -= 1
                    reasons[shared.reason] -= 1
                    if own.node in rejected_names:
                        rejected_names.remove(own.node)
                elif shared.status == CANDIDATE:
                    candidate_count -= 1
            if own.status == REJECTED:
                rejected_count += 1
                reasons[own.reason] = reasons.get(own.reason, 0) + 1
                rejected_names = sorted({*rejected_names, own.node})
            elif own.status == CANDIDATE:
                candidate_count += 1
        rows = []
        for name in rejected_names[:EXPLAIN_REJECTED]:
            ev = own if own is not None and own.node == name else r.evals[name]
            rows.append({"node": name, "reason": ev.reason})
        return {
            "flow": "default",
            "candidates": [default.criteria(e, self.cluster) for e in top],
            "candidateCount": candidate_count,
            "rejected": rows,
            "rejectedCount": rejected_count,
            "rejectedReasons": {k: v for k, v in sorted(reasons.items()) if v > 0},
        }
