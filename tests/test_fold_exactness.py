"""A long-lived folded cluster answers exactly as one built from the current objects.

The streaming worker folds years of watch events into one `Cluster`; a worker
restored from a snapshot builds its cluster from the objects as they are now.
Both must write the same decision records, byte for byte, explanations
included: nothing a decision reads may depend on the path the objects took.

The named tests are the two ways folding once kept history (each fails with its
fix reverted); the property test drives a folded cluster through a generator
made to differ from tests/support/churn.py on purpose (tests/support/foldgen.py: classes deleted
and re-created with other values, priorities written later, global defaults
appearing, resource keys going to zero, nodes and pods re-created with new uids,
stale re-deliveries) and compares it after every event with a cluster built
from the current objects.
"""

from __future__ import annotations

import os
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine import cluster as cluster_mod
from engine import flows, objects, timeutil
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import Decision
from engine.index import Index
from tests.support import flowgen, foldgen, gen


def record(d: Decision) -> bytes:
    """What a decision record carries of a decision: the answer, explanation and victims."""
    return orjson.dumps(
        {"answer": d.answer(), "victims": [v.to_json() for v in d.victims], "members": d.members},
        option=orjson.OPT_SORT_KEYS,
    )


def built(current: dict[Any, dict[str, Any]]) -> Cluster:
    """A cluster from the current objects, as a restored worker builds it."""
    return cluster_mod.build([objects.normalize(o) for o in current.values()])


class Folded:
    """A cluster folding events one at a time, and the API server's current objects beside it."""

    def __init__(self) -> None:
        self.cluster = Cluster()
        self.current: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0

    def write(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        self.cluster.apply(kind, obj)
        key = (obj["kind"], cluster_mod.table_key(obj))
        if kind == "DELETED":
            self.current.pop(key, None)
        else:
            self.current[key] = obj
        return obj

    def decide(self, uids: list[str], *, index: Index | None = None, config: Config | None = None) -> bytes:
        pods = [self.cluster.pods[u] for u in uids]
        return record(flows.decide(self.cluster, pods, now=0, config=config or Config(), index=index))

    def decide_built(self, uids: list[str], config: Config | None = None) -> bytes:
        fresh = built(self.current)
        pods = [fresh.pods[u] for u in uids]
        return record(flows.decide(fresh, pods, now=0, config=config or Config()))


def _class(name: str, value: int, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "uid": uid},
        "value": value,
    }


def test_a_written_priority_equal_to_the_stamp_is_not_stamped_again() -> None:
    """A pod folded without spec.priority is stamped from its class; a later event writes the
    same value explicitly; the class is re-created with another value. The written priority
    stays (a cluster built from the objects reads it), so the pod is still a victim."""
    f = Folded()
    f.write("ADDED", _class("late", 10, "late-1"))
    f.write("ADDED", gen.node("n1", 1, 8, 10))
    victim = gen.pod("v", node="n1", priority=0, cpu_m=1000, priority_class="late")
    del victim["spec"]["priority"]
    f.write("ADDED", victim)
    assert f.cluster.pods["v-uid"].priority == 10  # stamped from the class
    written = {**victim, "spec": {**victim["spec"], "priority": 10}}
    f.write("MODIFIED", written)  # admission's value, now in the object
    f.write("DELETED", _class("late", 10, "late-1"))
    f.write("ADDED", _class("late", 5000, "late-2"))
    f.write("ADDED", gen.pod("x", node=None, priority=100, cpu_m=1000))
    assert f.cluster.pods["v-uid"].priority == 10
    index = Index(f.cluster)
    assert f.decide(["x-uid"], index=index) == f.decide_built(["x-uid"])
    assert b'"outcome":"preempt"' in f.decide(["x-uid"], index=index)


def test_usage_forgets_resources_no_pod_holds_any_more() -> None:
    """A quota's usage and a node's used resources are running totals: when the last pod asking
    for a GPU goes, the key goes too, so a job decision's explanation (which renders usage) is
    the one a restored worker writes."""
    f = Folded()
    f.write("ADDED", gen.node("n1", 4, 8, 10))
    f.write("ADDED", flowgen.quota("q", "team-a", min_cpu=2, max_cpu=8))
    gpu = flowgen.jpod("gpu", namespace="team-a", node="n1", priority=0, cpu_m=1000, preemptible="true")
    gpu["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    f.write("ADDED", gpu)
    f.write("ADDED", flowgen.jpod("cpu", namespace="team-a", node="n1", priority=0, cpu_m=3000))
    f.write("DELETED", gpu)
    member = flowgen.jpod("j", namespace="team-a", priority=100, cpu_m=2000, group="g", preemptible="true")
    f.write("ADDED", member)
    fresh = built(f.current)
    assert f.cluster.usage == fresh.usage
    assert {n: s.used for n, s in f.cluster.nodes.items()} == {n: s.used for n, s in fresh.nodes.items()}
    uid = member["metadata"]["uid"]
    assert f.decide([uid], index=Index(f.cluster)) == f.decide_built([uid])


# FOLD_EXAMPLES=5000 for a longer hunt than `make test`'s (about 10 s here).
SETTINGS = settings(
    max_examples=int(os.environ.get("FOLD_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(foldgen.histories(), st.sampled_from(("kubernetes", "minimal")))
def test_a_long_lived_fold_writes_the_records_of_a_cluster_built_from_the_objects(
    history: foldgen.History, mode: str
) -> None:
    config = Config(victim_selection=mode)
    cluster = Cluster()
    index = Index(cluster)
    now = timeutil.parse(foldgen.NOW)
    for step, (kind, obj, advance, current) in enumerate(history.events):
        now += advance * timeutil.SECOND
        if obj is not None:
            cluster.apply(kind, obj)
        fresh = cluster_mod.build([objects.normalize(o) for o in current])
        for question in history.questions:
            if not all(u in fresh.pods and fresh.pods[u].node is None for u in question):
                continue  # bound since: nothing to decide
            assert sorted(question) == sorted(u for u in question if u in cluster.pods), (step, question)
            folded = flows.decide(
                cluster, [cluster.pods[u] for u in question], now=now, config=config, index=index
            )
            again = flows.decide(fresh, [fresh.pods[u] for u in question], now=now, config=config)
            assert record(folded) == record(again), (step, kind, question, mode)
            event(f"{folded.flow} {folded.outcome}")
