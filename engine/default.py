"""The default flow: Kubernetes pod preemption (seed 004, kube-scheduler DefaultPreemption).

Per node: remove every lower-priority pod that does not tolerate the preemptor;
if the preemptor still does not fit, the node is out. Otherwise give pods back
in importance order, PDB-violating pods first, and whatever cannot come back
without un-fitting the preemptor is a victim. Nodes are then ranked by the
upstream criteria, every node evaluated, ties broken by node name.

`evaluate_node` is the unit the index caches (see `index`): its result depends
only on the node's state, the PDBs covering its pods, the toleration policies of
their classes, the preemptor's signature and, through toleration windows, on
`now` until `NodeEval.expires`. The job and DaemonSet flows evaluate nodes with it too.

The flow itself (`FLOW`, as the registry in engine.flows holds it) is the catch-all:
`decide` scans every node through the index (`Scanner`), `Explanation` is what its
records' `explanation` holds, and `explain_*` read those records back for
`preemptctl explain`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, Protocol, Required, TypedDict, cast

from engine import decision as decision_mod
from engine import disruption, flowbase, interpod, placement, reference, resources, timeutil, toleration
from engine.cluster import Cluster, NodeState
from engine.config import Config
from engine.decision import Decision
from engine.flowbase import Told, as_dict, as_list, key_of, victim_keys
from engine.objects import PREEMPT_NEVER, QOS_NAMES, Pod
from engine.resources import Resources
from engine.victims import to_victims

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


# ---- the flow: deciding -----------------------------------------------------------------


class Scanned(Protocol):
    """One scan of every node for a preemptor (engine.index.Scan)."""

    @property
    def fitting(self) -> str | None: ...  # a node where the preemptor fits now

    @property
    def best(self) -> NodeEval | None: ...  # the best-ranked candidate

    @property
    def explanation(self) -> dict[str, Any]: ...


class Scanner(Protocol):
    """What the default flow needs of the index: `engine.index.Index`, named here by its shape
    because the index is built on this module's node evaluation (and so imports it)."""

    def scan(self, pre: Preemptor, now: int, mode: str) -> Scanned: ...


def decide(cluster: Cluster, pod: Pod, *, now: int, config: Config, index: Scanner) -> Decision:
    """Decide for one pending preemptor the default flow's way (kube-scheduler's preemption).

    Pass the same `index` for every decision over one cluster (the streaming worker
    does): its rankings then stay current incrementally.
    """
    missing = interpod.not_modelled([pod])
    if missing:
        not_modelled: dict[str, Any] = {"flow": NAME, interpod.NOT_MODELLED: missing}
        return decision_mod.maker(NAME, pod.key, pod.uid, not_modelled)(
            decision_mod.UNSCHEDULABLE, interpod.not_modelled_reason(missing)
        )
    pre = preemptor(cluster, pod)
    scan = index.scan(pre, now, config.victim_selection)
    explanation = scan.explanation
    explanation["preemptorPriority"] = pre.priority
    explanation["victimSelection"] = config.victim_selection

    make = decision_mod.maker(NAME, pod.key, pod.uid, explanation)

    if scan.fitting is not None:
        return make(decision_mod.FITS, f"fits on {scan.fitting} without preemption", node=scan.fitting)
    if not may_preempt(cluster, pod):
        return make(decision_mod.UNSCHEDULABLE, "preemptionPolicy is Never: the pod may not preempt")
    waiting = waiting_on_nominated(cluster, pre)
    if waiting is not None:
        return make(decision_mod.WAIT, waiting)
    best = scan.best
    if best is None:
        return make(decision_mod.UNSCHEDULABLE, "no node can make room by evicting lower-priority pods")
    explanation["chosen"] = criteria(best, cluster, detail=True)
    return make(
        decision_mod.PREEMPT,
        f"preempt {len(best.victims)} pod(s) on {best.node}",
        node=best.node,
        victims=to_victims(best.victims, cluster, action=config.victim_action),
    )


