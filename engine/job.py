"""The job flow: job-level preemption on ElasticQuota (seed 001, the Koordinator proposal).

This module owns what makes a pod part of a job (pod group, ElasticQuota
membership), the quota arithmetic (used, nonPreemptibleUsed and the seed's
admission formulas), who may trigger preemption and who may be preempted, the
all-or-nothing placement of a gang, the "previous round unfinished" wait, and
the soft-eviction patch the actuator writes on `label` victims.

A decision follows the seed's PostFilter: the quota gate (the admission
formulas; it also gates `fits`, so no outcome takes a quota past its limits);
the gang placed one member at a time in name order (a node where it fits
without eviction, else the node the default flow's criteria rank best, given
the members already placed and the evictions already committed) and `fits` if
nobody had to go; then may-trigger, the previous-round wait, all-or-nothing;
finally every job-eligible pod on the chosen nodes is removed and assigned back
in importance order while all members still fit, so only the pods the gang
really needs are evicted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, Required, TypedDict, cast

from engine import decision as decision_mod
from engine import default, flowbase, interpod, quantity, reference, resources
from engine import index as index_mod
from engine.cluster import Cluster, NodeState
from engine.config import Config
from engine.decision import DELETE, FITS, LABEL, PREEMPT, UNSCHEDULABLE, WAIT, Decision, Victim
from engine.default import NodeEval, Preemptor
from engine.flowbase import Told, as_dict, as_list
from engine.index import Index
from engine.objects import PREEMPT_LOWER, PREEMPT_NEVER, ElasticQuota, Pod
from engine.resources import Resources
from engine.victims import SOFT_EVICTION, soft_evicted, to_victims

POD_GROUP = "pod-group.scheduling.sigs.k8s.io"
QUOTA_NAME = "quota.scheduling.koordinator.sh/name"
PREEMPTIBLE = "quota.scheduling.koordinator.sh/preemptible"
CAN_PREEMPT = "quota.scheduling.koordinator.sh/can-preempt"
# Per member, the explanation lists this many ranked candidate nodes and rejected nodes.
EXPLAIN_NODES = 5


# ---- membership and pod properties ---------------------------------------------------


def _truthy(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() == "true"


def quota_resolver_by_labels(cluster: Cluster) -> Callable[[str, str], ElasticQuota | None]:
    """The quota of a pod in `namespace` whose quota-name label is `label` ("" when absent)."""
    by_name: dict[str, list[ElasticQuota]] = {}
    by_namespace: dict[str, ElasticQuota] = {}
    for q in sorted(cluster.quotas.values(), key=lambda q: (q.namespace, q.name, q.uid)):
        by_name.setdefault(q.name, []).append(q)
        by_namespace.setdefault(q.namespace, q)

    def resolve(namespace: str, label: str) -> ElasticQuota | None:
        named = by_name.get(label)
        if named:
            return next((q for q in named if q.namespace == namespace), named[0])
        return by_namespace.get(namespace)

    return resolve


def quota_resolver(cluster: Cluster) -> Callable[[Pod], ElasticQuota | None]:
    """`quota_of` for many pods: the quotas indexed once by name and by namespace."""
    by_labels = quota_resolver_by_labels(cluster)
    return lambda pod: by_labels(pod.namespace, pod.labels.get(QUOTA_NAME) or "")


def quota_of(cluster: Cluster, pod: Pod) -> ElasticQuota | None:
    """The ElasticQuota a pod is charged to: its quota-name label, else its namespace's quota.

    Quota names are meant to be unique cluster-wide (Koordinator's quota tree); when
    several share the name, the one in the pod's namespace wins, then namespace order.
    A label naming a quota that does not exist falls back to the namespace's quota
    (the first by name if there are several), as Koordinator falls back to its
    default quota.
    """
    return quota_resolver(cluster)(pod)


def is_job_pod(cluster: Cluster, pod: Pod) -> bool:
    """Does this pod take the job flow: a pod-group member, or charged to an ElasticQuota?"""
    return bool(pod.labels.get(POD_GROUP)) or quota_of(cluster, pod) is not None


def is_preemptible(pod: Pod, config: Config) -> bool:
    """The preemptible label decides; without it, preemptible unless disableDefaultPreemptible."""
    label = pod.labels.get(PREEMPTIBLE)
    if label is None:
        return not config.quota.disable_default_preemptible
    return label.strip().lower() == "true"


def _preemptible_by_default(pod: Pod) -> bool:
    """`is_preemptible` when disableDefaultPreemptible is off: one call per pod, for summaries."""
    label = pod.labels.get(PREEMPTIBLE)
    return True if label is None else label.strip().lower() == "true"


def _preemptible_if_labelled(pod: Pod) -> bool:
    """`is_preemptible` when disableDefaultPreemptible is on."""
    label = pod.labels.get(PREEMPTIBLE)
    return False if label is None else label.strip().lower() == "true"


def keeper(config: Config) -> Callable[[Pod], bool]:
    """`is_preemptible` under `config` as a one-argument function (summaries call it per pod)."""
    return _preemptible_if_labelled if config.quota.disable_default_preemptible else _preemptible_by_default


def preemptible_by(label: str | None, config: Config) -> bool:
    labelled = _truthy(label)
    if labelled is None:
        return not config.quota.disable_default_preemptible
    return labelled


def trigger_refusal(cluster: Cluster, pod: Pod, config: Config) -> str | None:
    """Why this pod may not trigger preemption (seed: Key Concept 2), or None when it may."""
    policy = cluster.preemption_policy(pod)
    if policy == PREEMPT_NEVER:
        return "preemptionPolicy is Never"
    if _truthy(pod.labels.get(CAN_PREEMPT)):
        return None
    if policy != PREEMPT_LOWER:
        return f"preemptionPolicy is {policy} and the pod is not labelled {CAN_PREEMPT}=true"
    if config.quota.disable_default_trigger_preemption:
        return f"disableDefaultTriggerPreemption is set and the pod is not labelled {CAN_PREEMPT}=true"
    return None


def may_trigger(cluster: Cluster, pod: Pod, config: Config) -> bool:
    return trigger_refusal(cluster, pod, config) is None


def job_name(pods: Sequence[Pod]) -> str:
    """The job's name, "ns/<pod-group>", or "ns/<pod>" for a pod that is a job on its own."""
    first = pods[0]
    return f"{first.namespace}/{first.labels.get(POD_GROUP) or first.name}"


def gang(cluster: Cluster, pods: Sequence[Pod]) -> list[Pod]:
    """The members to place, in name order.

    Several pods are the gang as the caller gave it (a conformance case lists every
    member). A single pod-group pod brings in every pending pod of its group in its
    namespace, as the coscheduling plugin gathers a PodGroup; pods already being
    deleted are not waited for.
    """
    members = {p.uid: p for p in pods}
    if len(pods) == 1 and pods[0].labels.get(POD_GROUP):
        for p in cluster.pending_in_group(pods[0].namespace, pods[0].labels[POD_GROUP]):
            if not p.deleting:
                members.setdefault(p.uid, p)
    return sorted(members.values(), key=lambda p: (p.namespace, p.name, p.uid))


def soft_eviction_annotation(decision_id: str, preemptor: str, job: str, reason: str) -> dict[str, Any]:
    """The merge patch that soft-evicts a `label` victim: the label, and the detail as an annotation."""
    detail = json.dumps(
        {"preemptJob": job, "preemptor": preemptor, "decisionId": decision_id, "reason": reason},
        sort_keys=True,
    )
    return {"metadata": {"labels": {SOFT_EVICTION: "true"}, "annotations": {SOFT_EVICTION: detail}}}


# ---- quota arithmetic ---------------------------------------------------------------


@dataclass(slots=True)
class QuotaUse:
    """One quota, what it already uses, and what the job asks of it."""

    quota: ElasticQuota
    used: Resources = field(default_factory=dict)
    non_preemptible_used: Resources = field(default_factory=dict)
    non_preemptible_request: Resources = field(default_factory=dict)
    preemptible_request: Resources = field(default_factory=dict)
    non_preemptible_members: int = 0
    preemptible_members: int = 0


def quota_use(cluster: Cluster, members: Sequence[Pod], config: Config) -> list[QuotaUse]:
    """Usage of every quota a member is charged to, from the bound, non-terminal pods charged to it."""
    resolve = quota_resolver(cluster)
    resolve_labels = quota_resolver_by_labels(cluster)
    by_uid: dict[str, QuotaUse] = {}
    for m in members:
        q = resolve(m)
        if q is None:
            continue
        use = by_uid.setdefault(q.uid, QuotaUse(q))
        if is_preemptible(m, config):
            resources.add(use.preemptible_request, m.requests)
            use.preemptible_members += 1
        else:
            resources.add(use.non_preemptible_request, m.requests)
            use.non_preemptible_members += 1
    if not by_uid:
        return []
    # The cluster keeps bound pods' requests summed by (namespace, quota label,
    # preemptible label): each group resolves to one quota, as each of its pods would.
    # Integer sums do not depend on the order they are added in.
    for (namespace, quota_label, preemptible_label), (requests, _) in cluster.usage.items():
        q = resolve_labels(namespace, quota_label)
        if q is None or q.uid not in by_uid:
            continue
        use = by_uid[q.uid]
        resources.add(use.used, requests)
        if not preemptible_by(preemptible_label, config):
            resources.add(use.non_preemptible_used, requests)
    return sorted(by_uid.values(), key=lambda u: (u.quota.namespace, u.quota.name, u.quota.uid))


def admission(use: QuotaUse, *, minus: Mapping[str, int] | None = None) -> tuple[bool, list[dict[str, Any]]]:
    """The seed's admission formulas, per resource named in the quota, with the numbers.

    Unnamed min is 0 and unnamed max unbounded (the ElasticQuota defaults). A
    non-preemptible job must stay within min: nonPreemptibleUsed + jobRequest <= min
    and used + jobRequest <= max. A preemptible job needs
    min(min, nonPreemptibleUsed) + preemptibleUsed + jobRequest <= max. A job of one
    kind gets exactly the seed's formulas; a mixed job must pass both, its
    non-preemptible members counting as non-preemptible usage. `minus` is usage
    about to leave (preemptible victims charged to this quota).
    """
    q = use.quota
    used = dict(use.used)
    if minus:
        resources.sub(used, minus)
    np_used = use.non_preemptible_used
    np_req, p_req = use.non_preemptible_request, use.preemptible_request
    checks: list[dict[str, Any]] = []

    def check(resource: str, formula: str, terms: list[int], limit: int) -> None:
        total = sum(terms)
        checks.append(
            {
                "resource": resource,
                "formula": formula,
                "value": " + ".join(quantity.render(resource, t) for t in terms)
                + f" = {quantity.render(resource, total)}",
                "limit": quantity.render(resource, limit),
                "ok": total <= limit,
            }
        )

    for r in sorted(set(q.min) | set(q.max)):
        lo = q.min.get(r, 0)
        np_now = np_used.get(r, 0)
        if use.non_preemptible_members:
            check(r, "nonPreemptibleUsed + jobRequest <= min", [np_now, np_req.get(r, 0)], lo)
            if r in q.max:
                check(
                    r,
                    "used + jobRequest <= max",
                    [used.get(r, 0), np_req.get(r, 0) + p_req.get(r, 0)],
                    q.max[r],
                )
        if use.preemptible_members and r in q.max:
            check(
                r,
                "min(min, nonPreemptibleUsed) + preemptibleUsed + jobRequest <= max",
                [min(lo, np_now + np_req.get(r, 0)), used.get(r, 0) - np_now, p_req.get(r, 0)],
                q.max[r],
            )
    return all(c["ok"] for c in checks), checks


def _explain_quota(use: QuotaUse, checks: list[dict[str, Any]]) -> dict[str, Any]:
    q = use.quota
    return {
        "quota": f"{q.namespace}/{q.name}",
        "min": resources.render(q.min),
        "max": resources.render(q.max),
        "used": resources.render(use.used),
        "nonPreemptibleUsed": resources.render(use.non_preemptible_used),
        "nonPreemptibleRequest": resources.render(use.non_preemptible_request),
        "preemptibleRequest": resources.render(use.preemptible_request),
        "checks": checks,
    }


# ---- placement ------------------------------------------------------------------------


@dataclass(slots=True)
class _Plan:
    """The gang's placement so far: where each member goes and what it evicts."""

    placements: dict[str, str] = field(default_factory=dict)  # member uid -> node
    on_node: dict[str, list[Pod]] = field(default_factory=dict)  # node -> members placed there
    committed: dict[str, dict[str, Pod]] = field(default_factory=dict)  # node -> uid -> victim
    # Some member was placed under the inter-pod filters (engine.interpod): the reprieve
    # then checks them too.
    filtered: bool = False

    def overlay(self, members: Sequence[Pod], uids: frozenset[str]) -> interpod.Overlay:
        """The plan as the inter-pod filters read it: members placed so far (in gang order)
        assumed on their nodes, the committed victims gone."""
        return interpod.Overlay(
            placed=tuple((m, self.placements[m.uid]) for m in members if m.uid in self.placements),
            gone=frozenset(uid for victims in self.committed.values() for uid in victims),
            members=uids,
        )

    def place(self, member: Pod, node: str, victims: Iterable[Pod]) -> None:
        self.placements[member.uid] = node
        self.on_node.setdefault(node, []).append(member)
        self.committed.setdefault(node, {}).update((v.uid, v) for v in victims)


def _view(
    state: NodeState, evictable: Mapping[str, Pod], plan: _Plan, counted_nominees: Sequence[Pod]
) -> NodeState:
    """The node as the next member sees it, for `default.evaluate_node`.

    Committed victims are gone, members already placed here are assumed (as the
    scheduler assumes a pod), and only job-eligible pods are offered as victims
    (everything else stays in `used`). Gang members nominated here by an earlier
    round are counted by `default.free_for` as nominated load; they are the pods
    being placed now, so their requests are handed back here to count them once.
    """
    name = state.node.name
    gone = plan.committed.get(name, {})
    used = dict(state.used)
    for v in gone.values():
        resources.sub(used, v.requests)
    for m in plan.on_node.get(name, []):
        resources.add(used, m.requests)
    for m in counted_nominees:
        resources.sub(used, m.requests)
    pods = {uid: p for uid, p in evictable.items() if uid not in gone} if gone else dict(evictable)
    return NodeState(state.node, pods=pods, used=used, version=state.version)


@dataclass(slots=True)
class _MemberChoice:
    node: str | None
    chosen: NodeEval | None  # the evaluation that places it by evicting (None when it fits)
    explanation: dict[str, Any]
    fits: bool = False


def job_kind(config: Config) -> str:
    """The ranking kind of job-flow victims: preemptible pods, by the label or the configured default."""
    return "job-strict" if config.quota.disable_default_preemptible else "job"


@dataclass(slots=True)
class _Placer:
    """Places a gang's members one at a time on the index's rankings (job-eligible victims).

    Most nodes look to a member exactly as they look to any pod of its shape and
    priority with job eligibility, which is what the shared ranking of that
    signature holds. The others are evaluated on their own view: nodes where the
    plan already placed members or committed victims, nodes where a member was
    nominated by an earlier round, and nodes running pods of the same group
    (which are never its victims).

    Nothing in the cluster changes during a decision, so a node's eligible pods are
    listed once, and a view's evaluation is kept until the plan places a member on
    that node: the next member of the same shape reads it again (`_view_key`).
    """

    cluster: Cluster
    index: Index
    members: Sequence[Pod]
    priority: int
    nominees: Mapping[str, list[Pod]]
    now: int
    config: Config
    plan: _Plan = field(default_factory=_Plan)
    _uids: set[str] = field(default_factory=set)
    _group_nodes: set[str] = field(default_factory=set)
    _evictable: dict[str, dict[str, Pod]] = field(default_factory=dict)
    _views: dict[tuple[Any, ...], NodeEval] = field(default_factory=dict)
    _last: tuple[Any, Any] | None = None  # (signature, ranking) of the previous member
    memo: dict[Any, Any] = field(default_factory=dict)  # the members' Filters share it

    def __post_init__(self) -> None:
        first = self.members[0]
        group = first.labels.get(POD_GROUP)
        self._uids = {m.uid for m in self.members}
        if group:
            self._group_nodes = {
                p.node for p in self.cluster.bound_in_group(first.namespace, group) if p.node
            }

    def evictable(self, name: str) -> dict[str, Pod]:
        """Job-eligible victims on a node: preemptible, lower priority, tolerating no member, not in the job.

        Terminating and soft-evicted pods stay eligible: their capacity is leaving anyway
        and listing them again costs nothing (docs/semantics.md §1). The toleration test
        uses the lowest member priority: a victim that tolerates any member tolerates that one.
        The same for every member: listed once per node and decision (read it, never change it).
        """
        held = self._evictable.get(name)
        if held is not None:
            return held
        first = self.members[0]
        group = first.labels.get(POD_GROUP)
        namespace = first.namespace
        out: dict[str, Pod] = {}
        state = self.cluster.nodes.get(name)
        if state is None:
            return out
        cluster, priority, now, uids = self.cluster, self.priority, self.now, self._uids
        preemptible = keeper(self.config)
        for pod in state.pods.values():
            if pod.uid in uids or (
                group and pod.namespace == namespace and pod.labels.get(POD_GROUP) == group
            ):
                continue
            if cluster.priority(pod) >= priority or not preemptible(pod):
                continue
            if cluster.tolerates(pod, preemptor_priority=priority, now=now):
                continue
            out[pod.uid] = pod
        self._evictable[name] = out
        return out

    def _view_key(self, member: Pod, name: str) -> tuple[Any, ...]:
        """What a view's evaluation reads that can differ between members and plan steps.

        The plan at the node (it only grows: how many members and victims it holds),
        what the node filters read of the member (`index.filter_signature`) and its
        requests, and its uid where it is nominated to the node (a nomination of its
        own is not counted against it).
        """
        plan = self.plan
        nominated = member.uid in self.cluster.nominated_on(name) or any(
            m.uid == member.uid for m in self.nominees.get(name, ())
        )
        return (
            name,
            len(plan.on_node.get(name, ())),
            len(plan.committed.get(name, ())),
            member.tolerations,
            member.node_selector,
            member.required_affinity,
            tuple(sorted(member.requests.items())),
            member.uid if nominated else None,
        )

    def _evaluate_view(self, member: Pod, pre: Preemptor, name: str, evaluate: Any) -> NodeEval:
        # Under the inter-pod filters the evaluation also reads the counts of the node's
        # domains, which members placed elsewhere in them change (`Filters.reads`), and the
        # member's labels and terms.
        key = self._view_key(member, name)
        if pre.filters is not None:
            labels = tuple(sorted(member.labels.items()))
            key = (*key, member.namespace, member.scheduling, labels, pre.filters.reads(name))
        held = self._views.get(key)
        if held is not None:
            return held
        cluster = self.cluster
        counted = [
            m
            for m in self.nominees.get(name, [])
            if m.uid != member.uid and cluster.priority(m) >= self.priority
        ]
        view = _view(cluster.nodes[name], self.evictable(name), self.plan, counted)
        ev: NodeEval = evaluate(cluster, view, pre, self.now)
        self._views[key] = ev
        return ev

    def _ranking(self, pre: Preemptor, mode: str) -> Any:
        """The index's ranking for this member; the previous member's when their signatures match.

        Nothing in the cluster changes between two members of one decision, so asking
        the index again for the same signature would only catch up on nothing.
        """
        kind = job_kind(self.config)
        sig = index_mod.signature(pre, mode, kind)
        if self._last is not None and self._last[0] == sig:
            return self._last[1]
        ranking = self.index.ranking(pre, self.now, mode, kind, keeper(self.config))
        self._last = (sig, ranking)
        return ranking

    def place(self, member: Pod) -> _MemberChoice:
        cluster, plan, mode = self.cluster, self.plan, self.config.victim_selection
        pre = Preemptor(member, self.priority, member.requests)
        ranking = self._ranking(pre, mode)
        nodes = cluster.nodes
        special = {
            n for n in (*plan.on_node, *plan.committed, *self.nominees, *self._group_nodes) if n in nodes
        }
        # The member's inter-pod filters over the cluster as the plan leaves it. On the nodes
        # they touch (`Filters.touched`) it is evaluated with them; everywhere else every filter
        # passes whatever is evicted, so the shared ranking (resources alone) stays exact there.
        overlay = plan.overlay(self.members, frozenset(self._uids))
        filters = interpod.Filters(cluster, member, overlay, self.memo)
        judged = pre
        touched: set[str] = set()
        if filters.active:
            plan.filtered = True
            judged = Preemptor(member, self.priority, member.requests, filters)
            touched = filters.touched() - special
        evaluate = index_mod.evaluator(mode)
        views: dict[str, NodeEval] = {}
        # Nodes untouched by the plan where a filter fails that no eviction there can cure
        # (`Filters.hopeless`): rejected before any victim is read, in either mode. A zone
        # spread rules out whole zones at once, so their reason is read only for the few the
        # explanation lists (`_rejected_here`).
        hopeless: set[str] = set()
        for name in sorted(special | touched):
            if name in touched and filters.hopeless(nodes[name]) is not None:
                hopeless.add(name)
                continue
            views[name] = self._evaluate_view(member, judged, name, evaluate)
        skip = views.keys() | hopeless
        fitting = sorted(
            n
            for n in (ranking.fitting(skip), *(n for n, e in views.items() if e.status == default.FITS))
            if n
        )
        if fitting:
            # It fits: no node is ranked for it, as in the default flow.
            return _MemberChoice(
                fitting[0], None, {"member": member.key, "node": fitting[0], "how": "fits"}, fits=True
            )
        shared_top = ranking.top(EXPLAIN_NODES, skip)  # settles the ranking: its counts are exact
        own = [e for e in views.values() if e.status == default.CANDIDATE]
        top = sorted([*shared_top, *own], key=_rank)[:EXPLAIN_NODES]
        node = top[0].node if top else None
        chosen = top[0] if top else None
        shared = [ranking.state[n] for n in skip if n in ranking.state]
        rejected = sorted(
            [
                *(n for n in ranking.rejected.islice(0, EXPLAIN_NODES + len(skip)) if n not in skip),
                *(n for n, e in views.items() if e.status == default.REJECTED),
                *hopeless,
            ]
        )[:EXPLAIN_NODES]

        def why(n: str) -> str:
            if n in views:
                return views[n].reason
            if n in hopeless:
                # The node as it is: untouched by the plan, the job's view of it differs
                # only in the victims listed, which a rejection here never reads.
                return default.evaluate_node(cluster, nodes[n], judged, self.now).reason
            return str(ranking.reason(n))

        explanation = {
            "member": member.key,
            "node": node,
            "how": "preempt" if node else "unplaceable",
            "candidates": [default.criteria(e, cluster) for e in top],
            "candidateCount": ranking.candidate_count
            - sum(e.tier == default.CANDIDATE for e in shared)
            + sum(e.status == default.CANDIDATE for e in views.values()),
            "rejected": [{"node": n, "reason": why(n)} for n in rejected],
            "rejectedCount": len(ranking.rejected)
            - sum(e.tier == default.REJECTED for e in shared)
            + sum(e.status == default.REJECTED for e in views.values())
            + len(hopeless),
        }
        return _MemberChoice(node, chosen, explanation)


def _rank(e: NodeEval) -> tuple[Any, str]:
    return (e.key, e.node)


def _nominees(cluster: Cluster, members: Sequence[Pod]) -> dict[str, list[Pod]]:
    """Members nominated to a node by an earlier round, as the cluster index holds them."""
    out: dict[str, list[Pod]] = {}
    for m in members:
        held = cluster.pods.get(m.uid)
        if held is not None and held.node is None and held.nominated and not held.terminal:
            out.setdefault(held.nominated, []).append(held)
    return out


def _reprieve(
    cluster: Cluster,
    plan: _Plan,
    pool_by_node: Mapping[str, Mapping[str, Pod]],
    nominees: Mapping[str, list[Pod]],
    priority: int,
    uses: Sequence[QuotaUse],
    check: _FilterCheck | None = None,
) -> list[Pod]:
    """Remove the pool from the gang's nodes, then assign it back in importance order.

    A pod comes back while every member placed on its node still fits, every quota
    the job is charged to still passes its admission check (with the victims chosen
    so far gone) and, under the inter-pod filters (`check`), its return makes no member
    fail them (`_FilterCheck.holds_back`); the rest are the victims.
    """
    resolve = quota_resolver(cluster)
    victims: list[Pod] = []
    quota_by_uid = {u.quota.uid: u for u in uses}
    leaving_usage: dict[str, Resources] = {}
    need: dict[str, Resources] = {}
    free: dict[str, Resources] = {}
    order: list[tuple[str, Pod]] = []
    for name in sorted(plan.on_node):
        need[name] = resources.total(m.requests for m in plan.on_node[name])
        room = free[name] = cluster.free(cluster.nodes[name])
        # Nominated pods outrank the job here unless they are its own members (placed anew now).
        members_here = {m.uid for m in nominees.get(name, [])}
        for pod in cluster.nominated_on(name).values():
            if cluster.priority(pod) >= priority and pod.uid not in members_here:
                resources.sub(room, pod.requests)
        pool = sorted(pool_by_node.get(name, {}).values(), key=lambda p: default.importance(cluster, p))
        for pod in pool:
            resources.add(room, pod.requests)
        order.extend((name, pod) for pod in pool)
    if check is not None:
        # Under the inter-pod filters a pod on one node can matter to a member on another
        # (a zone's affinity, a spread's domains): the pool comes back in one importance
        # order across the gang's nodes, so no pod is held against a less important one
        # that simply had not been tried yet. Without them the nodes are independent but for
        # the quotas, and node by node stays the order it always was.
        order.sort(key=lambda item: default.importance(cluster, item[1]))
    for name, pod in order:
        room = free[name]
        resources.sub(room, pod.requests)
        q = resolve(pod)
        charged = quota_by_uid.get(q.uid) if q is not None else None
        if (
            resources.fits(need[name], room)
            and (charged is None or admission(charged, minus=leaving_usage.get(charged.quota.uid))[0])
            and (check is None or check.holds_back(pod, {v.uid for v in victims}))
        ):
            continue
        resources.add(room, pod.requests)
        victims.append(pod)
        if charged is not None:
            resources.add(leaving_usage.setdefault(charged.quota.uid, {}), pod.requests)
    return sorted(victims, key=lambda p: default.importance(cluster, p))


@dataclass(slots=True)
class _FilterCheck:
    """The gang's inter-pod filters as the reprieve and the final check read them: each member,
    in gang order, on its planned node with the members before it placed and a set of pods gone
    (upstream schedules the members one at a time, each seeing those before it as assumed)."""

    cluster: Cluster
    members: Sequence[Pod]
    plan: _Plan
    priority: int
    memo: dict[Any, Any] = field(default_factory=dict)

    def broken(self, gone: set[str]) -> str | None:
        """The first member whose filters fail with `gone` away, and why; None: all pass."""
        failing = self._failing(gone, first=True)
        return failing[0] if failing else None

    def _failing(self, gone: set[str], *, first: bool = False) -> list[str]:
        """Each member whose filters fail with `gone` away, and why (only the first with `first`)."""
        cluster, plan = self.cluster, self.plan
        uids = frozenset(m.uid for m in self.members)
        placed: list[tuple[Pod, str]] = []
        out: list[str] = []
        for m in self.members:
            name = plan.placements.get(m.uid)
            state = cluster.nodes.get(name) if name is not None else None
            if name is None or state is None:
                break
            overlay = interpod.Overlay(tuple(placed), frozenset(gone), uids)
            f = interpod.Filters(cluster, m, overlay, self.memo)
            if f.active:
                pre = Preemptor(m, self.priority, m.requests, f)
                status = f.view(state, default.nominated_pods(cluster, name, pre)).status(True)
                if status is not None:
                    out.append(f"{m.key} fails on {name}: {status[1]}")
                    if first:
                        return out
            placed.append((m, name))
        return out

    def holds_back(self, pod: Pod, victims: set[str]) -> bool:
        """May `pod` come back? Read with the victims chosen so far gone and every pod not yet
        tried still there (as it would stay if given back): `pod` stays unless its return is
        what makes a member fail. A pod that bears on no member's filters
        (`interpod.concerns`) changes none of them. The pods tried later may still go, which
        can undo what a member needs: `broken` over the final victims answers for that."""
        if not any(interpod.concerns(pod, m, self.cluster) for m in self.members):
            return True
        back = self._failing(victims)
        return not back or len(back) <= len(self._failing(victims | {pod.uid}))


def _previous_round(cluster: Cluster, members: Sequence[Pod], priority: int) -> str | None:
    """The seed's "check whether last round preemption finishes": a member's nominated node still
    holds a lower-priority victim of a preemption on its way out, so evicting more now could cascade.

    The default flow's wait rule (`default.waiting_on_nominated`): only a preemption's victims
    hold the job, soft-evicted (this flow's own mark) or terminating with DisruptionTarget
    reason PreemptionByScheduler (what the actuator writes on the victims it deletes).
    Koordinator's design checks its own cache of the pods it preempted; a pod drained or
    deleted by someone else holds nothing here, as kube-scheduler dropped "any terminating
    pod holds the preemptor" in 1.27, and it stays an eligible victim (`evictable`), listed
    again with nothing more to do, so no second round of victims takes its place."""
    for m in members:
        held = cluster.pods.get(m.uid, m)
        node = held.nominated if held.node is None else None
        state = cluster.nodes.get(node) if node else None
        if state is None:
            continue
        for pod in sorted(state.pods.values(), key=lambda p: p.uid):
            if cluster.priority(pod) < priority and (soft_evicted(pod) or (pod.deleting and pod.preempted)):
                how = "soft-evicted" if soft_evicted(pod) else "terminating"
                return (
                    f"previous round unfinished: {m.namespace}/{m.name} is nominated to {node}, "
                    f"where {pod.namespace}/{pod.name} is still {how}"
                )
    return None


def _mark(victims: Sequence[Pod], cluster: Cluster, config: Config) -> tuple[Victim, ...]:
    action = DELETE if config.quota.pod_should_be_deleted_when_preempted else LABEL
    # A soft-evicted victim is already on its way out: to_victims marks it, so the
    # actuator does not act on it again.
    return to_victims(victims, cluster, action=action)


# ---- the decision -------------------------------------------------------------------


def decide(
    cluster: Cluster,
    pods: Sequence[Pod],
    *,
    now: int,
    config: Config,
    index: Index | None = None,
) -> Decision:
    """Decide for one job: every pending member placed, or nothing evicted.

    Nodes are evaluated on a per-member view (job eligibility: preemptible pods;
    capacity taken by the members already placed), not the default flow's.
    """
    members = gang(cluster, pods)
    job = job_name(members)
    priority = min(cluster.priority(m) for m in members)
    uses = quota_use(cluster, members, config)
    explanation: dict[str, Any] = {
        "flow": "job",
        "job": job,
        "members": [m.key for m in members],
        "jobPriority": priority,
        "victimSelection": config.victim_selection,
        "quotas": [],
    }

    # A single-pod preemptor is answered with `node`, whichever flow decided it; only a
    # gang of several pods gets `placements` (docs/semantics.md §2). Its preemptor is
    # the pod itself, so the actuator nominates that pod by name.
    single = len(members) == 1
    make = decision_mod.maker(
        "job",
        members[0].key if single else job,
        members[0].uid,
        explanation,
        members=tuple(m.key for m in members),
        member_uids=tuple(m.uid for m in members),
    )

    def where(placements: dict[str, str]) -> dict[str, Any]:
        if single:
            return {"node": next(iter(placements.values()), None)}
        return {"placements": placements}

    admitted = True
    for use in uses:
        ok, checks = admission(use)
        explanation["quotas"].append(_explain_quota(use, checks))
        if not ok:
            admitted = False
    if not admitted:
        failed = [c for q in explanation["quotas"] for c in q["checks"] if not c["ok"]]
        first = failed[0]
        return make(
            UNSCHEDULABLE,
            f"quota admission fails for {first['resource']}: {first['formula']} "
            f"({first['value']} > {first['limit']})",
        )

    missing = interpod.not_modelled(members)
    if missing:
        explanation[interpod.NOT_MODELLED] = missing
        return make(UNSCHEDULABLE, interpod.not_modelled_reason(missing))

    nominees = _nominees(cluster, members)
    placer = _Placer(cluster, index or Index(cluster), members, priority, nominees, now, config)
    plan = placer.plan
    steps: list[dict[str, Any]] = []
    unplaced: Pod | None = None
    for m in members:
        choice = placer.place(m)
        steps.append(choice.explanation)
        if choice.node is None:
            unplaced = m
            break
        plan.place(m, choice.node, choice.chosen.victims if choice.chosen is not None else ())
    explanation["placements"] = steps
    placements = {m.key: plan.placements[m.uid] for m in members if m.uid in plan.placements}

    if unplaced is None and not any(plan.committed.values()):
        return make(FITS, f"all {len(members)} member(s) fit without preemption", **where(placements))
    for m in members:
        refusal = trigger_refusal(cluster, m, config)
        if refusal is not None:
            return make(UNSCHEDULABLE, f"{m.key} may not trigger preemption: {refusal}")
    waiting = _previous_round(cluster, members, priority)
    if waiting is not None:
        return make(WAIT, waiting)
    if unplaced is not None:
        return make(
            UNSCHEDULABLE,
            f"{unplaced.key} cannot be placed even after evicting every eligible pod (all or nothing)",
        )
    # The seed removes every eligible pod and assigns them back (kubernetes). In minimal
    # mode only the pods the per-member choices evicted go back, so the greedy pass
    # cannot undo the exact per-node minimisation.
    pool = (
        plan.committed
        if config.victim_selection == "minimal"
        else {n: placer.evictable(n) for n in plan.on_node}
    )
    check = _FilterCheck(cluster, members, plan, priority, placer.memo) if plan.filtered else None
    victims = _reprieve(cluster, plan, pool, nominees, priority, uses, check)
    explanation["victims"] = [v.key for v in victims]
    if check is not None:
        # The reprieve gives a pod back only where every filter still holds; the placement
        # read each member with the victims chosen before it gone. With all of them gone at
        # once, a spread minimum or an affinity may no longer hold: then nothing is evicted.
        broken = check.broken({v.uid for v in victims})
        if broken is not None:
            return make(
                UNSCHEDULABLE,
                f"{broken} once every victim is gone, so the gang cannot be placed (all or nothing)",
            )
    return make(
        PREEMPT,
        f"preempt {len(victims)} pod(s) to place {len(members)} member(s) of {job}",
        **where(placements),
        victims=_mark(victims, cluster, config),
    )


# ---- the flow, as the registry (engine.flows) holds it ------------------------------------

NAME = "job"


class QuotaCheck(TypedDict):
    """One admission formula for one resource, with its numbers (`admission`)."""

    resource: str
    formula: str
    value: str
    limit: str
    ok: bool


class QuotaExplanation(TypedDict):
    quota: str  # namespace/name
    min: dict[str, str]
    max: dict[str, str]
    used: dict[str, str]
    nonPreemptibleUsed: dict[str, str]
    nonPreemptibleRequest: dict[str, str]
    preemptibleRequest: dict[str, str]
    checks: list[QuotaCheck]


class MemberPlacement(TypedDict):
    """One member's placement step (`_Placer.place`); only `fits` when it fits."""

    member: str
    node: str | None
    how: str  # fits | preempt | unplaceable
    candidates: NotRequired[list[default.Criteria]]
    candidateCount: NotRequired[int]
    rejected: NotRequired[list[default.RejectedNode]]
    rejectedCount: NotRequired[int]


class Explanation(TypedDict, total=False):
    """A job-flow decision's `explanation`."""

    flow: Required[str]
    job: Required[str]
    members: Required[list[str]]  # namespace/name, in name order
    jobPriority: Required[int]
    victimSelection: Required[str]
    quotas: Required[list[QuotaExplanation]]
    notModelled: list[str]  # interpod.NOT_MODELLED
    placements: list[MemberPlacement]  # once the quotas admit the job
    victims: list[str]  # a preempt: after the give-back pass


def _explanation(d: Mapping[str, Any]) -> Explanation:
    return cast(Explanation, flowbase.explanation_of(d))


def _placements(d: Mapping[str, Any]) -> dict[str, Any]:
    """Every member's node: `placements` for a gang of several, `node` for a single-pod job preemptor."""
    placements = as_dict(d.get("placements"))
    if not placements and d.get("node"):
        members = as_list(_explanation(d).get("members")) or [d.get("preemptor")]
        placements = {str(members[0]): d.get("node")}
    return placements


class JobFlow:
    """Job-level preemption on ElasticQuota: a gang of several pods, or a pod charged to a quota."""

    name = NAME
    explanation = Explanation

    def applies(self, cluster: Cluster, pods: Sequence[Pod]) -> bool:
        # A quota label alone is not enough: when it names no quota and the namespace has
        # none, the pod is charged to nothing (`quota_of`) and takes the default flow.
        return len(pods) > 1 or any(is_job_pod(cluster, p) for p in pods)

    def decide(
        self, cluster: Cluster, pods: Sequence[Pod], *, now: int, config: Config, index: Index
    ) -> Decision:
        return decide(cluster, pods, now=now, config=config, index=index)

    def reference(
        self, cluster: Cluster, pods: Sequence[Pod], now: int, config: Config
    ) -> dict[str, Any] | None:
        return reference.decide_job(cluster, list(pods), now, config)

    def places(self, pod: str, d: Mapping[str, Any]) -> bool:
        return pod in as_list(_explanation(d).get("members")) or pod in _placements(d)

    def explain_preemptor(self, pod: str, d: Mapping[str, Any]) -> Told:
        """Where each member went (or which member could not be placed), and the quota checks."""
        ex = _explanation(d)
        outcome, reason = str(d.get("outcome")), str(d.get("reason"))
        placements = _placements(d)
        facts: dict[str, Any] = {"placements": placements}
        if pod != d.get("preemptor"):
            facts["node"] = placements.get(pod)
        where = (
            f"{pod} on {placements[pod]}"
            if pod in placements
            else ", ".join(f"{m} on {n}" for m, n in sorted(placements.items()))
        )
        details = [
            f"job {ex.get('job')} (priority {ex.get('jobPriority')}), members: "
            f"{', '.join(str(m) for m in as_list(ex.get('members')))}"
        ]
        for step in as_list(ex.get("placements")):
            if isinstance(step, dict):
                details.append(
                    f"member {step.get('member')}: {step.get('how')}"
                    f"{' on ' + str(step.get('node')) if step.get('node') else ''}"
                    f" ({step.get('candidateCount', 0)} candidate node(s), "
                    f"{step.get('rejectedCount', 0)} rejected)"
                )
        for q in as_list(ex.get("quotas")):
            for c in as_list(as_dict(q).get("checks")):
                if isinstance(c, dict) and not c.get("ok"):
                    details.append(
                        f"quota {as_dict(q).get('quota')} fails for {c.get('resource')}: "
                        f"{c.get('formula')}: {c.get('value')} > {c.get('limit')}"
                    )
        details.append(f"outcome {outcome}: {reason}")
        return Told(details, facts, f"{outcome}: {where or reason}")

    def explain_victim(self, pod: str, d: Mapping[str, Any], victim: Mapping[str, Any]) -> Told:
        """Eligible for the job, and not given back in the job's final pass."""
        ex = _explanation(d)
        node = str(victim.get("node"))
        placements = _placements(d)
        here = sorted(m for m, n in placements.items() if n == node)
        facts = {"preemptorPriority": ex.get("jobPriority"), "membersOnNode": here}
        lines = [
            f"job {ex.get('job')} (priority {ex.get('jobPriority')}) places {len(placements)} member(s): "
            + ", ".join(f"{m} on {n}" for m, n in sorted(placements.items())),
            f"eligible: preemptible and priority {victim.get('priority')} below the job's "
            f"{ex.get('jobPriority')}",
            f"all eligible pods were removed, the members placed, then pods given back most important "
            f"first while {', '.join(here) or 'the members'} on {node} still fit and the job's quota "
            "held: this one could not come back",
        ]
        if str(victim.get("action")) == LABEL:
            lines.append(
                "soft eviction: the pod is labelled for its owner to remove (podShouldBeDeletedWhenPreempted "
                "is false), not deleted"
            )
        return Told(lines, facts)

    def explain_survivor(self, pod: str, d: Mapping[str, Any]) -> Told | None:
        """A candidate victim for some member: given back in the final pass, or on a node that lost."""
        ex = _explanation(d)
        evicted = ", ".join(flowbase.victim_keys(d)) or "no one"
        placements = _placements(d)
        mode = str(ex.get("victimSelection") or "kubernetes")
        for step in as_list(ex.get("placements")):
            if not isinstance(step, dict):
                continue
            candidates = [c for c in as_list(step.get("candidates")) if isinstance(c, dict)]
            mine = next((c for c in candidates if pod in as_list(c.get("victimPods"))), None)
            if mine is None:
                continue
            member, node = step.get("member"), mine.get("node")
            facts: dict[str, Any] = {"node": node, "member": member, "memberNode": step.get("node")}
            if d.get("outcome") != "preempt":
                facts["as"] = "no-eviction"
                details = [
                    f"a candidate victim on {node} while placing {member}, but the job evicted no one: "
                    f"{d.get('outcome')} ({d.get('reason')})"
                ]
            elif node == step.get("node") or node in placements.values():
                facts["as"] = "reprieved"
                details = [
                    f"a candidate victim on {node} while placing {member}",
                    "given back in the job's final pass (most important first) because every member "
                    f"placed on {node} still fit and the quota held with it",
                    f"evicted instead: {evicted}",
                ]
            else:
                facts["as"] = "other-candidate-node"
                chosen = next((c for c in candidates if c.get("node") == step.get("node")), None)
                why = (
                    default.rank_reason(chosen, mine, mode)[1]
                    if chosen
                    else f"{member} went to {step.get('node')}"
                )
                details = [f"it would have been a victim on {node} for member {member}", f"but {why}"]
            return Told(details, facts, f"spared by job {ex.get('job')}")
        return None

    def unnamed_spared(self, d: Mapping[str, Any]) -> str | None:
        return None  # no note for this flow: its answers say what the record lists


FLOW = JobFlow()
