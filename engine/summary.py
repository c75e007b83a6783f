"""Per-node summaries, and the lower bound on a node's ranking key they give without evaluating it.

A full evaluation of a node for a preemptor (victim selection, reprieve, PDB
walk) costs tens to hundreds of microseconds at 40 pods. Ranking 5,000 nodes that
way per decision is what made a real cluster's decisions take a second. Most
nodes never come close to winning, and a cheap lower bound on their ranking key
says so: nodes are then evaluated best bound first, and the search stops when no
unevaluated node's bound can beat the candidates already found (`engine.index`).

A `Summary` is built once per node state (its `NodeState.version`) and shared by
every preemptor shape: the node's pods most important first, and by ascending
priority level the cumulative requests, counts, largest single requests and
latest start. `bound` reads it for one preemptor:

- FITS and REJECTED are exact: the preemptor fits in the free capacity (counting
  nominated pods), or not even with every eligible pod gone. Eligibility is exact
  too: pods whose PriorityClass tolerates this preemptor at `now` are held back.
- For a candidate the bound is, with v the PDB violations, h the highest victim
  priority, s the shifted priority sum, c the count and e minus the earliest
  start among the highest-priority victims:
    v >= 0;
    h >= the lowest priority level whose pods, all removed, make room;
    with h at that level, c >= what the largest requests could cover, and 1 only
    if one pod at that level covers the whole shortfall alone;
    s >= h + 2^31 plus (c - 1) times the lowest priority + 2^31;
    e >= minus the latest start among the pods that could be that victim.
  Each component is a bound whenever the ones before it are equal, so the tuple
  is a lexicographic lower bound on the key `default.evaluate_node` computes
  (`(v, h, s, c, e)`), and with c before s on the `minimal` key.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from engine import resources, timeutil, toleration
from engine.cluster import Cluster, NodeState
from engine.objects import Pod
from engine.resources import Resources

PRIORITY_SHIFT = 2**31
# Figures within these fit a machine integer with room to add and multiply a few (`Summary.plain`):
# amounts (a node's summed requests too), priorities, and start instants (NEVER is 2^62).
PLAIN_LIMIT = 2**60
PLAIN_PRIORITY = 2**40
PLAIN_START = 2**62
FITS, CANDIDATE, REJECTED = 0, 1, 2


@dataclass(slots=True)
class Summary:
    version: int
    pods: list[Pod]  # the node's pods of this kind, most important first
    free: Resources  # allocatable minus every bound pod's requests (nominations not counted)
    levels: list[int] = field(default_factory=list)  # ascending distinct priorities
    cum: list[Resources] = field(default_factory=list)  # requests of pods at or below levels[i]
    cum_count: list[int] = field(default_factory=list)
    cum_max: list[Resources] = field(default_factory=list)  # largest single request at or below levels[i]
    latest_start: list[int] = field(default_factory=list)  # latest start among pods at exactly levels[i]
    at_level: list[list[Pod]] = field(default_factory=list)
    # The same cumulative sums and largest requests per resource, as arrays over the
    # levels: non-decreasing, so the first level freeing enough of r is a bisection.
    cum_by: dict[str, list[int]] = field(default_factory=dict)
    max_by: dict[str, list[int]] = field(default_factory=dict)
    # Pods whose class may tolerate a preemptor: (window end, pod, policy), the latest
    # window first and windows without an end (FOREVER) before all, so `withheld`
    # stops at the first window already closed.
    tolerant: list[tuple[int, Pod, toleration.Policy]] = field(default_factory=list)
    # The latest window end and the highest minimum-preemptable priority among them:
    # past the one, or at or above the other, no pod here tolerates anyone.
    tolerant_until: int = 0
    tolerant_below: int = 0
    # No request below zero or beyond PLAIN_LIMIT, no start beyond it: the cumulative arrays
    # are non-decreasing and every figure fits a machine integer (`engine.nodetable`).
    plain: bool = True


# A toleration window without an end sorts before every real instant in `tolerant`.
FOREVER = 2**63


def importance(pod: Pod) -> tuple[int, int, int, str]:
    """Most important first: priority, QoS class, earlier start, uid (pods carry their priority)."""
    return (-(pod.priority or 0), -pod.qos, pod.start, pod.uid)


def build(cluster: Cluster, state: NodeState, pods: list[Pod]) -> Summary:
    ordered = sorted(pods, key=importance)
    free = dict(state.node.allocatable)
    resources.sub(free, state.used)
    out = Summary(state.version, ordered, free)
    by_level: dict[int, list[Pod]] = {}
    policies: dict[str, toleration.Policy | None] = {}
    for pod in ordered:
        by_level.setdefault(pod.priority or 0, []).append(pod)
        klass = pod.priority_class
        if klass:
            if klass not in policies:
                policies[klass] = cluster.policy(klass)
            policy = policies[klass]
            # Every pod of a class with a policy: even 0 seconds protect a pod not scheduled yet,
            # or scheduled at a time still ahead of now (toleration.tolerates); `withheld` stops
            # at the first window already closed.
            if policy is not None:
                until = toleration.expires_at(policy, scheduled_at=pod.scheduled_at)
                out.tolerant.append((FOREVER if until is None else until, pod, policy))
    out.tolerant.sort(key=lambda t: (-t[0], t[1].uid))
    if out.tolerant:
        out.tolerant_until = out.tolerant[0][0]
        out.tolerant_below = max(t[2].minimum_preemptable_priority for t in out.tolerant)
    cum: Resources = {}
    biggest: Resources = {}
    count = 0
    plain = True
    for level in sorted(by_level):
        at = by_level[level]
        latest = -timeutil.NEVER
        for pod in at:
            for r, v in pod.requests.items():
                cum[r] = cum.get(r, 0) + v
                if v > biggest.get(r, 0):
                    biggest[r] = v
                if not 0 <= v < PLAIN_LIMIT:
                    plain = False
            if pod.start > latest:
                latest = pod.start
            if not -PLAIN_START <= pod.start <= PLAIN_START:
                plain = False
        count += len(at)
        out.levels.append(level)
        out.cum.append(dict(cum))
        out.cum_count.append(count)
        out.cum_max.append(dict(biggest))
        out.latest_start.append(latest)
        out.at_level.append(at)
    out.plain = (
        plain
        and all(v < PLAIN_LIMIT for v in cum.values())
        and all(-PLAIN_LIMIT < v < PLAIN_LIMIT for v in free.values())
        and (not out.levels or (out.levels[0] > -PLAIN_PRIORITY and out.levels[-1] < PLAIN_PRIORITY))
    )
    for r in cum:
        out.cum_by[r] = [c.get(r, 0) for c in out.cum]
        out.max_by[r] = [m.get(r, 0) for m in out.cum_max]
    return out


class Bound(NamedTuple):
    """One node's bound for one preemptor (a tuple: built for every node a ranking settles)."""

    tier: int  # FITS, CANDIDATE or REJECTED: exact
    value: tuple[int, ...]  # a candidate's lower bound on its ranking key
    reason: str  # a rejected node's reason
    expires: int | None  # a toleration window closes: look again after this instant


