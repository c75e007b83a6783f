"""`victimSelection: minimal`: the least disruptive victim set per node, exactly.

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

from engine import default, resources, timeutil
from engine.cluster import Cluster, NodeState
from engine.default import CANDIDATE, FITS, PRIORITY_SHIFT, REJECTED, NodeEval, Preemptor
from engine.objects import Pod

# Search states explored per node before the best set found so far is returned
# (it is still never worse than greedy); bounds the cost of pathological nodes.
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
    # suffix[i]: what pool[i:] can free, to cut branches that cannot cover the deficit.
    suffix: list[dict[str, int]] = [{} for _ in range(len(pool) + 1)]
    for i in range(len(pool) - 1, -1, -1):
        suffix[i] = dict(suffix[i + 1])
        resources.add(suffix[i], {k: pool[i].requests.get(k, 0) for k in deficit})
    min_shift = min((cluster.priority(p) + PRIORITY_SHIFT for p in pool), default=0)
    states = 0
    chosen: list[Pod] = []

    def covered(freed: dict[str, int]) -> bool:
        return all(freed.get(k, 0) >= v for k, v in deficit.items())

    def search(i: int, freed: dict[str, int]) -> None:
        nonlocal best_key, best_set, states
        states += 1
        if states > MAX_STATES:
            return
        key = disruption_key(cluster, chosen)
        if covered(freed):
            if key < best_key:
                best_key, best_set = key, list(chosen)
            return
        # Any extension adds a pod: at least one more victim and min_shift more sum; its
        # start term is no better unless its highest priority rises, which the
        # second term already makes worse.
        bound = (key[0], key[1], key[2] + 1, key[3] + min_shift, key[4])
        if bound >= best_key or i == len(pool):
            return
        if not all(freed.get(k, 0) + suffix[i].get(k, 0) >= v for k, v in deficit.items()):
            return
        pod = pool[i]
        chosen.append(pod)
        grown = dict(freed)
        resources.add(grown, {k: pod.requests.get(k, 0) for k in deficit})
        search(i + 1, grown)
        chosen.pop()
        search(i + 1, freed)

    search(0, {})
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
