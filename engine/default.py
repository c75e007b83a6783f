"""The default flow: Kubernetes pod preemption (seed 004, kube-scheduler DefaultPreemption).

Per node: remove every lower-priority pod that does not tolerate the preemptor;
if the preemptor still does not fit, the node is out. Otherwise give pods back
in importance order, PDB-violating pods first, and whatever cannot come back
without un-fitting the preemptor is a victim. Nodes are then ranked by the
upstream criteria, every node evaluated, ties broken by node name.

`evaluate_node` is the unit the index caches (see `index`): its result depends
only on the node's state, the PDBs covering its pods, the toleration policies of
their classes, the preemptor's signature and, through toleration windows, on
`now` until `NodeEval.expires`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine import disruption, interpod, placement, resources, timeutil, toleration
from engine.cluster import Cluster, NodeState
from engine.objects import PREEMPT_NEVER, QOS_NAMES, Pod
from engine.resources import Resources

FITS, CANDIDATE, REJECTED = 0, 1, 2
# Victims' priorities are shifted by 2^31 before summing so that negative
# priorities cannot make a node with more victims look cheaper (upstream rule).
PRIORITY_SHIFT = 2**31
# Explanations list this many ranked candidates and rejected nodes; the rest are counted.
# Every listed candidate is evaluated in full, so this is also work per decision.
EXPLAIN_CANDIDATES = 3
EXPLAIN_REJECTED = 20


@dataclass(frozen=True, slots=True)
class Preemptor:
    """What every node evaluation needs to know about the pending pod, computed once."""

    pod: Pod
    priority: int
    requests: Resources
    # The inter-pod filters' state (host ports, pod (anti-)affinity, topology spread), or
    # None when none applies: evaluations then read the node alone, and the index ranks them.
    filters: interpod.Filters | None = None


def preemptor(cluster: Cluster, pod: Pod) -> Preemptor:
    """The pending pod as every flow evaluates it: its priority and, when any applies, the
    inter-pod filters' state over the cluster as it is now."""
    filters = interpod.Filters(cluster, pod)
    return Preemptor(pod, cluster.priority(pod), pod.requests, filters if filters.active else None)


@dataclass(slots=True)
class NodeEval:
    node: str
    status: int
    reason: str = ""
    victims: list[Pod] = field(default_factory=list)
    violations: int = 0
    key: tuple[int, ...] = ()
    expires: int | None = None  # a toleration window closes: re-evaluate after this instant
    # Every eligible lower-priority pod with its PDB flag, in the order the reprieve tried them:
    # what lets an explanation say why one neighbour was evicted and another given back.
    potential: list[tuple[Pod, bool]] = field(default_factory=list)
    # criteria() of this evaluation, kept: a ranking serves the same top candidates to
    # many decisions, and each decision's explanation lists them.
    summary: dict[str, Any] | None = None
    # The PDBs covering a potential victim: the only budgets this evaluation read.
    pdbs: frozenset[str] = frozenset()
    # minimal mode: the search stopped at its cap, so the set is not proven least disruptive.
    capped: bool = False


def importance(cluster: Cluster, pod: Pod) -> tuple[int, int, int, str]:
    """Sort key, most important first: priority, QoS class, earlier start, then uid."""
    return (-cluster.priority(pod), -pod.qos, pod.start, pod.uid)


def pdb_violating(cluster: Cluster, pods: Sequence[Pod]) -> list[bool]:
    """Which of `pods` (importance order) would violate a PDB if all were evicted (`disruption.violating`)."""
    return disruption.violating(cluster.budgets, pods)


def nominated_pods(cluster: Cluster, node: str, pre: Preemptor) -> list[Pod]:
    """Pods nominated to `node` with at least the preemptor's priority, by uid (addGENominatedPods)."""
    held = cluster.nominated_on(node)
    return [
        held[uid]
        for uid in sorted(held)
        if uid != pre.pod.uid and cluster.priority(held[uid]) >= pre.priority
    ]


def nominated_load(cluster: Cluster, node: str, pre: Preemptor) -> Resources | None:
    """Resources promised to pods nominated here with priority >= the preemptor's (counted as bound)."""
    load: Resources | None = None
    for pod in cluster.nominated_on(node).values():
        if pod.uid != pre.pod.uid and cluster.priority(pod) >= pre.priority:
            if load is None:
                load = {}
            resources.add(load, pod.requests)
    return load


