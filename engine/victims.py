"""Victims as every flow reports them, and which pods are already leaving.

Shared by the three flows (default, job, DaemonSet), below all of them, so the
flows import it rather than each other: `to_victims` turns chosen pods into the
decision's victim entries, and `leaving` says whose capacity is already on its
way out (terminating, or soft-evicted by an earlier job decision).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.cluster import Cluster
from engine.decision import Victim
from engine.objects import Pod

# Label (value "true") plus an annotation of the same key holding the JSON detail,
# written on job-flow `label` victims: a JSON document is not a valid label value.
SOFT_EVICTION = "scheduling.koordinator.sh/soft-eviction"


def soft_evicted(pod: Pod) -> bool:
    return (pod.labels.get(SOFT_EVICTION) or "").strip().lower() == "true"


def leaving(pod: Pod) -> bool:
    """Terminating or soft-evicted: its capacity is on its way out, no further action needed.

    Soft-evicted pods are removed by an external deleter at its own pace; counting
    them as leaving keeps a slow deleter from triggering a second round of victims.
    """
    return pod.deleting or soft_evicted(pod)


def to_victims(pods: Sequence[Pod], cluster: Cluster, *, action: str) -> tuple[Victim, ...]:
    """The decision's victim entries; pods already leaving are marked, so the actuator leaves them be."""
    return tuple(
        Victim(
            uid=p.uid,
            namespace=p.namespace,
            name=p.name,
            node=p.node or "",
            priority=cluster.priority(p),
            action=action,
            terminating=leaving(p),
        )
        for p in pods
    )
