"""The DaemonSet flow: YuniKorn's simple preemptor for pods pinned to one node (seed 003).

This module owns the DaemonSet pod's required node, the reservation start
delay, which pods on that node are candidates and in what order (class, then
priority, age and size), and the victim selection strategies (`single`,
`multiple`) tried in the configured order. Nothing else is considered: a
DaemonSet pod can run on one node only, so there is no node choice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Required, TypedDict, cast

from engine import decision as decision_mod
from engine import default, flowbase, interpod, placement, reference, resources, timeutil
from engine.cluster import Cluster, NodeState
from engine.config import Config
from engine.decision import FITS, PREEMPT, UNSCHEDULABLE, WAIT, Decision
from engine.default import Preemptor
from engine.flowbase import Told, as_dict, as_list
from engine.objects import Pod
from engine.resources import Resources
from engine.victims import leaving, to_victims

ALLOW_PREEMPTION = "yunikorn.apache.org/allow-preemption"
REGULAR, OWNER, OPT_OUT = 0, 1, 2
CLASS_NAMES = {REGULAR: "regular", OWNER: "owner", OPT_OUT: "opt-out"}
# The explanation lists this many ordered candidates; the rest are counted.
EXPLAIN_CANDIDATES = 20


@dataclass(frozen=True, slots=True)
class Candidate:
    pod: Pod
    klass: int
    priority: int


def opted_out(pod: Pod) -> bool:
    """`yunikorn.apache.org/allow-preemption: "false"` as a label or an annotation."""
    return any(
        (source.get(ALLOW_PREEMPTION) or "").strip().lower() == "false"
        for source in (pod.labels, pod.annotations)
    )


def owners_among(cluster: Cluster, uids: set[str]) -> set[str]:
    """Which of `uids` another pod names in its ownerReferences (a driver and its executors)."""
    return {uid for uid in uids if cluster.owns(uid)}


def _size(pod: Pod, request: Resources, allocatable: Resources) -> Fraction:
    """How big a pod is for this DaemonSet pod: its share of the node in the resources asked for."""
    share = Fraction(0)
    for r, amount in request.items():
        if r != "pods" and amount > 0 and allocatable.get(r, 0) > 0:
            share += Fraction(pod.requests.get(r, 0), allocatable[r])
    return share


def _sizer(request: Resources, allocatable: Resources) -> Callable[[Pod], int]:
    """`_size` times one positive integer for the whole node: the same order, in integers.

    The share is a sum of request / allocatable over the resources asked for; times the
    product of those allocatables every term is an integer. Candidates are sorted by
    size thousands of times a second, and a Fraction per term cost most of a decision.
    """
    terms = [
        (r, allocatable[r])
        for r, amount in request.items()
        if r != "pods" and amount > 0 and allocatable.get(r, 0) > 0
    ]
    scale = 1
    for _, have in terms:
        scale *= have
    weights = [(r, scale // have) for r, have in terms]

    def size(pod: Pod) -> int:
        requests = pod.requests
        return sum(requests.get(r, 0) * w for r, w in weights)

    return size


def candidates(cluster: Cluster, state: NodeState, ds: Pod, priority: int, now: int) -> list[Candidate]:
    """Every pod on the node that may be evicted for `ds`, in the seed's order.

    Excluded: DaemonSet pods, pods already leaving (terminating, or soft-evicted by a
    job decision: acting on them again would make them fresh victims of two live
    decisions), higher-priority pods and pods whose PriorityClass tolerates the
    DaemonSet pod. Order: class (regular, owner, opt-out), lower priority, younger
    (creationTimestamp, else start time), larger share of what the DaemonSet pod
    asks, then uid. A pod that is both an owner and opted out gets the more
    protective class, opt-out.
    """
    eligible = [
        p
        for p in state.pods.values()
        if p.uid != ds.uid
        and not p.daemonset
        and not leaving(p)
        and cluster.priority(p) <= priority
        and not cluster.tolerates(p, preemptor_priority=priority, now=now)
    ]
    owners = owners_among(cluster, {p.uid for p in eligible})

    def klass(p: Pod) -> int:
        if opted_out(p):
            return OPT_OUT
        return OWNER if p.uid in owners else REGULAR

    out = [Candidate(p, klass(p), cluster.priority(p)) for p in eligible]
    size = _sizer(ds.requests, state.node.allocatable)  # `_size`, scaled to integers

    def order(c: Candidate) -> tuple[int, int, int, int, str]:
        born = c.pod.created if c.pod.created is not None else c.pod.start
        return (c.klass, c.priority, -born, -size(c.pod), c.pod.uid)

    return sorted(out, key=order)


def deviation(victim: Pod, request: Resources) -> Fraction | None:
    """The largest relative difference between a victim's requests and the DaemonSet pod's.

    Every resource the victim requests counts; one the DaemonSet pod does not ask
    for makes the victim no match at all (None).
    """
    # The largest |amount - want| / want, compared as integers (a/b > c/d when a*d > c*b):
    # one Fraction per call, not one per resource.
    num, den = 0, 1
    for r, amount in victim.requests.items():
        want = request.get(r, 0)
        if want <= 0:
            return None
        gap = abs(amount - want)
        if gap * den > num * want:
            num, den = gap, want
    return Fraction(num, den)


def _single(
    ordered: Sequence[Candidate], free: Resources, request: Resources, percent: int
) -> tuple[list[Pod] | None, str]:
    matches: list[tuple[Fraction, int, Pod]] = []
    for i, c in enumerate(ordered):
        dev = deviation(c.pod, request)
        if dev is None or dev * 100 > percent:
            continue
        after = dict(free)
        resources.add(after, c.pod.requests)
        if resources.fits(request, after):
            matches.append((dev, i, c.pod))
    if not matches:
        return None, f"no single candidate within {percent}% of the request frees enough"
    dev, _, pod = min(matches, key=lambda m: (m[0], m[1]))
    return [pod], f"{pod.namespace}/{pod.name} deviates {float(dev * 100):.2f}%"


def _multiple(
    ordered: Sequence[Candidate], free: Resources, request: Resources, limit: int
) -> tuple[list[Pod] | None, str]:
    after = dict(free)
    chosen: list[Pod] = []
    for c in ordered:
        if len(chosen) == limit:
            return None, f"more than maxVictims {limit} victims needed"
        chosen.append(c.pod)
        resources.add(after, c.pod.requests)
        if resources.fits(request, after):
            return chosen, f"{len(chosen)} victim(s) in candidate order"
    return None, f"all {len(chosen)} candidate(s) together do not free enough"


def _waiting_on_previous(cluster: Cluster, state: NodeState, ds: Pod, priority: int) -> str | None:
    """An earlier decision for this pod is still evicting on its node.

    Not the default flow's rule (DisruptionTarget reason PreemptionByScheduler only): any
    DisruptionTarget reason holds, because this flow's `evict` victims carry the Eviction
    API's reason, and terminating pods are never candidates, so deciding again now would
    pick further victims while the first ones are still leaving (docs/semantics.md §6).
    """
    if ds.nominated != state.node.name:
        return None
    for pod in sorted(state.pods.values(), key=lambda p: p.uid):
        if pod.deleting and pod.disruption_target and not pod.daemonset and cluster.priority(pod) <= priority:
            return f"victim {pod.namespace}/{pod.name} of an earlier preemption is still terminating"
    return None


def _explain_candidate(c: Candidate, request: Resources) -> dict[str, Any]:
    dev = deviation(c.pod, request)
    return {
        "pod": c.pod.key,
        "class": CLASS_NAMES[c.klass],
        "priority": c.priority,
        "created": None if c.pod.created is None else timeutil.render(c.pod.created),
        "requests": resources.render(c.pod.requests),
        "deviationPercent": None if dev is None else float(dev * 100),
    }


def decide(cluster: Cluster, pod: Pod, *, now: int, config: Config) -> Decision:
    """Decide for one DaemonSet pod on its required node."""
    priority = cluster.priority(pod)
    node = placement.required_node(pod)
    settings = config.daemonset
    explanation: dict[str, Any] = {
        "flow": "daemonset",
        "node": node,
        "preemptorPriority": priority,
        "request": resources.render(pod.requests),
    }

    make = decision_mod.maker("daemonset", pod.key, pod.uid, explanation)

    missing = interpod.not_modelled([pod])
    if missing:
        explanation[interpod.NOT_MODELLED] = missing
        return make(UNSCHEDULABLE, interpod.not_modelled_reason(missing))
    state = cluster.nodes.get(node) if node else None
    if state is None:
        return make(UNSCHEDULABLE, f"required node {node} does not exist" if node else "no required node")
    why = placement.unresolvable(state.node, pod)
    if why is not None:
        return make(UNSCHEDULABLE, f"required node {node}: {why}")
    pre = Preemptor(pod, priority, pod.requests)
    free = default.free_for(cluster, state, pre)
    own: dict[str, Pod] = {}
    if pod.uid in state.pods:
        # Bound by nodeName but not admitted yet (the DaemonSet controller's old way):
        # the index counts it on the node, yet it is the pod asking for room.
        resources.add(free, pod.requests)
        own[pod.uid] = pod
    explanation["free"] = resources.render({k: v for k, v in free.items() if k in pod.requests})
    filters = interpod.Filters(cluster, pod)
    nominated = default.nominated_pods(cluster, state.node.name, pre) if filters.active else []
    view = filters.view(state, nominated)
    for mine in own.values():
        view.remove(mine)
    if filters.active:
        # Host ports, pod (anti-)affinity and spread on the required node (engine.interpod).
        status = view.status(resources.fits(pod.requests, free))
        if status is None:
            return make(FITS, f"fits on {node} without preemption", node=node)
        if status[0] == interpod.UNRESOLVABLE:
            return make(UNSCHEDULABLE, f"required node {node}: {status[1]}")
    elif resources.fits(pod.requests, free):
        return make(FITS, f"fits on {node} without preemption", node=node)
    if not default.may_preempt(cluster, pod):
        return make(UNSCHEDULABLE, "preemptionPolicy is Never: the pod may not preempt")

    since = pod.unschedulable_since if pod.unschedulable_since is not None else pod.created
    delay = settings.preemption_start_delay_seconds * timeutil.SECOND
    if delay > 0:
        # Without any timestamp the age is unknown; waiting is the side that never evicts early.
        age = None if since is None else now - since
        explanation["reservationAgeSeconds"] = None if age is None else age / timeutil.SECOND
        if age is None or age < delay:
            return make(
                WAIT, f"reservation younger than the {settings.preemption_start_delay_seconds}s start delay"
            )
    waiting = _waiting_on_previous(cluster, state, pod, priority)
    if waiting is not None:
        return make(WAIT, waiting)

    ordered = candidates(cluster, state, pod, priority, now)
    explanation["candidates"] = [_explain_candidate(c, pod.requests) for c in ordered[:EXPLAIN_CANDIDATES]]
    explanation["candidateCount"] = len(ordered)
    required: list[Pod] = []
    if filters.active:
        # Pods holding a wanted port or in the way of an anti-affinity must go whatever the
        # strategy picks for resources; they free their resources first.
        eligible = {c.pod.uid for c in ordered}
        required = filters.blockers(state, own)
        held = next((p for p in required if p.uid not in eligible), None)
        if held is not None:
            return make(
                UNSCHEDULABLE, f"required node {node}: {held.key} is in the way and may not be evicted"
            )
        explanation["required"] = [p.key for p in required]
        free = dict(free)
        for p in required:
            resources.add(free, p.requests)
        taken = {p.uid for p in required}
        ordered = [c for c in ordered if c.pod.uid not in taken]
    attempts: list[dict[str, str]] = []
    explanation["strategies"] = attempts
    for strategy in settings.victim_selection_strategy:
        victims: list[Pod] | None
        if required and resources.fits(pod.requests, free):
            victims, result = [], "the pods in the way free enough"
        elif strategy == "single":
            victims, result = _single(ordered, free, pod.requests, settings.single_victim_deviation_percent)
        else:
            victims, result = _multiple(ordered, free, pod.requests, settings.max_victims)
        attempts.append({"strategy": strategy, "result": result})
        if victims is not None and filters.active:
            victims = [*required, *victims]
            for victim in victims:
                view.remove(victim)
            blocked = view.status(True)
            for victim in victims:
                view.add(victim)
            if blocked is not None:
                return make(UNSCHEDULABLE, f"required node {node}: {blocked[1]} even with its victims gone")
        if victims:
            return make(
                PREEMPT,
                f"{strategy}: preempt {len(victims)} pod(s) on {node}",
                node=node,
                victims=to_victims(victims, cluster, action=config.victim_action),
            )
    short = resources.shortfall(pod.requests, free)
    return make(
        UNSCHEDULABLE,
        f"no strategy frees {', '.join(f'{k} {v}' for k, v in short.items())} on {node}",
    )


# ---- the flow, as the registry (engine.flows) holds it ------------------------------------

NAME = "daemonset"

# One ordered candidate on the required node (`_explain_candidate`); `class` is a keyword.
CandidateExplanation = TypedDict(
    "CandidateExplanation",
    {
        "pod": str,
        "class": str,  # CLASS_NAMES
        "priority": int,
        "created": str | None,
        "requests": dict[str, str],
        "deviationPercent": float | None,
    },
)


class StrategyAttempt(TypedDict):
    strategy: str  # single | multiple
    result: str


class Explanation(TypedDict, total=False):
    """A DaemonSet-flow decision's `explanation`."""

    flow: Required[str]
    node: Required[str | None]  # the required node
    preemptorPriority: Required[int]
    request: Required[dict[str, str]]
    notModelled: list[str]  # interpod.NOT_MODELLED
    free: dict[str, str]  # on the required node, for the requested resources
    reservationAgeSeconds: float | None  # with a start delay configured
    candidates: list[CandidateExplanation]  # the first EXPLAIN_CANDIDATES, in order
    candidateCount: int
    required: list[str]  # pods in the way of the inter-pod filters, evicted whatever the strategy
    strategies: list[StrategyAttempt]  # in the order tried