# ---- the flow: its explanation, as recorded ----------------------------------------------


class PotentialVictim(TypedDict):
    """An eligible pod on the chosen node, in the order the reprieve tried them."""

    pod: str
    priority: int
    qos: str
    start: str | None
    pdbViolating: bool
    victim: bool  # evicted (else given back)


class Criteria(TypedDict):
    """A candidate node's ranking values (`criteria`)."""

    node: str
    pdbViolations: int
    highestVictimPriority: int | None
    prioritySum: int
    victims: int
    earliestStartOfHighest: str | None
    victimPods: list[str]
    searchCapped: NotRequired[bool]  # minimal mode: the best set found, not proven least
    potentialVictims: NotRequired[list[PotentialVictim]]  # the chosen node only


class RejectedNode(TypedDict):
    node: str
    reason: str


class Explanation(TypedDict, total=False):
    """A default-flow decision's `explanation`: the scan's figures (engine.index.explain; only
    `flow` when the preemptor fits), the preemptor, and the chosen node in detail."""

    flow: Required[str]
    notModelled: list[str]  # interpod.NOT_MODELLED: the whole explanation then, with `flow`
    candidates: list[Criteria]  # the best EXPLAIN_CANDIDATES, best first
    candidateCount: int
    rejected: list[RejectedNode]  # the first EXPLAIN_REJECTED by name
    rejectedCount: int
    rejectedReasons: dict[str, int]
    preemptorPriority: int
    victimSelection: str
    chosen: Criteria  # with potentialVictims


def _explanation(d: Mapping[str, Any]) -> Explanation:
    return cast(Explanation, flowbase.explanation_of(d))


# ---- the flow: explaining its records -----------------------------------------------------

# The explainer's order of QoS classes, best first (Guaranteed > Burstable > BestEffort).
QOS_RANK = {"Guaranteed": 2, "Burstable": 1, "BestEffort": 0}
# How many rejection reasons a text answer lists (the JSON has all the record has).
TOP_REASONS = 3


def _criteria_order(mode: str) -> list[tuple[str, str]]:
    """(criterion, what wins on it), in the order candidate nodes are ranked (docs/semantics.md)."""
    shifted = ("shiftedSum", "a smaller sum of victim priorities (each counted from -2^31)")
    count = ("victims", "fewer victims")
    head = [
        ("pdbViolations", "fewer PDB violations"),
        ("highestVictimPriority", "a lower highest victim priority"),
    ]
    latest = ("earliestStartOfHighest", "a later start of its highest-priority victims")
    if mode == "minimal":
        return [*head, count, shifted, latest]
    return [*head, shifted, count, latest]


def _value(c: Mapping[str, Any], name: str) -> Any:
    if name == "shiftedSum":
        return int(c.get("prioritySum") or 0) + int(c.get("victims") or 0) * PRIORITY_SHIFT
    if name == "highestVictimPriority":
        v = c.get("highestVictimPriority")
        return -PRIORITY_SHIFT if v is None else v
    if name == "earliestStartOfHighest":
        return c.get("earliestStartOfHighest") or "~"  # no start sorts last: the latest possible
    return c.get(name) or 0


def _show(c: Mapping[str, Any], name: str) -> str:
    if name == "shiftedSum":
        return f"priority sum {c.get('prioritySum')} over {c.get('victims')} victim(s)"
    return str(c.get(name))


def rank_reason(better: Mapping[str, Any], worse: Mapping[str, Any], mode: str) -> tuple[str, str]:
    """(criterion, sentence): the first criterion on which recorded candidate `better` beats `worse`."""
    # Candidates are recorded best first, so the first criterion that differs is the one it wins on.
    for name, wins in _criteria_order(mode):
        a, b = _value(better, name), _value(worse, name)
        if a != b:
            return name, (
                f"{better.get('node')} has {wins} ({_show(better, name)} vs {_show(worse, name)} "
                f"on {worse.get('node')})"
            )
    return "node", (
        f"{better.get('node')} and {worse.get('node')} tie on every criterion; the node name breaks the tie"
    )


