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
first, per resource; when the set has no violation to spare, of a budget's pods
only as many as it still allows, which may also raise that level); the cheapest
priorities for them; and the start term while the highest priority stays. A set
that still covers after dropping a pod is never better than without it, so no
kind is taken beyond what the shortfall needs. It starts from the greedy
kubernetes answer and keeps it on ties, so it is never worse on this key.

Told another node's answer (`beat`: branch and bound across nodes), the search
prunes every branch that cannot rank before it too; a node left with none is
returned as `Pruned`, a bound and no victim set (docs/semantics.md §7). Where a
set does beat it, the answer is the one found without `beat`: branches pruned
only by it hold no set that beats it, so the search meets the same sets first.
`incumbent` gives a node's first answer cheaply, for others to be told. The
search stops after MAX_WORK (steps times kinds, what a step costs) and keeps the
best set found (docs/semantics.md §7 names the nodes that reach it).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine import default, disruption, timeutil
from engine.cluster import Cluster, NodeState
from engine.default import CANDIDATE, FITS, PRIORITY_SHIFT, REJECTED, NodeEval, Preemptor
from engine.objects import Pod

# Search work per node (steps times kinds: a step's bounds walk the kinds) before the best
# set found so far is returned, still never worse than greedy. Filled nodes of a busy
# cluster need under 100,000, nodes saturated with victims still leaving about 600,000;
# this bounds adversarial nodes to about 2 s on this machine (docs/semantics.md §7).
MAX_WORK = 1_000_000
# Prices tried by the cost bound (`_Search._cost`), evenly up to the steepest useful one:
# any price is a bound; more prune a little more for their cost at every step.
COST_PRICES = 8


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


