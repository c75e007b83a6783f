"""Small traces for the audit, explain and export tests, each built to show one thing.

- `reprieve()`: the default flow with neighbours that survive: on the chosen node
  two pods are given back (more important: they started earlier) while two are
  evicted, and the other candidate node's would-be victim survives because its
  node ranks worse. `victimSelection: minimal` picks a different victim set here.
- `gang()`: the job flow: a two-pod gang on an ElasticQuota evicts borrowed pods.
- `daemonset()`: the DaemonSet flow: the `multiple` strategy takes the lowest-
  priority pod on the required node and leaves its neighbours.
- `ticks()`: two DaemonSet pods waiting out a start delay, decided on one TICK
  (two decision records with the same seq).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from engine.config import Config
from fold import fleet
from streams.sim import simulator
from tests.support import flowgen, gen

NOW = gen.NOW


def simulate(
    events: Sequence[Mapping[str, Any]], config: Config | None = None, *, key: bytes | None = None
) -> fleet.Result:
    """`replay --simulate` of a trace: the run's full log and its decision records."""
    log: list[Mapping[str, Any]] = list(events)
    return simulator.simulate(log, config or Config(), key=key)


def decisions(
    events: Sequence[Mapping[str, Any]], config: Config | None = None, *, key: bytes | None = None
) -> list[dict[str, Any]]:
    """The decision records of a simulated run, as plain dicts (what a JSONL reader sees)."""
    return [dict(d) for d in simulate(events, config, key=key).decisions]


def trace(
    objects: Sequence[dict[str, Any]],
    pending: Sequence[dict[str, Any]],
    *,
    ts: str = NOW,
    cluster: str = "default",
) -> list[dict[str, Any]]:
    """ADDED events for `objects`, then the pending pods: added, and then reported unschedulable.

    The pending pods are added before any is marked unschedulable, so a gang is
    complete when its first member asks for a decision.
    """
    events: list[dict[str, Any]] = []
    for obj in objects:
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("uid", f"{obj['metadata']['name']}-uid")
        obj["metadata"]["resourceVersion"] = "1"
        events.append({"type": "ADDED", "ts": ts, "cluster": cluster, "object": obj})
    for pod in pending:
        obj = copy.deepcopy(pod)
        obj["metadata"]["resourceVersion"] = "1"
        obj["status"] = {"phase": "Pending", "conditions": []}
        events.append({"type": "ADDED", "ts": ts, "cluster": cluster, "object": obj})
    for pod in pending[:1]:
        obj = copy.deepcopy(pod)
        obj["metadata"]["resourceVersion"] = "2"
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "lastTransitionTime": ts,
        }
        obj["status"] = {"phase": "Pending", "conditions": [condition]}
        events.append({"type": "MODIFIED", "ts": ts, "cluster": cluster, "object": obj})
    return events


def reprieve(cluster: str = "default") -> list[dict[str, Any]]:
    starts = ("2025-12-31T20:00:00Z", "2025-12-31T21:00:00Z", "2025-12-31T22:00:00Z", "2025-12-31T23:00:00Z")
    objects = [
        gen.node("n1", 10, 64, 110),
        gen.node("n2", 10, 64, 110),
        gen.pod("a", node="n1", priority=10, cpu_m=4000, start=starts[0]),
        gen.pod("b", node="n1", priority=10, cpu_m=2000, start=starts[1]),
        gen.pod("c", node="n1", priority=10, cpu_m=2000, start=starts[2]),
        gen.pod("d", node="n1", priority=10, cpu_m=2000, start=starts[3]),
        gen.pod("x", node="n2", priority=50, cpu_m=6000, start=starts[0]),
        gen.pod("y", node="n2", priority=50, cpu_m=4000, start=starts[1]),
    ]
    preemptor = gen.pod("p", node=None, priority=1000, cpu_m=4000)
    # Kept to n1 and n2 (gen.node labels them zone=a), so the story can share a cluster with others.
    preemptor["spec"]["nodeSelector"] = {"zone": "a"}
    return trace(objects, [preemptor], cluster=cluster)


def gang(cluster: str = "default") -> list[dict[str, Any]]:
    objects = [
        gen.node("n1", 8, 64, 110),
        flowgen.quota("quota-a", "team-a", min_cpu=4, max_cpu=12),
        flowgen.quota("quota-b", "team-b", min_cpu=0, max_cpu=8),
        flowgen.jpod(
            "steady", node="n1", priority=1000, cpu_m=2000, quota_name="quota-a", preemptible="false"
        ),
        flowgen.jpod(
            "b-1",
            namespace="team-b",
            node="n1",
            priority=100,
            cpu_m=3000,
            quota_name="quota-b",
            preemptible="true",
            start="2025-12-31T23:00:00Z",
        ),
        flowgen.jpod(
            "b-2",
            namespace="team-b",
            node="n1",
            priority=100,
            cpu_m=3000,
            quota_name="quota-b",
            preemptible="true",
            start="2025-12-31T23:30:00Z",
        ),
    ]
    members = [
        flowgen.jpod(
            f"job1-{i}", priority=1000, cpu_m=3000, group="job1", quota_name="quota-a", preemptible="true"
        )
        for i in range(2)
    ]
    return trace(objects, members, cluster=cluster)


def daemonset(cluster: str = "default") -> list[dict[str, Any]]:
    objects = [
        gen.node("w1", 3, 64, 110),
        flowgen.running("r-a", node="w1", priority=10, cpu_m=1000, created=flowgen.TIMES[0]),
        flowgen.running("r-b", node="w1", priority=20, cpu_m=1000, created=flowgen.TIMES[1]),
        flowgen.running("r-c", node="w1", priority=30, cpu_m=1000, created=flowgen.TIMES[2]),
    ]
    ds = flowgen.ds_pod("agent-w1", required="w1", priority=1000, cpu_m=1000)
    return trace(objects, [ds], cluster=cluster)


def ticks(cluster: str = "default") -> list[dict[str, Any]]:
    """Two DaemonSet pods that must wait out a 60 s start delay, then one TICK decides both."""
    objects = [
        gen.node("w1", 1, 64, 110),
        gen.node("w2", 1, 64, 110),
        flowgen.running("r1", node="w1", priority=10, cpu_m=1000),
        flowgen.running("r2", node="w2", priority=10, cpu_m=1000),
    ]
    events = trace(objects, [], cluster=cluster)
    for n, node in enumerate(("w1", "w2")):
        ds = flowgen.ds_pod(f"agent-{node}", required=node, cpu_m=1000, unschedulable_since=NOW)
        ds["metadata"]["resourceVersion"] = "1"
        events.append({"type": "ADDED", "ts": NOW, "cluster": cluster, "object": ds})
        assert n < 2
    events.append({"type": "TICK", "ts": "2026-01-01T00:02:00Z", "cluster": cluster})
    return events