def more_important(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """Why pod entry `a` outranks `b` in importance (priority, QoS, earlier start), or None if it does not."""
    pa, pb = int(a.get("priority") or 0), int(b.get("priority") or 0)
    if pa != pb:
        return f"higher priority ({pa} > {pb})" if pa > pb else None
    qa, qb = QOS_RANK.get(str(a.get("qos")), 0), QOS_RANK.get(str(b.get("qos")), 0)
    if qa != qb:
        return f"same priority, better QoS class ({a.get('qos')} > {b.get('qos')})" if qa > qb else None
    sa, sb = a.get("start") or "~", b.get("start") or "~"
    if sa != sb:
        return (
            f"same priority and QoS, started earlier ({a.get('start')} < {b.get('start')})"
            if sa < sb
            else None
        )
    return None


def _rejected(ex: Explanation) -> str | None:
    reasons = as_dict(ex.get("rejectedReasons"))
    count = ex.get("rejectedCount") or sum(int(n) for n in reasons.values())
    if not count:
        return None
    top = sorted(reasons.items(), key=lambda kv: (-int(kv[1]), kv[0]))[:TOP_REASONS]
    shown = "; ".join(f"{n}× {r}" for r, n in top)
    more = " …" if len(reasons) > TOP_REASONS else ""
    return f"{count} node(s) rejected: {shown}{more}"


def _node_choice(ex: Explanation, chosen: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Why the chosen node, against the runner-up; lines and facts."""
    mode = str(ex.get("victimSelection") or "kubernetes")
    candidates = [c for c in as_list(ex.get("candidates")) if isinstance(c, dict)]
    count = int(ex.get("candidateCount") or len(candidates))
    runner = next((c for c in candidates if c.get("node") != chosen.get("node")), None)
    facts: dict[str, Any] = {"candidateNodes": count, "victimSelection": mode}
    lines = []
    if runner is None:
        lines.append(f"{chosen.get('node')} was the only node where evicting lower-priority pods makes room")
    else:
        criterion, why = rank_reason(chosen, runner, mode)
        facts.update(runnerUp=runner.get("node"), decidedBy=criterion)
        lines.append(f"{chosen.get('node')} ranked first of {count} candidate node(s): {why}")
    rejected = _rejected(ex)
    if rejected:
        lines.append(rejected)
    return lines, facts


def _why_this_pod(pod: str, ex: Explanation, victim: Mapping[str, Any], facts: dict[str, Any]) -> list[str]:
    chosen = as_dict(ex.get("chosen"))
    entries = [e for e in as_list(chosen.get("potentialVictims")) if isinstance(e, dict)]
    node = chosen.get("node")
    if ex.get("victimSelection") == "minimal":
        facts["reprieved"] = [e.get("pod") for e in entries if not e.get("victim")] if entries else None
        kept = f" ({', '.join(str(x) for x in facts['reprieved'])} left in place)" if entries else ""
        return [
            f"victimSelection minimal: of the eligible pods on {node}, the victim set chosen is the one "
            "with the fewest PDB violations, then the lowest highest priority, then the fewest victims, "
            f"then the smallest priority sum{kept}: one pod that frees enough beats several smaller ones"
        ]
    if not entries:
        facts["reprieved"] = None
        return [
            f"the record does not list the pods given back on {node} (no potentialVictims in the "
            "explanation): lower-priority pods are given back most important first (higher priority, "
            "then QoS class, then earlier start), pods whose eviction would violate a PDB first, and "
            "this pod's return would "
            "have left the preemptor without room"
        ]
    me = next((e for e in entries if e.get("pod") == pod), dict(victim, pod=pod))
    spared = [e for e in entries if not e.get("victim")]
    facts["reprieved"] = [e.get("pod") for e in spared]
    lines = [
        f"on {node} the engine removed {len(entries)} lower-priority pod(s), then gave them back in "
        f"this order: {', '.join(str(e.get('pod')) for e in entries)}; a pod whose return left the "
        "preemptor without room stayed a victim"
    ]
    for e in spared:
        if e.get("pdbViolating") and not me.get("pdbViolating"):
            why = "evicting it would violate a PDB, and those are given back first"
        else:
            why = more_important(e, me) or "less important, but small enough to fit back in the room left"
        lines.append(f"{e.get('pod')} was given back: {why}")
    if not spared:
        lines.append(f"every eligible pod on {node} had to go: none could be given back")
    return lines


def explain_victim(pod: str, d: Mapping[str, Any], victim: Mapping[str, Any]) -> Told:
    """Why this pod was evicted: eligible, the chosen node against the runner-up, and why this
    pod rather than its neighbours (the reprieve order, or minimal mode's victim set)."""
    ex = _explanation(d)
    pre_prio = ex.get("preemptorPriority")
    facts: dict[str, Any] = {"preemptorPriority": pre_prio}
    details = [
        f"eligible: priority {victim.get('priority')} is below the preemptor's {pre_prio}, "
        "and it does not tolerate the preemptor"
    ]
    chosen = as_dict(ex.get("chosen"))
    lines, choice = _node_choice(ex, chosen)
    facts.update(choice)
    details += lines
    details += _why_this_pod(pod, ex, victim, facts)
    return Told(details, facts)


def explain_survivor(pod: str, d: Mapping[str, Any]) -> Told | None:
    """A candidate victim that stayed: given back on the chosen node, or on a node that ranked worse."""
    ex = _explanation(d)
    outcome = d.get("outcome")
    evicted = ", ".join(victim_keys(d)) or "no one"
    chosen = as_dict(ex.get("chosen"))
    mode = str(ex.get("victimSelection") or "kubernetes")
    entry = next(
        (e for e in as_list(chosen.get("potentialVictims")) if isinstance(e, dict) and e.get("pod") == pod),
        None,
    )
    if entry is not None:
        evicted_entries = [
            e for e in as_list(chosen.get("potentialVictims")) if isinstance(e, dict) and e.get("victim")
        ]
        details = [f"a lower-priority pod on the chosen node {chosen.get('node')}, given back: "]
        if mode == "minimal":
            details[0] = (
                f"a lower-priority pod on the chosen node {chosen.get('node')}, left in place: "
                "victimSelection minimal chose the least disruptive victim set there (fewest PDB "
                "violations, lowest highest priority, fewest victims, smallest priority sum), "
                "and it is not in it"
            )
        elif entry.get("pdbViolating"):
            details[0] += "evicting it would violate a PDB, and those are given back first"
        else:
            beats = [(v.get("pod"), more_important(entry, v)) for v in evicted_entries]
            if beats and all(reason for _, reason in beats):
                details[0] += "it outranks every victim: " + "; ".join(f"vs {p}: {r}" for p, r in beats)
            else:
                details[0] += (
                    "it was tried after more important pods came back and the preemptor still had "
                    "room with it"
                )
        details.append(f"evicted instead: {evicted}")
        facts = {
            "node": chosen.get("node"),
            "as": "reprieved",
            "priority": entry.get("priority"),
            "victims": [v.get("pod") for v in evicted_entries],
        }
        return Told(details, facts, f"given back on {chosen.get('node')} for {d.get('preemptor')}")
    candidates = [c for c in as_list(ex.get("candidates")) if isinstance(c, dict)]
    for rank, c in enumerate(candidates, 1):
        if pod in as_list(c.get("victimPods")) and c.get("node") != chosen.get("node"):
            facts = {
                "node": c.get("node"),
                "as": "other-candidate-node",
                "rank": rank,
                "chosenNode": chosen.get("node") or d.get("node"),
            }
            details = [
                f"it would have been a victim on {c.get('node')} (candidate {rank} of "
                f"{ex.get('candidateCount', len(candidates))})"
            ]
            if chosen:
                criterion, why = rank_reason(chosen, c, mode)
                facts["decidedBy"] = criterion
                details.append(f"but {why}")
                details.append(f"evicted instead: {evicted} on {chosen.get('node')}")
            else:
                details.append(f"but no pod was evicted: outcome {outcome} ({d.get('reason')})")
            return Told(
                details,
                facts,
                f"spared: {d.get('preemptor')} went to "
                f"{chosen.get('node') or d.get('node') or 'no node'}, not {c.get('node')}",
            )
    return None


def explain_preemptor(pod: str, d: Mapping[str, Any]) -> Told:
    """Where the preemptor was nominated and why that node, or why it fits, or why it stays pending."""
    ex = _explanation(d)
    outcome, reason = str(d.get("outcome")), str(d.get("reason"))
    victims = victim_keys(d)
    facts: dict[str, Any] = {"node": d.get("node")}
    details = [f"priority {ex.get('preemptorPriority')}"]
    if outcome == "preempt":
        chosen = as_dict(ex.get("chosen"))
        lines, choice = _node_choice(ex, chosen)
        facts.update(choice)
        summary = f"nominated to {d.get('node')}, evicting {', '.join(victims) or 'no one'}"
        details += lines
        details.append(
            f"{d.get('node')}: {chosen.get('victims')} victim(s), highest priority "
            f"{chosen.get('highestVictimPriority')}, {chosen.get('pdbViolations')} PDB violation(s)"
        )
        leaving = [
            key_of(v) for v in as_list(d.get("victims")) if isinstance(v, dict) and v.get("terminating")
        ]
        facts["alreadyLeaving"] = leaving
        if leaving:
            # Seed 004 Example 2: a higher-priority pod takes over a node whose victims are leaving.
            details.append(
                f"{len(leaving)} of its victims were already terminating (an earlier decision's): no new "
                f"eviction for {', '.join(leaving)}"
            )
    elif outcome == "fits":
        summary = f"fits on {d.get('node')} without preemption"
    else:
        summary = f"{outcome}: {reason}"
        rejected = _rejected(ex)
        if rejected:
            details.append(rejected)
        facts["rejectedReasons"] = as_dict(ex.get("rejectedReasons"))
    return Told(details, facts, summary)


# ---- the flow, as the registry (engine.flows) holds it ------------------------------------

NAME = "default"


class DefaultFlow:
    """Kubernetes pod preemption: the flow of every preemptor no other flow takes."""

    name = NAME
    explanation = Explanation

    def applies(self, cluster: Cluster, pods: Sequence[Pod]) -> bool:
        return True  # the catch-all: last in the registry

    def decide(
        self, cluster: Cluster, pods: Sequence[Pod], *, now: int, config: Config, index: Scanner
    ) -> Decision:
        return decide(cluster, pods[0], now=now, config=config, index=index)

    def reference(
        self, cluster: Cluster, pods: Sequence[Pod], now: int, config: Config
    ) -> dict[str, Any] | None:
        # The literal reference knows the kubernetes victim selection only.
        if config.victim_selection != "kubernetes":
            return None
        return reference.decide(cluster, pods[0], now)

    def places(self, pod: str, d: Mapping[str, Any]) -> bool:
        return False  # one preemptor, the record's own

    def explain_preemptor(self, pod: str, d: Mapping[str, Any]) -> Told:
        return explain_preemptor(pod, d)

    def explain_victim(self, pod: str, d: Mapping[str, Any], victim: Mapping[str, Any]) -> Told:
        return explain_victim(pod, d, victim)

    def explain_survivor(self, pod: str, d: Mapping[str, Any]) -> Told | None:
        return explain_survivor(pod, d)

    def unnamed_spared(self, d: Mapping[str, Any]) -> str | None:
        # Records from before potentialVictims name only the victims on their chosen node.
        chosen = as_dict(_explanation(d).get("chosen"))
        if d.get("outcome") == "preempt" and "potentialVictims" not in chosen:
            return (
                "do not list the pods given back on their chosen node (no potentialVictims in the "
                "explanation): a pod that was on such a node and was spared is not mentioned by them"
            )
        return None


FLOW = DefaultFlow()
