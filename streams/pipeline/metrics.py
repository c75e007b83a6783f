"""The worker's operator metrics: how far behind the log it is, what it decides, and how fast.

Each is recorded where its effect happens, through the functions below:
`folded` after a cluster-events record is folded, `positioned` after the agent
has moved past a record, `emitted` once a decision is published (acknowledged
by the broker; under exactly_once, committed). Names follow Prometheus'
conventions (base units, `_total` for counters); victims per decision mirrors
kube-scheduler's `scheduler_preemption_victims`.

The worker's own lag goes quiet exactly when the worker is stuck (its scrape
fails); streams.kafka.lag measures the same from outside, from the group's
committed offsets.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from engine import timeutil
from engine.errors import InvalidObject
from schemas.records import DecisionRecord

LAG_RECORDS = Gauge(
    "preemptctl_worker_lag_records",
    "cluster-events records not folded yet: the partition's log end offset minus the worker's position.",
    ["partition"],
)
LAG_SECONDS = Gauge(
    "preemptctl_worker_lag_seconds",
    "Seconds between the time of the last event folded (its ts) and its fold.",
    ["partition"],
)
# Decision metrics carry the decision's cluster: one worker folds the partitions of several
# clusters, and a dashboard or an alert about one cluster must not mix in the others.
DECISIONS = Counter(
    "preemptctl_decisions_total",
    "Decisions sent to preemption.decisions, by cluster, flow and outcome.",
    ["cluster", "flow", "outcome"],
)
DECISION_SECONDS = Histogram(
    "preemptctl_decision_duration_seconds",
    "Seconds from taking up the cluster-events record that called for a decision to the commit "
    "that published it (acknowledged by the broker; under exactly_once, visible to consumers).",
    ["cluster", "flow"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
NOT_MODELLED = Counter(
    "preemptctl_not_modelled_total",
    "Decisions answered unschedulable because the preemptor needs what preemptctl does not evaluate "
    "(volumes, resource claims; inter-pod requirements in the job flow), by cluster and flow: "
    "kube-scheduler's own preemption decides such pods better (docs/semantics.md §10).",
    ["cluster", "flow"],
)
# kube-scheduler's buckets for scheduler_preemption_victims: more than 64 victims is rare.
VICTIMS = Histogram(
    "preemptctl_preemption_victims",
    "Victims a preempt decision selects (pods already terminating not counted), by cluster and flow.",
    ["cluster", "flow"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)


# Liveness (issue 22): a preemptor that waits long is a stuck loop or a cluster that is full.
WAITING = Gauge(
    "preemptctl_preemptors_waiting",
    "Pending preemptors the worker has decided for and decides again while they stay pending.",
    ["cluster"],
)
OLDEST_WAITING = Gauge(
    "preemptctl_preemptor_oldest_wait_seconds",
    "Log time since the first decision for the longest-waiting pending preemptor (0 when none waits).",
    ["cluster"],
)


def waiting(cluster: str, count: int, oldest: int | None, *, now: int) -> None:
    """After a record is folded: the cluster's waiting preemptors, and the oldest one's wait on log time."""
    WAITING.labels(cluster).set(count)
    OLDEST_WAITING.labels(cluster).set(0.0 if oldest is None else max(0, now - oldest) / timeutil.SECOND)


def folded(partition: int, ts: object) -> None:
    """After a record is folded: how old its last event was (the source stamps ts when it sees an event)."""
    if not isinstance(ts, str):
        return  # a bad event was dead-lettered; the next good one sets the gauge
    try:
        at = timeutil.parse(ts, field="ts") / timeutil.SECOND
    except InvalidObject:
        return  # an event with a bad ts was dead-lettered; the next good one sets the gauge
    LAG_SECONDS.labels(str(partition)).set(max(0.0, time.time() - at))


def positioned(partition: int, highwater: Callable[[], int | None], position: int | None) -> None:
    """After the agent moved past `position`: records left between it and the log end.

    `highwater` is the consumer's log end offset from its last fetch (no request of its own);
    it is unknown before the first fetch and while the partition is being reassigned.
    """
    if position is None:
        return  # the partition is not open here (revoked, or reopening)
    try:
        end = highwater()
    except (AssertionError, KeyError):  # aiokafka asserts the partition is assigned
        return
    if end is not None:
        LAG_RECORDS.labels(str(partition)).set(max(0, end - (position + 1)))


def emitted(decision: DecisionRecord, seconds: float) -> None:
    """Once `decision` is published, `seconds` after its record was taken up."""
    cluster, flow = decision["cluster"], decision["flow"]
    DECISIONS.labels(cluster, flow, decision["outcome"]).inc()
    DECISION_SECONDS.labels(cluster, flow).observe(seconds)
    explanation = decision.get("explanation")
    if isinstance(explanation, dict) and explanation.get("notModelled"):
        NOT_MODELLED.labels(cluster, flow).inc()
    if decision["outcome"] == "preempt":
        VICTIMS.labels(cluster, flow).observe(sum(1 for v in decision["victims"] if not v.get("terminating")))


def forget(partition: int) -> None:
    """The partition left this worker: its series go, rather than stay frozen at their last value
    (a lag left behind by a revoked partition would keep the falling-behind alert firing)."""
    for gauge in (LAG_RECORDS, LAG_SECONDS):
        with contextlib.suppress(KeyError):
            gauge.remove(str(partition))
