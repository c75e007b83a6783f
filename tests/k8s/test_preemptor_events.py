"""The Event on the pending preemptor (streams.kube.preemptor_events), on the real kube-apiserver.

The actuator handles decision records as the chart's actuator ServiceAccount (its real RBAC):
a `preempt` decision leaves a Normal `Preempting` Event on the preemptor, naming the node and
the victims; an `unschedulable` one (a real record of the engine, re-addressed to a pod of the
test) a Warning `FailedScheduling` with the engine's reasons, as kube-scheduler writes its own.
Repeats, bursts, redeliveries and dry runs are checked against what the server stored.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio import client

from schemas import chain
from streams.kafka.sink import MemorySink
from streams.kube import eviction, preemptor_events
from streams.kube.actuator import Actuator
from streams.kube.ledger import Ledger
from streams.kube.preemptor_events import PreemptorEvents, TokenBucket
from streams.sim import traces
from testbed import cluster
from tests.k8s.decisions import FAST, KEY, ORIGIN, decision, victim
from tests.k8s.real_api import pod, preemptor
from tests.support import audit_traces

# The fields kube-scheduler v1.34.2 sets on its FailedScheduling Event (read from a real
# kube-scheduler against this API server: testbed/scheduler.py); ours sets each of them.
KUBE_SCHEDULER_FIELDS = {"eventTime", "reportingController", "reportingInstance", "action", "reason",
                         "regarding", "note", "type"}  # fmt: skip


def events(kube_cluster: cluster.TestCluster, namespace: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for e in kube_cluster.request("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")["items"]:
        found.setdefault(e["regarding"]["name"], []).append(e)
    return found


def unschedulable(preemptor: dict[str, Any], decision_id: str) -> dict[str, Any]:
    """The engine's own unschedulable record for the example's ex1-d, re-addressed to `preemptor`."""
    (record,) = [d for d in audit_traces.decisions(traces.example()) if d["outcome"] == "unschedulable"][:1]
    record = copy.deepcopy(record)
    record.update(
        id=decision_id,
        preemptor=f"{preemptor['metadata']['namespace']}/{preemptor['metadata']['name']}",
        preemptorUid=preemptor["metadata"]["uid"],
    )
    record.pop("sig", None)
    return chain.seal(record, chain.GENESIS, KEY)


def actuator_with_events(api: client.ApiClient, announcer: PreemptorEvents) -> tuple[Actuator, MemorySink]:
    sink = MemorySink()
    actions = eviction.Actions(api, identity="actuator-test", retry=FAST)
    return Actuator(actions, sink, Ledger(), hmac_key=KEY, preemptor_events=announcer), sink


async def test_a_preempt_decision_writes_its_event_on_the_preemptor(
    kube_cluster: cluster.TestCluster,
    as_actuator: client.ApiClient,
    ns: str,
) -> None:
    high = preemptor(kube_cluster, "high", ns)  # above its victims, or the actuator refuses the decision
    low = [kube_cluster.apply(pod(f"low-{i}", ns, node_name="n1")) for i in range(2)]
    act, sink = actuator_with_events(as_actuator, PreemptorEvents(as_actuator, identity="actuator-0"))
    record = decision(high, [victim(p, "delete") for p in low], decision_id=f"default/7/{ns}")
    await act.handle(orjson.dumps(record), key=b"default", origin=ORIGIN)

    (event,) = events(kube_cluster, ns)["high"]
    assert {k for k, v in event.items() if v} >= KUBE_SCHEDULER_FIELDS
    assert (event["type"], event["reason"], event["action"]) == ("Normal", "Preempting", "Preempting")
    assert (event["reportingController"], event["reportingInstance"]) == ("preemptctl", "actuator-0")
    assert event["regarding"] == {
        "apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": "high", "uid": high["metadata"]["uid"],
    }  # fmt: skip
    assert event["related"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert event["note"] == (
        f"preempting 2 pod(s) on node n1: {ns}/low-0, {ns}/low-1 (preemptctl decision default/7/{ns})"
    )
    assert event["metadata"]["annotations"][eviction.DECISION_ANNOTATION] == f"default/7/{ns}"
    # The victims still get theirs (Preempted), and the decision was acted on.
    assert {e[0]["reason"] for name, e in events(kube_cluster, ns).items() if name != "high"} == {"Preempted"}
    assert len(sink.on("preemption.evictions")) == 2


async def test_an_unschedulable_decision_says_why_as_kube_scheduler_would(
    kube_cluster: cluster.TestCluster,
    as_actuator: client.ApiClient,
    ns: str,
) -> None:
    stuck = kube_cluster.apply(pod("stuck", ns))
    act, sink = actuator_with_events(as_actuator, PreemptorEvents(as_actuator))
    record = unschedulable(stuck, f"default/8/{ns}")
    assert await act.handle(orjson.dumps(record), key=b"default", origin=ORIGIN) == []

    (event,) = events(kube_cluster, ns)["stuck"]
    assert (event["type"], event["reason"], event["action"]) == ("Warning", "FailedScheduling", "Preempting")
    reasons = record["explanation"]["rejectedReasons"]
    assert event["note"].startswith(
        f"preemption: 0/{record['explanation']['rejectedCount']} nodes are available: "
    )
    assert all(f"{n} {r}" in event["note"] for r, n in reasons.items())
    assert event["note"].endswith(f"(preemptctl decision default/8/{ns})")
    assert event["regarding"]["uid"] == stuck["metadata"]["uid"] and "related" not in event
    assert sink.on("preemption.evictions") == []


async def test_repeats_bursts_redeliveries_and_dry_runs(
    kube_cluster: cluster.TestCluster,
    as_actuator: client.ApiClient,
    ns: str,
) -> None:
    pods = [kube_cluster.apply(pod(f"p-{i}", ns)) for i in range(4)]
    now = [0.0]
    announcer = PreemptorEvents(
        as_actuator, clock=lambda: now[0], bucket=TokenBucket(burst=3, rate=0.5, clock=lambda: now[0])
    )
    first = unschedulable(pods[0], f"default/1/{ns}")
    assert await announcer.post(first) == ["posted"]
    # The pod decided for again, with the same answer: one Event, not two.
    assert await announcer.post(unschedulable(pods[0], f"default/2/{ns}")) == ["repeated"]
    # A burst over three more pods: the bucket has two tokens left.
    results = [await announcer.post(unschedulable(p, f"default/3{i}/{ns}")) for i, p in enumerate(pods[1:])]
    assert results == [["posted"], ["posted"], ["rate-limited"]]
    # Tokens refill; and once the window has passed, the same answer is worth an Event again.
    now[0] += preemptor_events.SAME_EVENT_WINDOW_S + 1
    assert await announcer.post(unschedulable(pods[3], f"default/4/{ns}")) == ["posted"]
    assert await announcer.post(unschedulable(pods[0], f"default/5/{ns}")) == ["posted"]
    # A restarted actuator handed the same decision again: the Event exists already (409).
    assert await PreemptorEvents(as_actuator).post(first) == ["posted"]
    # A dry run's Event is checked by the server and not stored.
    assert await PreemptorEvents(as_actuator, dry_run=True).post(
        unschedulable(pods[2], f"default/6/{ns}")
    ) == ["posted"]
    stored = events(kube_cluster, ns)
    assert {name: len(found) for name, found in stored.items()} == {"p-0": 2, "p-1": 1, "p-2": 1, "p-3": 1}
    assert sample("unschedulable", "rate-limited") >= 1 and sample("unschedulable", "repeated") >= 1


def sample(outcome: str, result: str) -> float:
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(
        "preemptctl_actuator_preemptor_events_total", {"outcome": outcome, "result": result}
    )
    return value or 0.0


def test_fits_needs_no_event_and_a_job_posts_on_its_members() -> None:
    assert list(preemptor_events.events_for({"outcome": "fits", "preemptor": "a/b"})) == []
    job = {
        "id": "c/9/j",
        "outcome": "preempt",
        "flow": "job",
        "preemptor": "team/train",
        "placements": {f"team/w-{i}": f"n{i % 2}" for i in range(40)},
        "victims": [{"namespace": "x", "name": "v", "uid": "u"}],
    }
    posted = list(preemptor_events.events_for(job))
    assert len(posted) == preemptor_events.JOB_MEMBERS_LIMIT
    assert all(e.note.startswith("job team/train (40 member(s)): preempting 1 pod(s)") for e in posted)
    assert posted[0].node == "n0" and "this member on node n0" in posted[0].note
    long = {"id": "c/1/x", "outcome": "preempt", "preemptor": "a/b", "node": "n",
            "victims": [{"namespace": "x", "name": "v" * 300, "uid": str(i)} for i in range(20)]}  # fmt: skip
    (event,) = preemptor_events.events_for(long)
    assert len(event.note.encode()) <= eviction.EVENT_MESSAGE_LIMIT and "and 15 more" not in event.note


@given(
    burst=st.integers(1, 10),
    rate=st.floats(0.0, 5.0),
    steps=st.lists(st.floats(0.0, 3.0), max_size=60),
)
def test_the_bucket_never_lets_more_through_than_burst_plus_rate_times_time(
    burst: int, rate: float, steps: list[float]
) -> None:
    now = [0.0]
    bucket = TokenBucket(burst=burst, rate=rate, clock=lambda: now[0])
    taken = 0
    tokens = float(burst)  # the reference: the same arithmetic, written out
    for step in steps:
        now[0] += step
        tokens = min(float(burst), tokens + step * rate)
        expected = tokens >= 1.0
        if expected:
            tokens -= 1.0
        got = bucket.take()
        assert got == expected
        taken += got
        assert taken <= burst + rate * now[0] + 1e-9


@pytest.mark.parametrize("outcome", ["preempt", "wait", "unschedulable"])
def test_every_event_fits_the_servers_limits(outcome: str) -> None:
    explanation = {"rejectedReasons": {"x" * 500: 3, "y" * 500: 2}, "rejectedCount": 5}
    record = {"id": "d" * 300, "outcome": outcome, "preemptor": "n/" + "p" * 253, "preemptorUid": "u",
              "node": "m" * 253, "reason": "r" * 2000, "victims": [], "explanation": explanation}  # fmt: skip
    (event,) = preemptor_events.events_for(record)
    body = preemptor_events.event_body(event, decision_id=record["id"], identity="i" * 300, now="t")
    assert len(body["metadata"]["name"]) <= 253 and not body["metadata"]["name"].split(".")[0].endswith("-")
    assert len(body["note"].encode()) <= eviction.EVENT_MESSAGE_LIMIT
    assert len(body["reportingInstance"]) <= eviction.REPORTING_INSTANCE_LIMIT
