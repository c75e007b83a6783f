"""The oracle for `victimSelection: minimal`: the engine's first search, over pods, uncapped.

This is engine/minimal.py as it was before kinds, memoised states and stronger bounds
(issue 23): a plain depth-first branch and bound over single pods, which agreed with
brute force on every small cluster. Uncapped it is exact but slow (seconds at 30
pods), so tests/test_minimal_properties.py holds the engine to it on nodes of up to
a couple of dozen pods, where brute force cannot go.

Original docstring:

`victimSelection: minimal`: the least disruptive victim set per node, exactly.

Same eligibility as the default flow (lower priority, not tolerating, the node
passes its filters), but instead of the greedy reprieve the victim set on each
node minimises, lexicographically, (PDB violations, highest victim priority,
victim count, sum of shifted priorities); ties on those are broken as the
default flow breaks them, by the latest start among the highest-priority
victims (evict the pods that lose the least work), and nodes are ranked by the
same key, then by name (docs/semantics.md §7).

Every one of the first four components can only grow when a pod is added to a
set, and the fifth cannot improve while the highest priority stays the same, so
the key of a partial set bounds all its extensions and a depth-first branch and
bound is exact. It starts from the greedy kubernetes answer, so it is never
worse than that answer on this key.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine import default, timeutil
from engine.cluster import Cluster, NodeState
from engine.default import CANDIDATE, FITS, PRIORITY_SHIFT, REJECTED, NodeEval, Preemptor
from engine.objects import Pod

# Search states explored per node before the best set found so far is returned
# (it is still never worse than greedy); bounds the cost of pathological nodes.
MAX_STATES = 10**12  # uncapped: an oracle


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


def evaluate_node(
    cluster: Cluster, state: NodeState, pre: Preemptor, now: int, ordered: Sequence[Pod] | None = None
) -> NodeEval:
    greedy = default.evaluate_node(cluster, state, pre, now, ordered)
    if greedy.status != CANDIDATE:
        return greedy
    potential, _ = default.potential_victims(cluster, state, pre, now, ordered)
    free = default.free_for(cluster, state, pre)
    deficit = {k: v - free.get(k, 0) for k, v in pre.requests.items() if v > free.get(k, 0)}
    best_set = list(greedy.victims)
    best_key = disruption_key(cluster, best_set)
    # Cheap pods first (low priority, big), so good sets are found early and prune the rest.
    pool = sorted(
        potential,
        key=lambda p: (cluster.priority(p), -sum(p.requests.get(k, 0) for k in deficit), p.uid),
    )
    # suffix[i]: what pool[i:] can free, to cut branches that cannot cover the deficit;
    # biggest[i]: the largest single request among pool[i:], to bound how many more
    # victims any extension needs.
    suffix: list[dict[str, int]] = [{} for _ in range(len(pool) + 1)]
    biggest: list[dict[str, int]] = [{} for _ in range(len(pool) + 1)]
    for i in range(len(pool) - 1, -1, -1):
        suffix[i] = dict(suffix[i + 1])
        biggest[i] = dict(biggest[i + 1])
        for k in deficit:
            v = pool[i].requests.get(k, 0)
            suffix[i][k] = suffix[i].get(k, 0) + v
            if v > biggest[i].get(k, 0):
                biggest[i][k] = v
    budgets = cluster.budgets
    states = 0
    chosen: list[Pod] = []

    def search(
        i: int, freed: dict[str, int], violations: int, highest: int, total: int, earliest: int
    ) -> None:
        nonlocal best_key, best_set, states
        states += 1
        if states > MAX_STATES:
            return
        count = len(chosen)
        key = (violations, highest, count, total, -earliest)
        short = {k: v - freed.get(k, 0) for k, v in deficit.items() if freed.get(k, 0) < v}
        if not short:
            if key < best_key:
                best_key, best_set = key, list(chosen)
            return
        if i == len(pool):
            return
        more = 1
        for k, need in short.items():
            top = biggest[i].get(k, 0)
            if top <= 0 or suffix[i].get(k, 0) < need:
                return  # pool[i:] cannot cover the deficit
            more = max(more, -(-need // top))
        # Any extension adds `more` pods or more, none cheaper than pool[i] (ascending
        # priority). Its start term is no better while the highest priority stays the same.
        low = cluster.priority(pool[i])
        if low > highest:
            bound = (violations, low, count + more, total + more * (low + PRIORITY_SHIFT), -timeutil.NEVER)
        else:
            bound = (violations, highest, count + more, total + more * (low + PRIORITY_SHIFT), -earliest)
        if bound >= best_key:
            return
        pod = pool[i]
        prio = cluster.priority(pod)
        chosen.append(pod)
        grown = dict(freed)
        for k in deficit:
            grown[k] = grown.get(k, 0) + pod.requests.get(k, 0)
        if budgets.of(pod.uid):
            ordered_set = sorted(chosen, key=lambda p: default.importance(cluster, p))
            grown_violations = sum(default.pdb_violating(cluster, ordered_set))
        else:
            grown_violations = violations  # a pod no PDB covers spends no budget
        if prio > highest:
            h, e = prio, pod.start
        elif prio == highest:
            h, e = highest, min(earliest, pod.start)
        else:
            h, e = highest, earliest
        search(i + 1, grown, grown_violations, h, total + prio + PRIORITY_SHIFT, e)
        chosen.pop()
        search(i + 1, freed, violations, highest, total, earliest)

    search(0, {}, 0, -PRIORITY_SHIFT, 0, timeutil.NEVER)
    ordered = sorted(best_set, key=lambda p: default.importance(cluster, p))
    return NodeEval(
        state.node.name,
        CANDIDATE,
        victims=ordered,
        violations=best_key[0],
        key=best_key,
        expires=greedy.expires,
        potential=greedy.potential,
        pdbs=greedy.pdbs,
    )


__all__ = ["CANDIDATE", "FITS", "REJECTED", "disruption_key", "evaluate_node"]
