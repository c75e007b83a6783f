"""Flow selection and the decision entry point every caller uses.

Per pending preemptor (docs/semantics.md): a DaemonSet pod takes the DaemonSet flow; a
pod with the pod-group label or in an ElasticQuota takes the job flow; anything
else the default flow. `decide` is the one function the CLI, the streaming
worker and the audit replay call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine import daemonset, default, interpod, job
from engine import decision as decision_mod
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import FITS, PREEMPT, UNSCHEDULABLE, WAIT, Decision
from engine.index import Index
from engine.objects import Pod
from engine.victims import to_victims


def in_job(cluster: Cluster, pod: Pod) -> bool:
    """Job flow membership: a pod-group member, or a pod charged to an ElasticQuota.

    A quota label alone is not enough: when it names no quota and the namespace has
    none, the pod is charged to nothing (`job.quota_of`) and takes the default flow.
    """
    return job.is_job_pod(cluster, pod)


def select_flow(cluster: Cluster, pods: Sequence[Pod]) -> str:
    if len(pods) == 1 and pods[0].daemonset:
        return "daemonset"
    if len(pods) > 1 or any(in_job(cluster, p) for p in pods):
        return "job"
    return "default"


def decide(
    cluster: Cluster,
    pods: Sequence[Pod],
    *,
    now: int,
    config: Config,
    index: Index | None = None,
) -> Decision:
    """Decide for one pending preemptor (or one gang, all members given).

    Pass the same `index` for every decision over one cluster (the streaming
    worker does): its rankings then stay current incrementally.
    """
    flow = select_flow(cluster, pods)
    if flow == "daemonset":
        return daemonset.decide(cluster, pods[0], now=now, config=config)
    if flow == "job":
        return job.decide(cluster, pods, now=now, config=config, index=index)
    return decide_default(cluster, pods[0], now=now, config=config, index=index)


def decide_default(
    cluster: Cluster, pod: Pod, *, now: int, config: Config, index: Index | None = None
) -> Decision:
    missing = interpod.not_modelled([pod])
    if missing:
        not_modelled: dict[str, Any] = {"flow": "default", interpod.NOT_MODELLED: missing}
        return decision_mod.maker("default", pod.key, pod.uid, not_modelled)(
            UNSCHEDULABLE, interpod.not_modelled_reason(missing)
        )
    pre = default.preemptor(cluster, pod)
    scan = (index or Index(cluster)).scan(pre, now, config.victim_selection)
    explanation = scan.explanation
    explanation["preemptorPriority"] = pre.priority
    explanation["victimSelection"] = config.victim_selection

    make = decision_mod.maker("default", pod.key, pod.uid, explanation)

    if scan.fitting is not None:
        return make(FITS, f"fits on {scan.fitting} without preemption", node=scan.fitting)
    if not default.may_preempt(cluster, pod):
        return make(UNSCHEDULABLE, "preemptionPolicy is Never: the pod may not preempt")
    waiting = default.waiting_on_nominated(cluster, pre)
    if waiting is not None:
        return make(WAIT, waiting)
    best = scan.best
    if best is None:
        return make(UNSCHEDULABLE, "no node can make room by evicting lower-priority pods")
    explanation["chosen"] = default.criteria(best, cluster, detail=True)
    return make(
        PREEMPT,
        f"preempt {len(best.victims)} pod(s) on {best.node}",
        node=best.node,
        victims=to_victims(best.victims, cluster, action=config.victim_action),
    )