def _fewest(sizes: list[int], need: int) -> int:
    """The fewest of these amounts that add up to `need` (the largest first)."""
    got = 0
    for count, size in enumerate(sorted(sizes, reverse=True), 1):
        got += size
        if got >= need:
            return count
    return len(sizes) + 1  # none do: no cover at all, so any figure holds


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
        self,
        cluster: Cluster,
        potential: Sequence[Pod],
        deficit: dict[str, int],
        incumbent: list[Pod],
        cut: tuple[int, ...] | None = None,
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
        # A resource every cover of the others covers too adds nothing to the search: when any
        # set freeing the other resources holds at least `fewest` pods, each freeing at least
        # `least` of it, and fewest * least reaches its shortfall (pod slots, mostly).
        keep = list(range(len(names)))
        for r in range(len(names)):
            others = [o for o in keep if o != r]
            if not others or not useful:
                continue
            least = min(frees_of[p.uid][r] for p in useful)
            fewest = max(_fewest([frees_of[p.uid][o] for p in useful], self.need[o]) for o in others)
            if least * fewest >= self.need[r]:
                keep.remove(r)
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
        self.width = max(1, m)
        self.prios = [k.priority for k in kinds]
        # cum[r][i]: what kinds[:i] free of resource r, all their pods taken.
        self.cum = [[0] * (m + 1) for _ in range(width)]
        for r in range(width):
            for i, k in enumerate(kinds):
                self.cum[r][i + 1] = self.cum[r][i] + k.frees[r] * len(k.members)
        # paid[r][i]: what kinds[:i] free of r through pods whose budget allows no disruption at
        # all: the capacity that never comes without a violation.
        self.paid = [[0] * (m + 1) for _ in range(width)]
        for r in range(width):
            for i, k in enumerate(kinds):
                never = bool(k.budget) and self.allowed[k.budget] == 0
                self.paid[r][i + 1] = self.paid[r][i] + (k.frees[r] * len(k.members) if never else 0)
        # Per resource, prices for the cost bound (`_cost`) with the kinds ordered by priority
        # less price times what one pod frees, cheapest first, for each.
        self.priced: list[list[tuple[float, list[int]]]] = []
        for r in range(width):
            sizes = [k.frees[r] for k in kinds if k.frees[r] > 0]
            top = (max(self.prios) - min(self.prios) + 1) / min(sizes) if sizes else 0.0
            prices = [top * j / COST_PRICES for j in range(1, COST_PRICES + 1)]
            self.priced.append(
                [
                    (
                        p,
                        sorted(
                            range(m),
                            key=[(k.priority - p * k.frees[r], i) for i, k in enumerate(kinds)].__getitem__,
                        ),
                    )
                    for p in prices
                ]
            )
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
        # What a branch must beat to be searched: this node's best so far, or `cut` (another
        # node's answer, as the least key a set here must stay below to rank before it; from
        # `evaluate_node`'s `beat`) when that is less: then only sets that beat it are sought.
        self.limit: tuple[int, ...] = self.best_key if cut is None else min(self.best_key, cut)
        self.taken: list[int] = [0] * m

    # ---- bounds ----------------------------------------------------------------------

    def _count(self, short: Sequence[int], start: int, end: int, spent: dict[str, int] | None = None) -> int:
        """The fewest pods of kinds[start:end+1] that free `short` of every resource (largest first).

        With `spent` (budgets spent so far), of a budget's pods only as many as it still
        allows: the fewest that make no further violation (-1: there are none).
        """
        most = 0
        kinds = self.kinds
        allowed = self.allowed
        for r, need in enumerate(short):
            if need <= 0:
                continue
            got = used = 0
            left: dict[str, int] = {}
            for i in self.by_size[r]:
                if i < start or i > end:
                    continue
                k = kinds[i]
                size = k.frees[r]
                if size <= 0:
                    break
                n = len(k.members)
                if spent is not None and k.budget:
                    room = left.get(k.budget)
                    if room is None:
                        room = max(0, allowed[k.budget] - spent.get(k.budget, 0))
                    n = min(n, room)
                    left[k.budget] = room - n
                    if not n:
                        continue
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

    def _violations_ahead(self, short: Sequence[int], start: int, spent: dict[str, int]) -> int:
        """How many more violations any completion from kinds[start:] makes, at least.

        What the pods no budget lets go (budgets allowing none) cannot cover must come from
        them, one violation each: as many as the largest of them need. Otherwise one when
        the budgets left cannot cover the shortfall, else none.
        """
        m = len(self.kinds)
        ahead = 0
        for r, need in enumerate(short):
            if need <= 0:
                continue
            rest = need - ((self.cum[r][m] - self.cum[r][start]) - (self.paid[r][m] - self.paid[r][start]))
            if rest > 0:
                got = used = 0
                for i in self.by_size[r]:
                    k = self.kinds[i]
                    if i < start or not k.budget or self.allowed[k.budget]:
                        continue
                    size, n = k.frees[r], len(k.members)
                    if got + size * n >= rest:
                        used += -(-(rest - got) // size)
                        break
                    got += size * n
                    used += n
                ahead = max(ahead, used)
        if ahead:
            return ahead
        return 0 if self._free_of_violations(short, start, spent) else 1

    def _free_of_violations(self, short: Sequence[int], start: int, spent: dict[str, int]) -> bool:
        """Could kinds[start:] cover `short` without a further violation (budgets left, per resource)?"""
        if not spent and not any(self.allowed[k.budget] for k in self.kinds[start:] if k.budget):
            return True  # no budget with room left to run out of: the quick answer is exact
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
        self._seed()
        self._search(0, self.need, 0, {}, 0, [], -PRIORITY_SHIFT, 0, 0, timeutil.NEVER)

    def _seed(self) -> None:
        """A good first answer to prune with: per priority level, the largest pods up to it that
        spend no budget beyond what it allows, cheapest first among equals."""
        kinds = self.kinds
        order = sorted(
            range(len(kinds)), key=lambda i: (tuple(-f for f in kinds[i].frees), kinds[i].priority, i)
        )
        for level in sorted(set(self.prios)):
            short = list(self.need)
            left = dict(self.allowed)
            taken = [0] * len(kinds)
            for i in order:
                k = kinds[i]
                if (
                    k.priority > level
                    or k.complex
                    or not any(s > 0 and f > 0 for s, f in zip(short, k.frees, strict=True))
                ):
                    continue
                room = len(k.members) if not k.budget else min(len(k.members), left[k.budget])
                need = max(
                    (-(-s // f) for s, f in zip(short, k.frees, strict=True) if s > 0 and f > 0), default=0
                )
                x = min(room, need)
                if x <= 0:
                    continue
                taken[i] = x
                if k.budget:
                    left[k.budget] -= x
                short = [max(0, s - f * x) for s, f in zip(short, k.frees, strict=True)]
                if not any(short):
                    break
            if any(short):
                continue
            # Drop pods the others already cover, most expensive first: a least set has none.
            for i in sorted(range(len(kinds)), key=lambda i: (-kinds[i].priority, i)):
                while taken[i]:
                    freed = [
                        sum(kinds[j].frees[r] * (taken[j] - (j == i)) for j in range(len(kinds)))
                        for r in range(len(self.need))
                    ]
                    if any(f < n for f, n in zip(freed, self.need, strict=True)):
                        break
                    taken[i] -= 1
            victims = [p for k, x in zip(kinds, taken, strict=True) for p in k.members[:x]]
            key = disruption_key(self.cluster, victims)
            if key < self.best_key:
                self.best_key, self.best = key, victims
                self.limit = min(self.limit, key)

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
        if self.steps * self.width > MAX_WORK:
            self.capped = True
            return
        violations = simple + tangled
        if not any(s > 0 for s in short):
            key = (violations, highest, count, total, -earliest)
            if key < self.best_key:
                self.best_key = key
                self.best = self._victims()
                self.limit = min(self.limit, key)
            return
        m = len(self.kinds)
        if i == m:
            return
        if self._dominated(i, short, spent, overlapping, (violations, highest, count, total, earliest)):
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
        floor = violations + self._violations_ahead(short, i, spent)
        limit = self.limit
        if floor > limit[0]:
            return
        tight = floor == violations == limit[0]
        if tight:
            # No violation to spare, and none to come: no budget gives more pods than it has
            # room for, which may take more pods, or pods of a higher level than up to `level`.
            within = self._count(short, i, end, spent)
            while within < 0:
                if end == m - 1:
                    return
                level = self.prios[end + 1]
                end = bisect.bisect_right(self.prios, level) - 1
                within = self._count(short, i, end, spent)
            more = max(more, within) if level == max(highest, self.prios[reach]) else within
        cheapest = self.prios[i] + PRIORITY_SHIFT
        if level > highest:
            extra = (level + PRIORITY_SHIFT) + (more - 1) * cheapest
            bound = (floor, level, count + more, total + extra, -timeutil.NEVER)
        else:
            bound = (floor, level, count + more, total + more * cheapest, -earliest)
        if bound >= limit:
            return
        if bound[:3] == limit[:3]:
            # Only the cost can decide: bound it by the relaxation that prices what each pod frees.
            priced = total + self._cost(short, i, end, more, spent if tight else None)
            if (bound[0], bound[1], bound[2], max(bound[3], priced), bound[4]) >= limit:
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

    def _cost(
        self, short: Sequence[int], start: int, end: int, more: int, spent: dict[str, int] | None = None
    ) -> int:
        """A lower bound on the shifted priorities of `more` pods of kinds[start:end+1] that free `short`.

        Lagrangian relaxation per short resource: for any price l >= 0, every such set
        costs at least l * shortfall + the `more` least (priority - l * frees) among the
        pods. Any price gives a bound; a few fixed ones (`COST_PRICES`, kinds ordered for
        each once per search) give most of the best one's. With `spent`, as `_count`: of
        a budget's pods only as many as it still allows.
        """
        kinds = self.kinds
        allowed = self.allowed
        best = float(more * kinds[start].priority)  # every pod at the cheapest priority
        for r, need in enumerate(short):
            if need <= 0:
                continue
            for price, order in self.priced[r]:
                total, left = price * need, more
                rooms: dict[str, int] = {}
                for i in order:
                    if i < start or i > end:
                        continue
                    k = kinds[i]
                    take = min(len(k.members), left)
                    if spent is not None and k.budget:
                        room = rooms.get(k.budget)
                        if room is None:
                            room = max(0, allowed[k.budget] - spent.get(k.budget, 0))
                        take = min(take, room)
                        rooms[k.budget] = room - take
                    total += (k.priority - price * k.frees[r]) * take
                    left -= take
                    if not left:
                        break
                if not left and total > best:
                    best = total
        # Floats only bound here: one unit under keeps rounding from overstating it.
        return math.floor(best) - 1 + more * PRIORITY_SHIFT

    def _dominated(
        self,
        i: int,
        short: tuple[int, ...],
        spent: dict[str, int],
        overlapping: list[Pod],
        partial: tuple[int, int, int, int, int],
    ) -> bool:
        """Was this point reached before by a partial set at least as good on every term?

        From the same kind, shortfall and budget state the same completions follow, and
        each ends no better after this partial set than after one with no more
        violations, count and cost, a highest priority no higher and (at the same
        highest) an earliest start no earlier. Budgets count only up to what they allow
        (beyond it, each pod is a violation already counted); of the pods whose budgets
        overlap, which ones were taken is part of the point (their violations depend on it).
        """
        budgets = tuple(sorted((u, min(n, self.allowed[u])) for u, n in spent.items() if self.allowed[u]))
        state = (i, short, budgets, tuple(p.uid for p in overlapping))
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


@dataclass(slots=True)
class Pruned(NodeEval):
    """A node whose search stopped once no set there could beat another node's answer.

    Its `key` is a lower bound, not a key: every victim set here ranks after `beaten_by`'s
    (key, node). It holds no victims, and no ranking may take it for an evaluation.
    """

    beaten_by: str = ""


def _cut(beat: tuple[tuple[int, ...], str], node: str) -> tuple[int, ...]:
    """The least key a set on `node` must stay below to rank before `beat` (node names break ties)."""
    key, other = beat
    # At an equal key the name decides: a node named before the other beats it with that key too.
    return key if node > other else (*key[:-1], key[-1] + 1)


def evaluate_node(
    cluster: Cluster,
    state: NodeState,
    pre: Preemptor,
    now: int,
    ordered: Sequence[Pod] | None = None,
    *,
    beat: tuple[tuple[int, ...], str] | None = None,
) -> NodeEval:
    """The least disruptive victim set on this node, exactly.

    `beat`, the (key, node) of a victim set found on another node: the search looks only
    for sets that rank before it, and a node with none is returned as `Pruned` (a bound,
    docs/semantics.md §7). Where one does, the answer is the one found without `beat`.
    """
    greedy = default.evaluate_node(cluster, state, pre, now, ordered)
    if greedy.status != CANDIDATE:
        return greedy
    if pre.filters is not None and state.node.name in pre.filters.touched():
        # The search trades pods by the resources they free; where inter-pod filters can
        # change the answer a pod also matters by its labels and ports, which it does not
        # model: there the default reprieve's set is kept, ranked by minimal's key
        # (docs/semantics.md §7). Elsewhere the filters pass whatever is evicted.
        key = disruption_key(cluster, greedy.victims)
        return NodeEval(
            state.node.name,
            CANDIDATE,
            victims=greedy.victims,
            violations=key[0],
            key=key,
            expires=greedy.expires,
            potential=greedy.potential,
            pdbs=greedy.pdbs,
        )
    potential, _ = default.potential_victims(cluster, state, pre, now, ordered)
    free = default.free_for(cluster, state, pre)
    deficit = {k: v - free.get(k, 0) for k, v in pre.requests.items() if v > free.get(k, 0)}
    cut = _cut(beat, state.node.name) if beat is not None else None
    search = _Search(cluster, potential, deficit, greedy.victims, cut)
    search.run()
    if cut is not None and search.capped:
        # Capped, the search proved nothing against `beat`: as without it (the best set found).
        cut = None
        search = _Search(cluster, potential, deficit, greedy.victims)
        search.run()
    if cut is not None and beat is not None and search.best_key >= cut:
        return _pruned(state.node.name, beat, cut, greedy)
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


def incumbent(
    cluster: Cluster, state: NodeState, pre: Preemptor, now: int, ordered: Sequence[Pod] | None = None
) -> tuple[int, ...] | None:
    """The key of a victim set on this node found without searching (the greedy set, or the
    search's first answer when better): at least the node's key, so what another node's
    search can be told to beat (`evaluate_node`'s `beat`). None where it is no candidate."""
    greedy = default.evaluate_node(cluster, state, pre, now, ordered)
    if greedy.status != CANDIDATE:
        return None
    if pre.filters is not None and state.node.name in pre.filters.touched():
        return disruption_key(cluster, greedy.victims)
    potential, _ = default.potential_victims(cluster, state, pre, now, ordered)
    free = default.free_for(cluster, state, pre)
    deficit = {k: v - free.get(k, 0) for k, v in pre.requests.items() if v > free.get(k, 0)}
    search = _Search(cluster, potential, deficit, greedy.victims)
    search._seed()
    return search.best_key


def _pruned(node: str, beat: tuple[tuple[int, ...], str], cut: tuple[int, ...], greedy: NodeEval) -> Pruned:
    key, other = beat
    violations, highest, count, shifted = key[0], key[1], key[2], key[3]
    return Pruned(
        node,
        CANDIDATE,
        key=cut,
        violations=violations,
        expires=greedy.expires,
        potential=greedy.potential,
        pdbs=greedy.pdbs,
        # The explanation's entry, said plainly: a bound, not a victim set (docs/semantics.md §7).
        summary={
            "node": node,
            "notSearched": f"cannot beat {other}'s cost",
            "costAtLeast": {
                "pdbViolations": violations,
                "highestVictimPriority": None if highest == -PRIORITY_SHIFT else highest,
                "victims": count,
                "prioritySum": shifted - count * PRIORITY_SHIFT,
            },
        },
        beaten_by=other,
    )


__all__ = ["CANDIDATE", "FITS", "REJECTED", "Pruned", "disruption_key", "evaluate_node", "incumbent"]
