"""`victimSelection: minimal`: the least disruptive victim set per node, exactly.

Same eligibility as the default flow (lower priority, not tolerating, the node
passes its filters), but instead of the greedy reprieve the victim set on each
node minimises, lexicographically, (PDB violations, highest victim priority,
victim count, sum of shifted priorities); ties on those are broken as the
default flow breaks them, by the latest start among the highest-priority
victims (evict the pods that lose the least work), and nodes are ranked by the
same key, then by name (docs/semantics.md §7).

The search works on kinds of pods, not pods: pods of one priority that free the
same amounts of what the preemptor is short of (capped at the shortfall: a pod
freeing more than is missing is as good as one freeing exactly that) and spend
the same PDB budget are interchangeable for every term but the start time, and
of a kind the latest-started are the ones to take. A filled node of 100 pods
has a few dozen kinds at most. Pods whose budgets overlap (a pod spending two
budgets, and every pod sharing a budget with one) stay one kind each, so their
violations are counted exactly on the chosen pods.

A depth-first branch and bound then chooses how many pods of each kind, kinds
in ascending priority, with a lower bound on the whole key at every step: the
violations so far (they only grow), plus one when the budgets left cannot
cover the shortfall; the least priority level whose kinds can still cover it;
the fewest further pods that cover it from kinds up to that level (the largest
first, per resource); the cheapest priorities for them; and the start term while
the highest priority stays. A set that still covers after dropping a pod is
never better than without it, so no kind is taken beyond what the shortfall
needs. It starts from the greedy kubernetes answer and keeps it on ties, so it
is never worse on this key. The search stops after MAX_STATES steps and keeps the
best set found (docs/semantics.md §7 names the nodes that reach it).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine import default, disruption, timeutil
from engine.cluster import Cluster, NodeState
from engine.default import CANDIDATE, FITS, PRIORITY_SHIFT, REJECTED, NodeEval, Preemptor
from engine.objects import Pod

# Search steps per node before the best set found so far is returned (it is still never
# worse than greedy); bounds the cost of adversarial nodes (docs/semantics.md §7).
MAX_STATES = 200_000


def disruption_key(cluster: Cluster, victims: Sequence[Pod]) -> tuple[int, int, int, int, int]:
    """(violations on these victims, highest priority, count, shifted sum, -earliest start of the highest)."""
    ordered = sorted(victims, key=lambda p: default.importance(cluster, p))
    violations = sum(default.pdb_violating(cluster, ordered))
    prios = [cluster.priority(p) for p in ordered]
    highest = max(prios) if prios else -PRIORITY_SHIFT
    earliest = min(
        (p.start for p, prio in zip(ordered, prios, strict=True) if prio == highest), default=timeutil.NEVER
    )
    return (violations, highest, len(prios), sum(p + PRIORITY_SHIFT for p in prios), -earliest)


@dataclass(slots=True)
class _Kind:
    priority: int
    frees: tuple[int, ...]  # per short resource, capped at the shortfall
    budget: str  # the one PDB whose budget its pods spend ("" none); complex kinds: ""
    members: list[Pod]  # latest start first: the first x are the ones taken
    complex: bool  # one pod whose budgets overlap others': violations counted on pods


class _Search:
    """The branch and bound over kinds for one node and preemptor."""

    def __init__(
        self, cluster: Cluster, potential: Sequence[Pod], deficit: dict[str, int], incumbent: list[Pod]
    ) -> None:
        self.cluster = cluster
        names = sorted(deficit)
        self.need = tuple(deficit[r] for r in names)
        budgets = cluster.budgets
        spends = {
            p.uid: tuple(b.uid for b in budgets.of(p.uid) if p.name not in b.disrupted) for p in potential
        }
        overlapping = {u for s in spends.values() if len(s) > 1 for u in s}
        self.allowed = {b.uid: max(0, b.disruptions_allowed) for p in potential for b in budgets.of(p.uid)}
        frees_of = {
            p.uid: tuple(min(p.requests.get(r, 0), n) for r, n in zip(names, self.need, strict=True))
            for p in potential
        }
        useful = [p for p in potential if any(frees_of[p.uid])]  # others are never in a least set
        # A resource every useful pod covers alone (a pod slot, say) is covered by any victim:
        # while another resource is short, it adds nothing to the search.
        keep = [
            r
            for r in range(len(names))
            if len(names) == 1 or any(frees_of[p.uid][r] < self.need[r] for p in useful)
        ] or [0]
        self.need = tuple(self.need[r] for r in keep)
        # A budget no choice can exceed (it allows as many as could ever spend it) is no budget.
        spenders: dict[str, int] = {}
        for p in useful:
            for u in spends[p.uid]:
                spenders[u] = spenders.get(u, 0) + 1
        tight = {u for u, n in spenders.items() if n > self.allowed[u]}
        groups: dict[tuple[int, tuple[int, ...], str], list[Pod]] = {}
        kinds: list[_Kind] = []
        for p in useful:
            frees = tuple(frees_of[p.uid][r] for r in keep)
            prio = cluster.priority(p)
            spent = tuple(u for u in spends[p.uid] if u in tight)
            if any(u in overlapping for u in spent):
                kinds.append(_Kind(prio, frees, "", [p], True))
            else:
                groups.setdefault((prio, frees, spent[0] if spent else ""), []).append(p)
        for (prio, frees, budget), members in groups.items():
            members.sort(key=lambda p: (-p.start, p.uid))
            kinds.append(_Kind(prio, frees, budget, members, False))
        # Ascending priority (cheap first), then the largest first, then a stable order.
        kinds.sort(key=lambda k: (k.priority, tuple(-f for f in k.frees), k.budget, k.members[0].uid))
        self.kinds = kinds
        m, width = len(kinds), len(self.need)
        self.prios = [k.priority for k in kinds]
        # cum[r][i]: what kinds[:i] free of resource r, all their pods taken.
        self.cum = [[0] * (m + 1) for _ in range(width)]
        for r in range(width):
            for i, k in enumerate(kinds):
                self.cum[r][i + 1] = self.cum[r][i] + k.frees[r] * len(k.members)
        # Per resource, the kinds by what one pod frees, largest first (for the count bound).
        self.by_size = [
            sorted(range(m), key=[(-k.frees[r], i) for i, k in enumerate(kinds)].__getitem__)
            for r in range(width)
        ]
        self.steps = 0
        self.capped = False
        # (kind index, shortfall, budgets' state) -> partial keys already searched from there: a
        # partial set no better on every term than one of them cannot lead anywhere better.
        self.seen: dict[tuple[Any, ...], list[tuple[int, int, int, int, int]]] = {}
        self.best_key = disruption_key(cluster, incumbent)
        self.best: list[Pod] = list(incumbent)
        self.taken: list[int] = [0] * m

    # ---- bounds ----------------------------------------------------------------------

    def _count(self, short: Sequence[int], start: int, end: int) -> int:
        """The fewest pods of kinds[start:end+1] that free `short` of every resource (largest first)."""
        most = 0
        kinds = self.kinds
        for r, need in enumerate(short):
            if need <= 0:
                continue
            got = used = 0
            for i in self.by_size[r]:
                if i < start or i > end:
                    continue
                k = kinds[i]
                size = k.frees[r]
                if size <= 0:
                    break
                n = len(k.members)
                if got + size * n >= need:
                    used += -(-(need - got) // size)
                    got = need
                    break
                got += size * n
                used += n
            if got < need:
                return -1
            most = max(most, used)
        return most

    def _free_of_violations(self, short: Sequence[int], start: int, spent: dict[str, int]) -> bool:
        """Could kinds[start:] cover `short` without a further violation (budgets left, per resource)?"""
        kinds = self.kinds
        for r, need in enumerate(short):
            if need <= 0:
                continue
            got = 0
            left: dict[str, int] = {}
            for i in self.by_size[r]:
                if i < start:
                    continue
                k = kinds[i]
                if k.frees[r] <= 0:
                    break
                n = len(k.members)
                if k.budget:
                    room = left.setdefault(k.budget, max(0, self.allowed[k.budget] - spent.get(k.budget, 0)))
                    n = min(n, room)
                    left[k.budget] = room - n
                got += k.frees[r] * n  # complex kinds counted as free: optimistic, so a bound
                if got >= need:
                    break
            if got < need:
                return False
        return True

    # ---- the search --------------------------------------------------------------------

    def run(self) -> None:
        self._search(0, self.need, 0, {}, 0, [], -PRIORITY_SHIFT, 0, 0, timeutil.NEVER)

    def _search(
        self,
        i: int,
        short: tuple[int, ...],
        simple: int,  # violations of the kinds with a budget of their own
        spent: dict[str, int],
        tangled: int,  # violations among the pods whose budgets overlap, counted on them
        overlapping: list[Pod],
        highest: int,
        count: int,
        total: int,
        earliest: int,
    ) -> None:
        self.steps += 1
        if self.steps > MAX_STATES:
            self.capped = True
            return
        violations = simple + tangled
        if not any(s > 0 for s in short):
            key = (violations, highest, count, total, -earliest)
            if key < self.best_key:
                self.best_key = key
                self.best = self._victims()
            return
        m = len(self.kinds)
        if i == m:
            return
        # The highest priority is at least the least level whose kinds (from i on) cover the shortfall.
        reach = i
        for r, need in enumerate(short):
            if need > 0:
                cum = self.cum[r]
                k = bisect.bisect_left(cum, cum[i] + need, i + 1) - 1
                if k >= m:
                    return  # kinds[i:] cannot cover it
                reach = max(reach, k)
        level = max(highest, self.prios[reach])
        end = bisect.bisect_right(self.prios, level) - 1
        more = self._count(short, i, end)  # with the highest priority at `level`, at least this many more
        if more < 0:
            return
        floor = violations if self._free_of_violations(short, i, spent) else violations + 1
        cheapest = self.prios[i] + PRIORITY_SHIFT
        if level > highest:
            extra = (level + PRIORITY_SHIFT) + (more - 1) * cheapest
            bound = (floor, level, count + more, total + extra, -timeutil.NEVER)
        else:
            bound = (floor, level, count + more, total + more * cheapest, -earliest)
        if bound >= self.best_key:
            return
        if self._dominated(i, short, spent, (violations, highest, count, total, earliest)):
            return
        kind = self.kinds[i]
        # Never more of a kind than the shortfall needs: a set that covers without a pod is better.
        useful = max(
            (-(-s // f) for s, f in zip(short, kind.frees, strict=True) if s > 0 and f > 0), default=0
        )
        for x in range(min(len(kind.members), useful), 0, -1):
            grown = tuple(max(0, s - f * x) for s, f in zip(short, kind.frees, strict=True))
            simple_x, spent_x, tangled_x, overlapping_x = simple, spent, tangled, overlapping
            if kind.complex:
                overlapping_x = sorted([*overlapping, kind.members[0]], key=self._importance)
                tangled_x = sum(disruption.violating(self.cluster.budgets, overlapping_x))
            elif kind.budget:
                before = spent.get(kind.budget, 0)
                allowed = max(0, self.allowed[kind.budget])
                simple_x += max(0, before + x - allowed) - max(0, before - allowed)
                spent_x = {**spent, kind.budget: before + x}
            start = kind.members[x - 1].start  # the earliest of the x latest-started
            if kind.priority > highest:
                h, e = kind.priority, start
            elif kind.priority == highest:
                h, e = highest, min(earliest, start)
            else:
                h, e = highest, earliest
            self.taken[i] = x
            cost = total + x * (kind.priority + PRIORITY_SHIFT)
            self._search(i + 1, grown, simple_x, spent_x, tangled_x, overlapping_x, h, count + x, cost, e)
            self.taken[i] = 0
            if self.capped:
                return
        self._search(i + 1, short, simple, spent, tangled, overlapping, highest, count, total, earliest)

    def _dominated(
        self, i: int, short: tuple[int, ...], spent: dict[str, int], partial: tuple[int, int, int, int, int]
    ) -> bool:
        """Was this point reached before by a partial set at least as good on every term?

        From the same kind, shortfall and budget state the same completions follow, and
        each ends no better after this partial set than after one with no more
        violations, count and cost, a highest priority no higher and (at the same
        highest) an earliest start no earlier. Budgets count only up to what they allow
        (beyond it, each pod is a violation already counted); overlapping ones keep
        their pods apart, so points past one are not compared.
        """
        if any(k.complex for k in self.kinds[:i]):
            return False
        state = (
            i,
            short,
            tuple(sorted((u, min(n, self.allowed[u])) for u, n in spent.items() if self.allowed[u])),
        )
        v, h, c, s, e = partial
        held = self.seen.setdefault(state, [])
        for v2, h2, c2, s2, e2 in held:
            if v2 <= v and h2 <= h and c2 <= c and s2 <= s and (h2 < h or e2 >= e):
                return True
        held.append(partial)
        return False

    def _importance(self, pod: Pod) -> tuple[int, int, int, str]:
        return default.importance(self.cluster, pod)

    def _victims(self) -> list[Pod]:
        return [p for k, x in zip(self.kinds, self.taken, strict=True) for p in k.members[:x]]


def evaluate_node(
    cluster: Cluster, state: NodeState, pre: Preemptor, now: int, ordered: Sequence[Pod] | None = None
) -> NodeEval:
    greedy = default.evaluate_node(cluster, state, pre, now, ordered)
    if greedy.status != CANDIDATE:
        return greedy
    potential, _ = default.potential_victims(cluster, state, pre, now, ordered)
    free = default.free_for(cluster, state, pre)
    deficit = {k: v - free.get(k, 0) for k, v in pre.requests.items() if v > free.get(k, 0)}
    search = _Search(cluster, potential, deficit, greedy.victims)
    search.run()
    victims = sorted(search.best, key=lambda p: default.importance(cluster, p))
    return NodeEval(
        state.node.name,
        CANDIDATE,
        victims=victims,
        violations=search.best_key[0],
        key=search.best_key,
        expires=greedy.expires,
        potential=greedy.potential,
        pdbs=greedy.pdbs,
        capped=search.capped,
    )


__all__ = ["CANDIDATE", "FITS", "REJECTED", "disruption_key", "evaluate_node"]