def _explanation(d: Mapping[str, Any]) -> Explanation:
    return cast(Explanation, flowbase.explanation_of(d))


def _res(value: Any) -> str:
    """{"cpu": "1", "pods": "1"} -> "cpu 1, pods 1"."""
    return ", ".join(f"{k} {v}" for k, v in sorted(as_dict(value).items())) or "nothing"


class DaemonSetFlow:
    """A DaemonSet pod, alone: preemption on its one required node."""

    name = NAME
    explanation = Explanation

    def applies(self, cluster: Cluster, pods: Sequence[Pod]) -> bool:
        return len(pods) == 1 and pods[0].daemonset

    def decide(
        self, cluster: Cluster, pods: Sequence[Pod], *, now: int, config: Config, index: object
    ) -> Decision:
        return decide(cluster, pods[0], now=now, config=config)  # one node: no index to rank

    def reference(
        self, cluster: Cluster, pods: Sequence[Pod], now: int, config: Config
    ) -> dict[str, Any] | None:
        return reference.decide_daemonset(cluster, pods[0], now, config)

    def places(self, pod: str, d: Mapping[str, Any]) -> bool:
        return False  # one preemptor, the record's own

    def explain_preemptor(self, pod: str, d: Mapping[str, Any]) -> Told:
        """Its required node, what it asks and what is free there, and each strategy's result."""
        ex = _explanation(d)
        outcome, reason = str(d.get("outcome")), str(d.get("reason"))
        victims = flowbase.victim_keys(d)
        details = [
            f"DaemonSet pod: only its required node {ex.get('node')} counts (request "
            f"{_res(ex.get('request'))}; free {_res(ex.get('free'))})"
        ]
        for s in as_list(ex.get("strategies")):
            if isinstance(s, dict):
                details.append(f"strategy {s.get('strategy')}: {s.get('result')}")
        details.append(f"outcome {outcome}: {reason}")
        summary = f"{outcome} on {ex.get('node')}" + (f", evicting {', '.join(victims)}" if victims else "")
        return Told(details, {"node": d.get("node") or ex.get("node")}, summary)

    def explain_victim(self, pod: str, d: Mapping[str, Any], victim: Mapping[str, Any]) -> Told:
        """Its place in the candidate order on the required node, and the strategy that took it."""
        ex = _explanation(d)
        candidates = [c for c in as_list(ex.get("candidates")) if isinstance(c, dict)]
        position = next((i for i, c in enumerate(candidates) if c.get("pod") == pod), None)
        strategies = [s for s in as_list(ex.get("strategies")) if isinstance(s, dict)]
        used = strategies[-1] if strategies else {}
        facts = {
            "preemptorPriority": ex.get("preemptorPriority"),
            "position": None if position is None else position + 1,
            "strategy": used.get("strategy"),
        }
        lines = [
            f"DaemonSet pod {d.get('preemptor')} needs its required node {ex.get('node')} (request "
            f"{_res(ex.get('request'))}; free {_res(ex.get('free'))})"
        ]
        if position is not None:
            me = candidates[position]
            lines.append(
                f"candidate {position + 1} of {ex.get('candidateCount', len(candidates))} in the order "
                f"(class regular < owner < opt-out, then lower priority, then younger, then larger): class "
                f"{me.get('class')}, priority {me.get('priority')}, created {me.get('created')}"
            )
        if used:
            lines.append(f"strategy {used.get('strategy')}: {used.get('result')}")
        return Told(lines, facts)

    def explain_survivor(self, pod: str, d: Mapping[str, Any]) -> Told | None:
        """A candidate on the required node that the strategy did not need."""
        ex = _explanation(d)
        outcome = d.get("outcome")
        victims = flowbase.victim_keys(d)
        evicted = ", ".join(victims) or "no one"
        candidates = [c for c in as_list(ex.get("candidates")) if isinstance(c, dict)]
        position = next((i for i, c in enumerate(candidates) if c.get("pod") == pod), None)
        if position is None:
            return None
        strategies = [s for s in as_list(ex.get("strategies")) if isinstance(s, dict)]
        used = strategies[-1] if strategies else {}
        facts = {
            "node": ex.get("node"),
            "as": "daemonset-candidate",
            "position": position + 1,
            "victims": victims,
        }
        details = [
            f"candidate {position + 1} of {ex.get('candidateCount', len(candidates))} on {ex.get('node')}"
            f" (class {candidates[position].get('class')}, priority {candidates[position].get('priority')},"
            f" created {candidates[position].get('created')})"
        ]
        if outcome == "preempt":
            details.append(
                f"strategy {used.get('strategy')} ({used.get('result')}) took {evicted}: enough room "
                "without this pod"
            )
        return Told(details, facts, f"spared on {ex.get('node')}: {outcome}, evicted {evicted}")

    def unnamed_spared(self, d: Mapping[str, Any]) -> str | None:
        return None  # no note for this flow: its answers say what the record lists


FLOW = DaemonSetFlow()
