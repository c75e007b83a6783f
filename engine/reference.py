"""A literal transcription of the `kubernetes` preemption rules, with no indexes.

This is the oracle: property tests require the engine (indexes, caches) to give
identical answers on generated clusters, and `preemptctl bench engine` measures
the engine against it side by side. It recomputes everything from the raw
record tables on every call: node usage from all pods, nominated pods by a scan,
PDB budgets per node. Keep it obvious rather than fast.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from engine import placement, toleration
from engine.cluster import Cluster
from engine.objects import Pod

SHIFT = 2**31


def _prio(cluster: Cluster, pod: Pod) -> int:
    """spec.priority as written, else the PriorityClass's value, else the global default, else 0.

    Read from the object as received, not from the priority the index stamped on it.
    """
    spec = pod.raw.get("spec")
    written = spec.get("priority") if isinstance(spec, dict) else None
    if written is not None:
        return int(written)
    classes = cluster.priority_classes
    if pod.priority_class in classes:
        return classes[pod.priority_class].value
    defaults = sorted(name for name, pc in classes.items() if pc.global_default)
    return classes[defaults[0]].value if defaults else 0


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


def _covers(pdb: Any, pod: Pod) -> bool:
    """Does this PDB count the pod (its namespace, a non-empty selector, not already disrupted)?"""
    if pdb.namespace != pod.namespace or pdb.selector is None or pdb.selector.empty:
        return False
    return bool(pod.labels) and pdb.selector.matches(pod.labels) and pod.name not in pdb.disrupted


def violations_of(
    cluster: Cluster, victims: list[Pod], covering: Callable[[Pod], list[Any]] | None = None
) -> int:
    """How many of these victims, evicted together, exceed a PDB's budget (each victim counted once).

    Every PDB's budget is spent by its matching victims, most important first
    (pods already in its disruptedPods spend nothing); a victim is a violation
    when some PDB matching it has no budget left for it. `covering`, when given,
    lists the PDBs covering a pod by uid (as the walk below finds them).
    """
    pdbs = sorted(cluster.pdbs.values(), key=lambda b: b.uid)

    def walk(p: Pod) -> list[Any]:
        return [pdb for pdb in pdbs if _covers(pdb, p)]

    covers = walk if covering is None else covering
    spent: dict[str, int] = {}
    count = 0
    for v in sorted(victims, key=lambda p: _more_important(cluster, p)):
        over = False
        for pdb in covers(v):
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
                if not p.labels or not pdb.selector.matches(p.labels) or p.name in pdb.disrupted:
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
                    and p.preempted
                ):
                    return {"outcome": "wait", "node": None, "victims": []}
    if not results:
        return {"outcome": "unschedulable", "node": None, "victims": []}
    results.sort(key=lambda r: r[0])
    _, name, victims = results[0]
    return {"outcome": "preempt", "node": name, "victims": sorted(v.key for v in victims)}


# ---- the job flow, literally (docs/semantics.md §5) ---------------------------------------

_GROUP = "pod-group.scheduling.sigs.k8s.io"
_QUOTA = "quota.scheduling.koordinator.sh/name"
_PREEMPTIBLE = "quota.scheduling.koordinator.sh/preemptible"
_CAN_PREEMPT = "quota.scheduling.koordinator.sh/can-preempt"
_SOFT = "scheduling.koordinator.sh/soft-eviction"


def _flag(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() == "true"


def _policy(cluster: Cluster, pod: Pod) -> str:
    """The pod's preemptionPolicy, else its PriorityClass's, else PreemptLowerPriority."""
    return pod.preemption_policy or (
        cluster.priority_classes[pod.priority_class].preemption_policy
        if pod.priority_class in cluster.priority_classes
        else "PreemptLowerPriority"
    )


def _promised(cluster: Cluster, name: str, uids: set[str], prio: int) -> list[Pod]:
    """Pending pods nominated to `name` (not the preemptor's own) at least as important as `prio`."""
    return [
        p
        for p in cluster.pods.values()
        if p.node is None
        and not p.terminal
        and p.nominated == name
        and p.uid not in uids
        and _prio(cluster, p) >= prio
    ]


def _bound(cluster: Cluster) -> list[Pod]:
    return [p for p in cluster.pods.values() if p.node is not None and not p.terminal]


def _quota_of(cluster: Cluster, pod: Pod) -> Any:
    quotas = sorted(cluster.quotas.values(), key=lambda q: (q.namespace, q.name, q.uid))
    name = pod.labels.get(_QUOTA) or ""
    named = [q for q in quotas if q.name == name]
    if named:
        return next((q for q in named if q.namespace == pod.namespace), named[0])
    return next((q for q in quotas if q.namespace == pod.namespace), None)


def _preemptible(pod: Pod, config: Any) -> bool:
    label = _flag(pod.labels.get(_PREEMPTIBLE))
    return (not config.quota.disable_default_preemptible) if label is None else label


class _Snapshot:
    """What one job decision reads of the cluster, listed once: the cluster does not change
    during the call, so scanning every pod again for each node, member or reprieved pod (as
    the rules read) gives the same lists. Pods are told apart by uid, which is what
    `p in pods` compares of two pods from the same cluster."""

    def __init__(self, cluster: Cluster, uids: set[str], prio: int) -> None:
        self.bound = _bound(cluster)
        self.on_node: dict[str, list[Pod]] = {}
        for p in self.bound:
            self.on_node.setdefault(p.node or "", []).append(p)
        # `_promised(cluster, name, uids, prio)` for every node at once.
        self.promised: dict[str, list[Pod]] = {}
        for p in cluster.pods.values():
            if (
                p.node is None
                and not p.terminal
                and p.nominated is not None
                and p.uid not in uids
                and _prio(cluster, p) >= prio
            ):
                self.promised.setdefault(p.nominated, []).append(p)
        # `_quota_of` reads a pod's namespace and quota label only.
        self._quotas: dict[tuple[str, str], Any] = {}
        self._charged: dict[str, list[Pod]] = {}
        self._covering: dict[str, list[Any]] = {}
        # PDBs by uid (as `_classify` walks them), grouped by namespace (its first test).
        self.pdbs: dict[str, list[Any]] = {}
        for pdb in sorted(cluster.pdbs.values(), key=lambda b: b.uid):
            self.pdbs.setdefault(pdb.namespace, []).append(pdb)

    def quota_of(self, cluster: Cluster, pod: Pod) -> Any:
        key = (pod.namespace, pod.labels.get(_QUOTA) or "")
        if key not in self._quotas:
            self._quotas[key] = _quota_of(cluster, pod)
        return self._quotas[key]

    def charged_to(self, cluster: Cluster, quota: Any) -> list[Pod]:
        """The bound pods charged to `quota`, in `bound` order."""
        if quota.uid not in self._charged:
            self._charged[quota.uid] = [p for p in self.bound if self.quota_of(cluster, p) is quota]
        return self._charged[quota.uid]

    def covering(self, pod: Pod) -> list[Any]:
        """The PDBs covering the pod, by uid (`_covers`)."""
        if pod.uid not in self._covering:
            self._covering[pod.uid] = [b for b in self.pdbs.get(pod.namespace, []) if _covers(b, pod)]
        return self._covering[pod.uid]


def _admits(
    cluster: Cluster, quota: Any, members: list[Pod], config: Any, gone: list[Pod], snap: _Snapshot
) -> bool:
    """The seed's formulas for one quota, with `gone` (victims) no longer using it."""
    left = {p.uid for p in gone}
    charged = [p for p in snap.charged_to(cluster, quota) if p.uid not in left]
    mine = [m for m in members if snap.quota_of(cluster, m) is quota]
    np_members = [m for m in mine if not _preemptible(m, config)]
    p_members = [m for m in mine if _preemptible(m, config)]
    np_charged = [p for p in snap.charged_to(cluster, quota) if not _preemptible(p, config)]
    for r in sorted(set(quota.min) | set(quota.max)):
        lo = quota.min.get(r, 0)
        used = sum(p.requests.get(r, 0) for p in charged)
        np_used = sum(p.requests.get(r, 0) for p in np_charged)
        np_req = sum(m.requests.get(r, 0) for m in np_members)
        p_req = sum(m.requests.get(r, 0) for m in p_members)
        if np_members:
            if np_used + np_req > lo:
                return False
            if r in quota.max and used + np_req + p_req > quota.max[r]:
                return False
        if (
            p_members
            and r in quota.max
            and min(lo, np_used + np_req) + (used - np_used) + p_req > quota.max[r]
        ):
            return False
    return True


def decide_job(cluster: Cluster, pods: list[Pod], now: int, config: Any) -> dict[str, Any]:
    """The job flow's answer as {outcome, node or placements, victims: sorted keys}, kubernetes mode."""
    members = {p.uid: p for p in pods}
    if len(pods) == 1 and pods[0].labels.get(_GROUP):
        for p in cluster.pods.values():
            pending = p.node is None and not p.terminal and not p.deleting
            if (
                pending
                and p.namespace == pods[0].namespace
                and p.labels.get(_GROUP) == pods[0].labels[_GROUP]
            ):
                members.setdefault(p.uid, p)
    gang = sorted(members.values(), key=lambda p: (p.namespace, p.name, p.uid))
    uids = {m.uid for m in gang}
    group, ns = gang[0].labels.get(_GROUP), gang[0].namespace
    prio = min(_prio(cluster, m) for m in gang)
    snap = _Snapshot(cluster, uids, prio)
    quotas = []
    for m in gang:
        q = snap.quota_of(cluster, m)
        if q is not None and q not in quotas:
            quotas.append(q)
    nothing: dict[str, Any] = {"node": None, "victims": []}
    if not all(_admits(cluster, q, gang, config, [], snap) for q in quotas):
        return {"outcome": "unschedulable", **nothing}

    eligibility: dict[str, bool] = {}  # by uid: it reads the pod alone

    def eligible(p: Pod) -> bool:
        if p.uid not in eligibility:
            eligibility[p.uid] = (
                p.uid not in uids
                and not (group and p.namespace == ns and p.labels.get(_GROUP) == group)
                and _prio(cluster, p) < prio
                and _preemptible(p, config)
                and not _tolerates(cluster, p, prio, now)
            )
        return eligibility[p.uid]

    placed: dict[str, str] = {}  # member uid -> node
    committed: list[Pod] = []
    gone: set[str] = set()  # the uids of `committed`
    unplaced = False
    for m in gang:
        fits_on: list[str] = []
        ranked: list[tuple[Any, str, list[Pod]]] = []
        for name in sorted(cluster.nodes):
            node = cluster.nodes[name].node
            if placement.unresolvable(node, m) is not None:
                continue
            here = [p for p in snap.on_node.get(name, []) if p.uid not in gone]
            here += [g for g in gang if placed.get(g.uid) == name]
            promised = snap.promised.get(name, [])
            if _fits(m.requests, node.allocatable, here + promised):
                fits_on.append(name)
                continue
            potential = [p for p in here if p.uid not in placed and eligible(p)]
            chosen = {p.uid for p in potential}
            rest = [p for p in here if p.uid not in chosen]
            if not _fits(m.requests, node.allocatable, rest + promised):
                continue
            potential.sort(key=lambda p: _more_important(cluster, p))
            flagged = {p.uid for p in _classify(cluster, potential, snap)}
            victims: list[Pod] = []
            for group_of in (
                [p for p in potential if p.uid in flagged],
                [p for p in potential if p.uid not in flagged],
            ):
                for p in group_of:
                    rest.append(p)
                    if not _fits(m.requests, node.allocatable, rest + promised):
                        rest.pop()  # p, just appended (`rest.remove(p)`: no other pod equals it)
                        victims.append(p)
            ranked.append((_key(cluster, victims, name, snap), name, victims))
        if fits_on:
            placed[m.uid] = fits_on[0]
        elif ranked:
            _, name, victims = min(ranked)
            placed[m.uid] = name
            committed += [v for v in victims if v.uid not in gone]
            gone |= {v.uid for v in victims}
        else:
            unplaced = True
            break
    where = {m.key: placed[m.uid] for m in gang if m.uid in placed}
    if not unplaced and not committed:
        return {"outcome": "fits", **_where(gang, where), "victims": []}
    for m in gang:
        policy = _policy(cluster, m)
        if policy == "Never":
            return {"outcome": "unschedulable", **nothing}
        if not _flag(m.labels.get(_CAN_PREEMPT)) and (
            policy != "PreemptLowerPriority" or config.quota.disable_default_trigger_preemption
        ):
            return {"outcome": "unschedulable", **nothing}
    for m in gang:
        held = cluster.pods.get(m.uid, m)
        node_name = held.nominated if held.node is None else None
        if node_name and node_name in cluster.nodes:
            for p in snap.on_node.get(node_name, []):
                if _prio(cluster, p) < prio and (p.deleting or _flag(p.labels.get(_SOFT))):
                    return {"outcome": "wait", **nothing}
    if unplaced:
        return {"outcome": "unschedulable", **nothing}
    victims = []
    for name in sorted(set(placed.values())):
        node = cluster.nodes[name].node
        need = [m for m in gang if placed[m.uid] == name]
        promised = snap.promised.get(name, [])
        here = snap.on_node.get(name, [])
        pool = sorted((p for p in here if eligible(p)), key=lambda p: _more_important(cluster, p))
        kept = [p for p in here if not eligible(p)]
        for p in pool:
            kept.append(p)
            q = snap.quota_of(cluster, p)
            ok = all(
                _fits(m.requests, node.allocatable, kept + promised + [x for x in need if x is not m])
                for m in need
            )
            if ok and (q is None or q not in quotas or _admits(cluster, q, gang, config, victims, snap)):
                continue
            kept.pop()  # p, just appended
            victims.append(p)
    return {"outcome": "preempt", **_where(gang, where), "victims": sorted(v.key for v in victims)}


def _where(gang: list[Pod], where: dict[str, str]) -> dict[str, Any]:
    if len(gang) == 1:
        return {"node": where.get(gang[0].key)}
    return {"placements": dict(sorted(where.items()))}


def _classify(cluster: Cluster, potential: list[Pod], snap: _Snapshot) -> list[Pod]:
    """The PDB-violating pods among `potential` (importance order): upstream's classification."""
    budgets: dict[str, int] = {}
    flagged = []
    for p in potential:
        for pdb in snap.covering(p):
            budgets[pdb.uid] = budgets.get(pdb.uid, pdb.disruptions_allowed) - 1
            if budgets[pdb.uid] < 0 and p not in flagged:
                flagged.append(p)
    return flagged


def _key(cluster: Cluster, victims: list[Pod], name: str, snap: _Snapshot) -> tuple[int, ...]:
    prios = [_prio(cluster, v) for v in victims]
    highest = max(prios)
    earliest = min(v.start for v in victims if _prio(cluster, v) == highest)
    return (
        violations_of(cluster, victims, snap.covering),
        highest,
        sum(p + SHIFT for p in prios),
        len(victims),
        -earliest,
    )


# ---- the DaemonSet flow, literally (docs/semantics.md §6) -------------------------------------


def decide_daemonset(cluster: Cluster, pod: Pod, now: int, config: Any) -> dict[str, Any]:
    """The DaemonSet flow's answer as {outcome, node, victims: sorted keys}."""
    nothing: dict[str, Any] = {"node": None, "victims": []}
    name = placement.required_node(pod)
    if not name or name not in cluster.nodes:
        return {"outcome": "unschedulable", **nothing}
    node = cluster.nodes[name].node
    if placement.unresolvable(node, pod) is not None:
        return {"outcome": "unschedulable", **nothing}
    prio = _prio(cluster, pod)
    here = [p for p in _bound(cluster) if p.node == name and p.uid != pod.uid]
    promised = _promised(cluster, name, {pod.uid}, prio)
    if _fits(pod.requests, node.allocatable, here + promised):
        return {"outcome": "fits", "node": name, "victims": []}
    policy = _policy(cluster, pod)
    if policy == "Never":
        return {"outcome": "unschedulable", **nothing}
    settings = config.daemonset
    since = pod.unschedulable_since if pod.unschedulable_since is not None else pod.created
    delay = settings.preemption_start_delay_seconds * 1_000_000
    if delay > 0 and (since is None or now - since < delay):
        return {"outcome": "wait", **nothing}
    if pod.nominated == name:
        for p in here:
            if p.deleting and p.disruption_target and not p.daemonset and _prio(cluster, p) <= prio:
                return {"outcome": "wait", **nothing}

    def klass(p: Pod) -> int:
        if any(
            (src.get("yunikorn.apache.org/allow-preemption") or "").strip().lower() == "false"
            for src in (p.labels, p.annotations)
        ):
            return 2
        owned = any(o.uid == p.uid for q in cluster.pods.values() if q.uid != p.uid for o in q.owners)
        return 1 if owned else 0

    def size(p: Pod) -> Fraction:
        return sum(
            (
                Fraction(p.requests.get(r, 0), node.allocatable[r])
                for r, v in pod.requests.items()
                if r != "pods" and v > 0 and node.allocatable.get(r, 0) > 0
            ),
            Fraction(0),
        )

    candidates = [
        p
        for p in here
        if not p.daemonset
        and not (p.deleting or _flag(p.labels.get(_SOFT)))
        and _prio(cluster, p) <= prio
        and not _tolerates(cluster, p, prio, now)
    ]
    candidates.sort(
        key=lambda p: (
            klass(p),
            _prio(cluster, p),
            -(p.created if p.created is not None else p.start),
            -size(p),
            p.uid,
        )
    )
    rest = [p for p in here if p not in candidates]
    for strategy in settings.victim_selection_strategy:
        if strategy == "single":
            best = None
            for i, p in enumerate(candidates):
                if any(pod.requests.get(r, 0) <= 0 for r in p.requests):
                    continue
                dev = max(Fraction(abs(a - pod.requests[r]), pod.requests[r]) for r, a in p.requests.items())
                others = [q for q in candidates if q is not p]
                if (
                    dev * 100 <= settings.single_victim_deviation_percent
                    and _fits(pod.requests, node.allocatable, rest + others + promised)
                    and (best is None or (dev, i) < best[:2])
                ):
                    best = (dev, i, p)
            if best is not None:
                return {"outcome": "preempt", "node": name, "victims": [best[2].key]}
        else:
            chosen: list[Pod] = []
            for p in candidates:
                if len(chosen) == settings.max_victims:
                    break
                chosen.append(p)
                left = [q for q in candidates if q not in chosen]
                if _fits(pod.requests, node.allocatable, rest + left + promised):
                    return {"outcome": "preempt", "node": name, "victims": sorted(v.key for v in chosen)}
    return {"outcome": "unschedulable", **nothing}