def withheld(summary: Summary, priority: int, now: int) -> tuple[list[Pod], int | None]:
    """Pods below `priority` tolerating a preemptor of that priority at `now`, and when that set changes."""
    out: list[Pod] = []
    expires: int | None = None
    for until, pod, policy in summary.tolerant:
        if until < now:
            break  # this window and every later one in the list closed already
        if (pod.priority or 0) >= priority or priority >= policy.minimum_preemptable_priority:
            continue
        out.append(pod)
        if until != FOREVER:
            expires = until if expires is None else min(expires, until)
    return out, expires


def bound(
    summary: Summary,
    free: Mapping[str, int],
    requests: Mapping[str, int],
    priority: int,
    now: int,
    *,
    minimal: bool,
) -> Bound:
    short: dict[str, int] = {}
    for r, v in requests.items():
        have = free.get(r, 0)
        if v > have:
            short[r] = v - have
    if not short:
        return FITS_BOUND
    levels = summary.levels
    below = bisect.bisect_left(levels, priority)  # levels[:below] hold the lower-priority pods
    if summary.tolerant and now <= summary.tolerant_until and priority < summary.tolerant_below:
        held, expires = withheld(summary, priority, now)
    else:
        held, expires = [], None
    first = -1
    if not held:
        # Each resource's cumulative array is non-decreasing: the first level that frees
        # enough of everything is the latest of the per-resource bisections.
        first = 0
        cum_by = summary.cum_by
        for r, need in short.items():
            arr = cum_by.get(r)
            i = below if arr is None else bisect.bisect_left(arr, need, 0, below)
            if i > first:
                first = i
                if first >= below:
                    break
        if first >= below:
            first = -1
    else:
        for i in range(below):
            freed = dict(summary.cum[i])
            for pod in held:
                if (pod.priority or 0) <= levels[i]:
                    resources.sub(freed, pod.requests)
            if all(freed.get(r, 0) >= need for r, need in short.items()):
                first = i
                break
    if first < 0:
        return _rejected(summary, free, requests, below, held, expires)
    highest = levels[first]
    count = 1
    max_by = summary.max_by
    for r, need in short.items():
        k = -(-need // max_by[r][first])
        if k > count:
            count = k
    latest = summary.latest_start[first]
    if count == 1:
        # One victim only if a pod at this level covers the whole shortfall alone.
        alone = None
        for p in summary.at_level[first]:
            req = p.requests
            for r, v in short.items():
                if req.get(r, 0) < v:
                    break
            else:
                if alone is None or p.start > alone:
                    alone = p.start
        if alone is None:
            count = 2
        else:
            latest = alone
    shifted = highest + PRIORITY_SHIFT + (count - 1) * (levels[0] + PRIORITY_SHIFT)
    value = (0, highest, count, shifted, -latest) if minimal else (0, highest, shifted, count, -latest)
    return Bound(CANDIDATE, value, "", expires)


FITS_BOUND = Bound(FITS, (), "fits without preemption", None)


def _rejected(
    summary: Summary,
    free: Mapping[str, int],
    requests: Mapping[str, int],
    below: int,
    held: list[Pod],
    expires: int | None,
) -> Bound:
    eligible = (summary.cum_count[below - 1] if below else 0) - len(held)
    room = dict(free)
    if below:
        resources.add(room, summary.cum[below - 1])
        for pod in held:
            resources.sub(room, pod.requests)
    missing = resources.shortfall(dict(requests), room)
    return Bound(
        REJECTED,
        (),
        f"does not fit even after removing all {eligible} eligible lower-priority pods "
        f"(short {', '.join(f'{k} {v}' for k, v in missing.items())})",
        expires,
    )


def refine(
    summary: Summary,
    free: Mapping[str, int],
    requests: Mapping[str, int],
    priority: int,
    now: int,
    value: tuple[int, ...],
    *,
    minimal: bool,
) -> tuple[int, ...]:
    """A tighter bound for a candidate whose coarse bound reached the top of a ranking.

    The coarse count divides the shortfall by the largest single request; here the
    largest requests are summed until they cover it, per resource, over the pods
    at or below the bound's priority level that do not tolerate the preemptor. Worth
    its sorting only for the few nodes about to be evaluated in full.
    """
    highest = value[1]
    first = bisect.bisect_left(summary.levels, highest)
    held, _ = withheld(summary, priority, now) if summary.tolerant else ([], None)
    skip = {p.uid for p in held}
    pool = [p for i in range(first + 1) for p in summary.at_level[i] if p.uid not in skip]
    count = value[2] if minimal else value[3]
    for r, v in requests.items():
        need = v - free.get(r, 0)
        if need <= 0:
            continue
        covered, k = 0, 0
        for amount in sorted((p.requests.get(r, 0) for p in pool), reverse=True):
            covered += amount
            k += 1
            if covered >= need:
                break
        count = max(count, k)
    prios = sorted(p.priority or 0 for p in pool)
    # One victim at the bound's level, the others as cheap as any pod here could be.
    shifted = highest + PRIORITY_SHIFT + sum(prios[: count - 1]) + (count - 1) * PRIORITY_SHIFT
    # The start term stands on its own: the coarse one may come from a lone pod that
    # covers the shortfall but tolerates the preemptor, true only while the count is 1.
    # The highest-priority victims are pool pods at this level; none started later.
    starts = [p.start for p in pool if (p.priority or 0) == highest]
    start = -max(starts) if starts else value[4]
    if minimal:
        return max(value, (value[0], highest, count, shifted, start))
    return max(value, (value[0], highest, shifted, count, start))


class Summaries:
    """Summaries by node and kind, rebuilt when the node's state version moves on."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._cache: dict[str, dict[str, Summary]] = {}
        self._free: dict[str, tuple[int, Resources]] = {}
        self._free_at: dict[str, tuple[int, dict[int, Resources]]] = {}

    def free(self, state: NodeState) -> Resources:
        """Allocatable minus what bound pods request, once per node state, for every preemptor shape.

        Shared: read it, never change it.
        """
        held = self._free.get(state.node.name)
        if held is not None and held[0] == state.version:
            return held[1]
        free = dict(state.node.allocatable)
        resources.sub(free, state.used)
        self._free[state.node.name] = (state.version, free)
        return free

    def free_at(self, state: NodeState, priority: int) -> Resources:
        """Free capacity for a preemptor of `priority`: nominated pods of at least that priority
        count as bound (`default.free_for` for a preemptor that is none of them), once per node
        state and priority for every preemptor shape. Shared: read it, never change it."""
        name = state.node.name
        nominated = self.cluster.nominated_on(name)
        if not nominated:
            return self.free(state)
        held = self._free_at.get(name)
        if held is None or held[0] != state.version:
            held = (state.version, {})
            self._free_at[name] = held
        free = held[1].get(priority)
        if free is None:
            free = dict(self.free(state))
            for pod in nominated.values():
                if self.cluster.priority(pod) >= priority:
                    resources.sub(free, pod.requests)
            held[1][priority] = free
        return free

    def get(self, kind: str, state: NodeState, keep: Callable[[Pod], bool] | None) -> Summary:
        kinds = self._cache.setdefault(state.node.name, {})
        held = kinds.get(kind)
        if held is not None and held.version == state.version:
            return held
        pods = list(state.pods.values()) if keep is None else [p for p in state.pods.values() if keep(p)]
        summary = build(self.cluster, state, pods)
        kinds[kind] = summary
        return summary

    def forget(self, name: str) -> None:
        """A node is gone: its summaries would only hold its pods in memory."""
        self._cache.pop(name, None)
        self._free.pop(name, None)
        self._free_at.pop(name, None)

    def __len__(self) -> int:
        return len(self._cache)
