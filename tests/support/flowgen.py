"""Object builders and hypothesis strategies for the job and DaemonSet flows.

Built on tests.support.gen's node and pod builders: the same raw Kubernetes objects,
plus what these flows read (namespaces, quota and pod-group labels,
ElasticQuotas, DaemonSet owners, creation times, opt-out annotations).
Clusters stay small so that quota limits, gang splits, ties between candidates
and terminating or soft-evicted pods all occur often.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from engine import job
from tests.support import gen
from tests.support.gen import NOW, node

__all__ = [
    "NOW",
    "daemonset_clusters",
    "daemonset_owner",
    "ds_pod",
    "job_clusters",
    "jpod",
    "node",
    "quota",
    "running",
    "tolerant_forever",
]

TIMES = ("2025-12-31T20:00:00Z", "2025-12-31T22:00:00Z", "2025-12-31T23:00:00Z", "2025-12-31T23:59:00Z")


def jpod(
    name: str,
    *,
    namespace: str = "team-a",
    node: str | None = None,
    priority: int = 0,
    cpu_m: int = 1000,
    mem_gi: int = 0,
    group: str | None = None,
    quota_name: str | None = None,
    preemptible: str | None = None,
    can_preempt: str | None = None,
    soft_evicted: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    """A pod for the job flow: gen.pod in a namespace, with the Koordinator labels asked for."""
    labels: dict[str, str] = dict(kw.pop("labels", None) or {})
    if group:
        labels[job.POD_GROUP] = group
    if quota_name:
        labels[job.QUOTA_NAME] = quota_name
    if preemptible is not None:
        labels[job.PREEMPTIBLE] = preemptible
    if can_preempt is not None:
        labels[job.CAN_PREEMPT] = can_preempt
    if soft_evicted:
        labels[job.SOFT_EVICTION] = "true"
    obj = gen.pod(name, node=node, priority=priority, cpu_m=cpu_m, mem_gi=mem_gi, labels=labels, **kw)
    obj["metadata"]["namespace"] = namespace
    obj["metadata"]["uid"] = f"{namespace}-{name}-uid"
    return obj


def quota(name: str, namespace: str, *, min_cpu: int, max_cpu: int, extra: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"min": {"cpu": str(min_cpu)}, "max": {"cpu": str(max_cpu)}}
    if extra:
        spec["min"]["memory"] = "4Gi"
        spec["max"]["memory"] = "64Gi"
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}-uid"},
        "spec": spec,
    }


def running(
    name: str,
    *,
    node: str,
    priority: int = 0,
    cpu_m: int = 1000,
    created: str = TIMES[0],
    owners: list[dict[str, str]] | None = None,
    opt_out: str | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """A bound pod for the DaemonSet flow, with creationTimestamp, owners and the opt-out marker."""
    obj = gen.pod(name, node=node, priority=priority, cpu_m=cpu_m, start=created, **kw)
    meta = obj["metadata"]
    meta["creationTimestamp"] = created
    if owners:
        meta["ownerReferences"] = owners
    if opt_out == "label":
        meta["labels"]["yunikorn.apache.org/allow-preemption"] = "false"
    elif opt_out == "annotation":
        meta["annotations"] = {"yunikorn.apache.org/allow-preemption": "false"}
    return obj


def tolerant_forever() -> dict[str, Any]:
    """PriorityClass "tolerant" (value 10): its pods tolerate every preemptor below 10000, forever."""
    prefix = "preemption-toleration.scheduling.x-k8s.io/"
    annotations = {prefix + "minimum-preemptable-priority": "10000", prefix + "toleration-seconds": "-1"}
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "tolerant", "annotations": annotations},
        "value": 10,
    }


def daemonset_owner(name: str) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": f"{name}-ds-uid"}


def ds_pod(
    name: str,
    *,
    required: str,
    priority: int = 1000,
    cpu_m: int = 1000,
    mem_gi: int = 0,
    created: str = "2025-12-31T23:55:00Z",
    unschedulable_since: str | None = "2025-12-31T23:55:00Z",
    bound: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    """A DaemonSet pod pinned to `required` by matchFields metadata.name (as the controller writes it)."""
    obj = gen.pod(name, node=required if bound else None, priority=priority, cpu_m=cpu_m, mem_gi=mem_gi, **kw)
    obj["metadata"]["creationTimestamp"] = created
    obj["metadata"]["ownerReferences"] = [daemonset_owner(name.split("-")[0])]
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [required]}]}
                ]
            }
        }
    }
    if unschedulable_since and not bound:
        obj["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": unschedulable_since,
            }
        ]
    return obj


# ---- strategies -----------------------------------------------------------------------

PRIORITIES = (0, 10, 100, 1000)
PREEMPTIBLE = (None, "true", "false")


@st.composite
def job_clusters(draw: st.DrawFn, *, pressure: bool = False) -> dict[str, Any]:
    """{objects, preemptor, config, now}: two teams with quotas, bound pods, and one pending gang.

    `pressure`: the gang passes its quota gate and may trigger, so most examples
    exercise victim selection and placement rather than the early refusals.
    """
    names = [f"n{i}" for i in range(1, draw(st.integers(1, 3)) + 1)]
    objects: list[dict[str, Any]] = [gen.tolerant_class()]
    for name in names:
        objects.append(node(name, draw(st.sampled_from((2, 3, 4))), 16, draw(st.sampled_from((3, 110)))))
    for team in ("team-a", "team-b"):
        # Permissive limits first: hypothesis draws (and shrinks towards) the first choices most.
        lo = 8 if pressure else draw(st.sampled_from((8, 4, 2, 0)))
        objects.append(
            quota(f"q-{team}", team, min_cpu=lo, max_cpu=lo + draw(st.sampled_from((16, 8, 4, 0))))
        )
    for i in range(draw(st.integers(1, 10))):
        team = draw(st.sampled_from(("team-a", "team-b", "other")))
        prio = draw(st.sampled_from(PRIORITIES))
        deleting = draw(st.integers(0, 7)) == 0
        objects.append(
            jpod(
                f"r{i}",
                namespace=team,
                node=draw(st.sampled_from(names)),
                priority=prio,
                cpu_m=draw(st.sampled_from((500, 1000, 1500))),
                start=draw(st.sampled_from(TIMES)),
                # Some pods name their quota, others are in it by namespace.
                quota_name=f"q-{team}" if team != "other" and draw(st.booleans()) else None,
                preemptible=draw(st.sampled_from(PREEMPTIBLE)),
                soft_evicted=draw(st.integers(0, 7)) == 0,
                deleting=deleting,
                disruption=deleting,
                priority_class="tolerant" if prio == 10 and draw(st.booleans()) else None,
            )
        )
    group = "job1"
    size = draw(st.integers(1, 3))
    prio = draw(st.sampled_from((100, 1000, 1000)))
    preemptible = "true" if pressure else draw(st.sampled_from(("true", None, "false")))
    policy = None if pressure else draw(st.sampled_from((None, None, None, "Never")))
    members = [
        jpod(
            f"job1-{i}",
            priority=prio,
            cpu_m=draw(st.sampled_from((500, 1000, 2000))),
            group=group,
            quota_name="q-team-a" if draw(st.booleans()) else None,
            preemptible=preemptible,
            can_preempt=draw(st.sampled_from((None, None, "true"))),
            nominated=draw(st.sampled_from((None, None, *names))),
            policy=policy,
        )
        for i in range(size)
    ]
    config = {
        "quota": {
            "disableDefaultPreemptible": draw(st.integers(0, 3)) == 3,
            "disableDefaultTriggerPreemption": not pressure and draw(st.integers(0, 3)) == 3,
            "podShouldBeDeletedWhenPreempted": draw(st.booleans()),
        }
    }
    return {"name": "generated-job", "now": NOW, "objects": objects, "preemptor": members, "config": config}


@st.composite
def daemonset_clusters(draw: st.DrawFn) -> dict[str, Any]:
    """{objects, preemptor, config, now}: a few nodes, mixed pods on them, one pending DaemonSet pod."""
    names = [f"n{i}" for i in range(1, draw(st.integers(1, 3)) + 1)]
    objects: list[dict[str, Any]] = [gen.tolerant_class()]
    for name in names:
        objects.append(node(name, draw(st.sampled_from((2, 3, 4))), 16, 110))
    uids: list[str] = []
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(("plain", "plain", "daemonset", "executor")))
        owners: list[dict[str, str]] | None = None
        if kind == "daemonset":
            owners = [daemonset_owner(f"other{i}")]
        elif kind == "executor" and uids:
            owner_uid = draw(st.sampled_from(uids))
            owners = [{"apiVersion": "v1", "kind": "Pod", "name": owner_uid[:-4], "uid": owner_uid}]
        prio = draw(st.sampled_from(PRIORITIES))
        deleting = draw(st.integers(0, 7)) == 0
        objects.append(
            running(
                f"p{i}",
                node=draw(st.sampled_from(names)),
                priority=prio,
                cpu_m=draw(st.sampled_from((0, 400, 500, 1000, 1100))),
                mem_gi=draw(st.sampled_from((0, 0, 1))),
                created=draw(st.sampled_from(TIMES)),
                owners=owners,
                opt_out=draw(st.sampled_from((None, None, "label", "annotation"))),
                labels={job.SOFT_EVICTION: "true"} if draw(st.integers(0, 7)) == 7 else None,
                deleting=deleting,
                disruption=deleting,
                priority_class="tolerant" if prio == 10 and draw(st.booleans()) else None,
            )
        )
        uids.append(f"p{i}-uid")
    pre = ds_pod(
        "fluentd-x",
        required="gone" if draw(st.integers(0, 9)) == 9 else draw(st.sampled_from(names)),
        priority=draw(st.sampled_from((1000, 100, 10))),
        cpu_m=draw(st.sampled_from((1000, 2000, 500))),
        mem_gi=draw(st.sampled_from((0, 1))),
        created=draw(st.sampled_from(TIMES)),
        unschedulable_since=draw(st.sampled_from((None, *TIMES))),
    )
    config = {
        "victimAction": draw(st.sampled_from(("delete", "evict"))),
        "daemonset": {
            "preemptionStartDelaySeconds": draw(st.sampled_from((0, 0, 600, 7200))),
            "victimSelectionStrategy": draw(
                st.sampled_from((["multiple"], ["single"], ["single", "multiple"], ["multiple", "single"]))
            ),
            "singleVictimDeviationPercent": draw(st.sampled_from((0, 10, 50))),
            "maxVictims": draw(st.sampled_from((5, 3, 2, 1))),
        },
    }
    return {"name": "generated-ds", "now": NOW, "objects": objects, "preemptor": [pre], "config": config}