def free_for(cluster: Cluster, state: NodeState, pre: Preemptor) -> Resources:
    free = cluster.free(state)
    load = nominated_load(cluster, state.node.name, pre)
    if load:
        resources.sub(free, load)
    return free


def potential_victims(
    cluster: Cluster, state: NodeState, pre: Preemptor, now: int, ordered: Sequence[Pod] | None = None
) -> tuple[list[Pod], int | None]:
    """Lower-priority pods that do not tolerate the preemptor, and when that set may change.

    `ordered`, when given, is the node's pods already most important first (a
    `summary.Summary`); the result then keeps that order.
    """
    out = []
    expires: int | None = None
    priority = pre.priority
    for pod in state.pods.values() if ordered is None else ordered:
        if (pod.priority if pod.priority is not None else cluster.priority(pod)) >= priority:
            continue
        if pod.priority_class:
            policy = cluster.policy(pod.priority_class)
            if policy is not None and cluster.tolerates(pod, preemptor_priority=priority, now=now):
                until = toleration.expires_at(policy, scheduled_at=pod.scheduled_at)
                if until is not None:
                    expires = until if expires is None else min(expires, until)
                continue
        out.append(pod)
    return out, expires


def evaluate_node(
    cluster: Cluster, state: NodeState, pre: Preemptor, now: int, ordered: Sequence[Pod] | None = None
) -> NodeEval:
    name = state.node.name
    why = placement.unresolvable(state.node, pre.pod)
    if why is not None:
        return NodeEval(name, REJECTED, why)
    free = free_for(cluster, state, pre)
    # With inter-pod filters (engine.interpod), "fits" is kube-scheduler's SelectVictimsOnNode:
    # the resources and every filter, on a view of the node that follows the pods taken away
    # and given back, with the nominated pods and without them. Without, resources alone.
    view: interpod.NodeView | None = None
    if pre.filters is not None:
        view = pre.filters.view(state, nominated_pods(cluster, name, pre))
        status = view.status(resources.fits(pre.requests, free))
        if status is None:
            return NodeEval(name, FITS, "fits without preemption")
        if status[0] == interpod.UNRESOLVABLE:
            return NodeEval(name, REJECTED, status[1])
        hopeless = pre.filters.hopeless(state)
        if hopeless is not None:
            # No pod of this node counts for what fails here: nothing evicted here can help.
            return NodeEval(name, REJECTED, f"{hopeless} whatever is evicted on this node")
    elif resources.fits(pre.requests, free):
        return NodeEval(name, FITS, "fits without preemption")
    potential, expires = potential_victims(cluster, state, pre, now, ordered)
    for pod in potential:
        resources.add(free, pod.requests)
        if view is not None:
            view.remove(pod)
    if not resources.fits(pre.requests, free):
        missing = resources.shortfall(pre.requests, free)
        return NodeEval(
            name,
            REJECTED,
            f"does not fit even after removing all {len(potential)} eligible lower-priority pods "
            f"(short {', '.join(f'{k} {v}' for k, v in missing.items())})",
            expires=expires,
        )
    if view is not None:
        blocked = view.status(True)
        if blocked is not None:
            return NodeEval(
                name,
                REJECTED,
                f"{blocked[1]} even after removing all {len(potential)} eligible lower-priority pods",
                expires=expires,
            )
    if ordered is None:
        potential.sort(key=lambda p: importance(cluster, p))
    budgets = cluster.budgets
    read = frozenset(uid for pod in potential for uid in budgets.uids_of(pod.uid))
    # No PDB covers any of them: nothing is PDB-violating, and no budget was read.
    violating = pdb_violating(cluster, potential) if read else [False] * len(potential)
    victims: list[Pod] = []
    tried: list[tuple[Pod, bool]] = []
    for first_pass in (True, False):
        for pod, v in zip(potential, violating, strict=True):
            if v != first_pass:
                continue
            tried.append((pod, v))
            resources.sub(free, pod.requests)
            if view is None:
                if not resources.fits(pre.requests, free):
                    resources.add(free, pod.requests)
                    victims.append(pod)
                continue
            view.add(pod)
            if not resources.fits(pre.requests, free) or view.status(True) is not None:
                resources.add(free, pod.requests)
                view.remove(pod)
                victims.append(pod)
    victims.sort(key=lambda p: importance(cluster, p))
    # The reprieve order uses the classification above (upstream's), but the node is
    # ranked by what its eviction really does: the final victims beyond a budget. A
    # more important pod of a PDB given back leaves the budget unexceeded, which
    # upstream's count of pre-reprieve flags would still call a violation.
    violations = sum(pdb_violating(cluster, victims)) if read else 0
    return NodeEval(
        name,
        CANDIDATE,
        victims=victims,
        violations=violations,
        key=rank_key(cluster, victims, violations),
        expires=expires,
        potential=tried,
        pdbs=read,
    )


