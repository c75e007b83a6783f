"""A literal transcription of the `kubernetes` preemption rules, with no indexes.

This is the oracle: property tests require the engine (indexes, caches) to give
identical answers on generated clusters, and `preemptctl bench engine` measures
the engine against it side by side. It recomputes everything from the raw
record tables on every call: node usage from all pods, nominated pods by a scan,
PDB budgets per node. Keep it obvious rather than fast.
"""

from __future__ import annotations

from typing import Any

from engine import placement, toleration
from engine.cluster import Cluster
from engine.objects import Pod

SHIFT = 2**31


def _prio(cluster: Cluster, pod: Pod) -> int:
    return cluster.priority(pod)


def _fits(req: dict[str, int], alloc: dict[str, int], pods: list[Pod]) -> bool:
    for resource, amount in req.items():
        used = sum(p.requests.get(resource, 0) for p in pods)
        if amount + used > alloc.get(resource, 0):
            return False
    return True


def _more_important(cluster: Cluster, pod: Pod) -> tuple[int, int, int, str]:
    return (-_prio(cluster, pod), -pod.qos, pod.start, pod.uid)


def _tolerates(cluster: Cluster, victim: Pod, preemptor_priority: int, now: int) -> bool:
    pc = cluster.priority_classes.get(victim.priority_class)
    if pc is None:
        return False
    try:
        policy = toleration.parse_policy(pc.value, pc.annotations)
    except toleration.PolicyError:
        return False
    return toleration.tolerates(
        policy,
        victim_priority=_prio(cluster, victim),
        preemptor_priority=preemptor_priority,
        scheduled_at=victim.scheduled_at,
        now=now,
    )


def violations_of(cluster: Cluster, victims: list[Pod]) -> int:
    """How many of these victims, evicted together, exceed a PDB's budget (each victim counted once).

    Every PDB's budget is spent by its matching victims, most important first
    (pods already in its disruptedPods spend nothing); a victim is a violation
    when some PDB matching it has no budget left for it.
    """
    spent: dict[str, int] = {}
    count = 0
    for v in sorted(victims, key=lambda p: _more_important(cluster, p)):
        over = False
        for pdb in sorted(cluster.pdbs.values(), key=lambda b: b.uid):
            if pdb.namespace != v.namespace or pdb.selector is None or pdb.selector.empty:
                continue
            if not pdb.selector.matches(v.labels) or v.name in pdb.disrupted:
                continue
            spent[pdb.uid] = spent.get(pdb.uid, 0) + 1
            if spent[pdb.uid] > pdb.disruptions_allowed:
                over = True
        count += over
    return count


def decide(cluster: Cluster, pod: Pod, now: int) -> dict[str, Any]:
    """The default flow's answer as {outcome, node, victims: sorted keys}."""
    prio = _prio(cluster, pod)
    all_pods = list(cluster.pods.values())
    # Grouped once per call, as kube-scheduler's snapshot lists each node's pods.
    bound: dict[str, list[Pod]] = {}
    promised: dict[str, list[Pod]] = {}
    for p in all_pods:
        if p.terminal:
            continue
        if p.node is not None:
            bound.setdefault(p.node, []).append(p)
        elif p.nominated is not None and p.uid != pod.uid and _prio(cluster, p) >= prio:
            promised.setdefault(p.nominated, []).append(p)
    nodes = sorted(cluster.nodes)
    results = []
    fitting = []
    for name in nodes:
        node = cluster.nodes[name].node
        if placement.unresolvable(node, pod) is not None:
            continue
        on_node = bound.get(name, [])
        nominated = promised.get(name, [])
        if _fits(pod.requests, node.allocatable, on_node + nominated):
            fitting.append(name)
            continue
        potential = [p for p in on_node if _prio(cluster, p) < prio and not _tolerates(cluster, p, prio, now)]
        remaining = [p for p in on_node if p not in potential]
        if not _fits(pod.requests, node.allocatable, remaining + nominated):
            continue
        potential.sort(key=lambda p: _more_important(cluster, p))
        budgets: dict[str, int] = {}
        violating: list[Pod] = []
        non_violating: list[Pod] = []
        for p in potential:
            bad = False
            for pdb in cluster.pdbs.values():
                if pdb.namespace != p.namespace or pdb.selector is None or pdb.selector.empty:
                    continue
                if not pdb.selector.matches(p.labels) or p.name in pdb.disrupted:
                    continue
                budgets[pdb.uid] = budgets.get(pdb.uid, pdb.disruptions_allowed) - 1
                if budgets[pdb.uid] < 0:
                    bad = True
            (violating if bad else non_violating).append(p)
        victims: list[Pod] = []
        for group in (violating, non_violating):
            for p in group:
                remaining.append(p)
                if not _fits(pod.requests, node.allocatable, remaining + nominated):
                    remaining.remove(p)
                    victims.append(p)
        violations = violations_of(cluster, victims)
        prios = [_prio(cluster, v) for v in victims]
        highest = max(prios)
        earliest = min(v.start for v in victims if _prio(cluster, v) == highest)
        key = (violations, highest, sum(p + SHIFT for p in prios), len(victims), -earliest, name)
        results.append((key, name, victims))
    if fitting:
        node_name = pod.nominated if pod.nominated in fitting else fitting[0]
        return {"outcome": "fits", "node": node_name, "victims": []}
    if cluster.preemption_policy(pod) == "Never":
        return {"outcome": "unschedulable", "node": None, "victims": []}
    if pod.nominated and pod.nominated in cluster.nodes:
        node = cluster.nodes[pod.nominated].node
        if placement.unresolvable(node, pod) is None:
            for p in all_pods:
                if (
                    p.node == pod.nominated
                    and not p.terminal
                    and _prio(cluster, p) < prio
                    and p.deleting
                    and p.disruption_target
                ):
                    return {"outcome": "wait", "node": None, "victims": []}
    if not results:
        return {"outcome": "unschedulable", "node": None, "victims": []}
    results.sort(key=lambda r: r[0])
    _, name, victims = results[0]
    return {"outcome": "preempt", "node": name, "victims": sorted(v.key for v in victims)}