def rank_key(cluster: Cluster, victims: Sequence[Pod], violations: int) -> tuple[int, ...]:
    """Upstream pickOneNodeForPreemption, as one ascending key (node name breaks the last tie)."""
    prios = [cluster.priority(v) for v in victims]
    highest = max(prios) if prios else -PRIORITY_SHIFT
    earliest_of_highest = min(
        (v.start for v, p in zip(victims, prios, strict=True) if p == highest), default=timeutil.NEVER
    )
    return (
        violations,
        highest,
        sum(p + PRIORITY_SHIFT for p in prios),
        len(victims),
        -earliest_of_highest,
    )


def criteria(ev: NodeEval, cluster: Cluster, *, detail: bool = False) -> dict[str, Any]:
    """A candidate's ranking values, by name, for the explanation.

    With `detail` (the chosen node only, to keep records small) also every eligible
    pod there in reprieve order, victim or given back, with what ordered it.
    """
    if ev.summary is None:
        prios = [cluster.priority(v) for v in ev.victims]
        highest = max(prios, default=None)
        starts = (v.start for v, p in zip(ev.victims, prios, strict=True) if p == highest)
        earliest = min(starts, default=None)
        ev.summary = {
            "node": ev.node,
            "pdbViolations": ev.violations,
            "highestVictimPriority": highest,
            "prioritySum": sum(prios),
            "victims": len(ev.victims),
            "earliestStartOfHighest": None
            if earliest is None or earliest == timeutil.NEVER
            else timeutil.render(earliest),
            "victimPods": [v.namespace + "/" + v.name for v in ev.victims],
        }
        if ev.capped:
            ev.summary["searchCapped"] = True  # minimal mode: best found, not proven least
    out = dict(ev.summary)
    if detail:
        evicted = {v.uid for v in ev.victims}
        out["potentialVictims"] = [
            {
                "pod": p.namespace + "/" + p.name,
                "priority": cluster.priority(p),
                "qos": QOS_NAMES[p.qos],
                "start": None if p.start == timeutil.NEVER else timeutil.render(p.start),
                "pdbViolating": violating,
                "victim": p.uid in evicted,
            }
            for p, violating in ev.potential
        ]
    return out


def waiting_on_nominated(cluster: Cluster, pre: Preemptor) -> str | None:
    """Upstream PodEligibleToPreemptOthers: an earlier preemption for this pod is still under way.

    Only a preemption's victims (DisruptionTarget reason PreemptionByScheduler) hold the
    preemptor, and only on a node that could still take it (`placement.unresolvable`).
    """
    nominated = pre.pod.nominated
    if not nominated:
        return None
    state = cluster.nodes.get(nominated)
    if state is None or placement.before_ports(state.node, pre.pod) is not None:
        return None
    view = pre.filters.view(state, nominated_pods(cluster, nominated, pre)) if pre.filters else None
    # Filters run in upstream order and the first failure is the node's status: a host-port
    # conflict (Unschedulable) comes before NodeResourcesFit, so a too-small node whose
    # ports clash still holds the preemptor; spread and pod affinity come after it.
    if view is None or not view.ports_blocked():
        if placement.too_small(state.node, pre.pod) is not None:
            return None
        if view is not None:
            status = view.status(resources.fits(pre.requests, free_for(cluster, state, pre)))
            if status is not None and status[0] == interpod.UNRESOLVABLE:
                return None
    for pod in sorted(state.pods.values(), key=lambda p: p.uid):
        if cluster.priority(pod) < pre.priority and pod.deleting and pod.preempted:
            return f"victim {pod.key} of an earlier preemption is still terminating on {nominated}"
    return None


def may_preempt(cluster: Cluster, pod: Pod) -> bool:
    return cluster.preemption_policy(pod) != PREEMPT_NEVER
