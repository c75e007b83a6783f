"""Typed shapes of every topic's values (DESIGN §5) and their orjson encode/decode.

Each value carries `v`, the envelope version. Compatibility policy: within a
version, fields are only ever added (consumers must ignore unknown fields);
a change that removes or retypes a field bumps `v`, and consumers reject
versions they do not know.
"""

from typing import Any, Literal, NotRequired, TypedDict

import orjson

from schemas import VERSION

CLUSTER_EVENTS = "preemption.cluster-events"
DECISIONS = "preemption.decisions"
EVICTIONS = "preemption.evictions"
DEAD_LETTER = "preemption.dead-letter"
TOPICS = (CLUSTER_EVENTS, DECISIONS, EVICTIONS, DEAD_LETTER)

EventType = Literal["ADDED", "MODIFIED", "DELETED", "RESYNC", "TICK", "OUTCOME"]
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED", "RESYNC", "TICK", "OUTCOME")
OBJECT_EVENTS = ("ADDED", "MODIFIED", "DELETED")


class Scope(TypedDict):
    """A RESYNC's `scope`: the schedulers whose pending pods the log's decisions are for."""

    schedulerNames: list[str]


# What nominating the preemptor found (streams.kube.eviction.Nomination), or `none` when the
# decision asked for no nomination. The middle four refuse the decision: no victim was touched.
NOMINATION_RESULTS = ("done", "gone", "recreated", "bound", "out-of-scope", "error", "none")


class Outcome(TypedDict):
    """An OUTCOME event's `outcome`: what the actuator did with one preempt decision."""

    decisionId: str
    preemptorUid: str
    # done, gone, recreated, bound, out-of-scope (the last four refuse the decision: no
    # victim was touched), error (retried on redelivery), or none (no nomination asked).
    nomination: str
    victims: dict[str, str]  # victim uid -> its eviction result (EVICTION_RESULTS)
    message: NotRequired[str]


class ClusterEvent(TypedDict):
    ts: str
    type: EventType
    object: NotRequired[dict[str, Any]]
    scope: NotRequired[Scope]  # RESYNC: written by the source; absent means every scheduler
    outcome: NotRequired[Outcome]  # OUTCOME: written by the actuator (or the simulated one)
    cluster: NotRequired[str]  # in a JSONL trace; inside a record the envelope names the cluster


class ClusterEventBatch(TypedDict):
    """One record of preemption.cluster-events: an ordered batch of a cluster's events."""

    v: int
    cluster: str
    events: list[ClusterEvent]


class VictimRecord(TypedDict):
    uid: str
    namespace: str
    name: str
    node: str
    priority: int
    action: Literal["delete", "evict", "label"]
    terminating: NotRequired[bool]


class DecisionRecord(TypedDict):
    v: int
    id: str
    cluster: str
    seq: int
    ts: str
    flow: str
    preemptor: str
    preemptorUid: str
    outcome: str
    node: NotRequired[str]
    placements: NotRequired[dict[str, str]]
    victims: list[VictimRecord]
    reason: str
    explanation: dict[str, Any]
    configHash: str
    engineVersion: str
    prevHash: str
    hash: str
    sig: NotRequired[str]


EvictionResult = Literal[
    "done", "already-gone", "already-terminating", "uid-changed", "blocked-by-pdb", "error"
]
EVICTION_RESULTS = ("done", "already-gone", "already-terminating", "uid-changed", "blocked-by-pdb", "error")


class EvictionRecord(TypedDict):
    v: int
    decisionId: str
    cluster: str
    victim: VictimRecord
    action: str
    result: EvictionResult
    attempts: int
    ts: str
    dryRun: NotRequired[bool]
    message: NotRequired[str]


# Dead letters carry the rejected bytes unchanged as the value; these headers say why and whence.
DEAD_LETTER_HEADERS = ("origin-topic", "origin-partition", "origin-offset", "error-class", "error")


class DecodeError(ValueError):
    """Bytes that are not a valid record of the expected shape."""


def encode(value: Any) -> bytes:
    return orjson.dumps(value)


def decode_envelope(data: bytes) -> ClusterEventBatch:
    """Parse a cluster-events record and check its envelope (v, cluster, events); DecodeError otherwise.

    The events themselves are not checked: a consumer that folds events one by one
    rejects each bad one on its own (`event_problem`), not the whole record.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DecodeError("record is not a JSON object")
    if value.get("v") != VERSION:
        raise DecodeError(f"unsupported envelope version {value.get('v')!r}")
    if not isinstance(value.get("cluster"), str) or not isinstance(value.get("events"), list):
        raise DecodeError("record needs cluster (string) and events (list)")
    return value  # type: ignore[return-value]


def key_problem(key: bytes | None, batch: ClusterEventBatch) -> str | None:
    """Why a record's key does not fit its envelope, or None.

    The key decides the partition, and one partition holds a cluster's whole log
    in order; a record keyed by another cluster could be folded out of order.
    """
    if key != batch["cluster"].encode():
        shown = key.decode(errors="replace") if key is not None else None
        return f"record key {shown!r} is not the envelope's cluster {batch['cluster']!r}"
    return None


def decode_batch(data: bytes) -> ClusterEventBatch:
    """Parse and validate a cluster-events record, every event included; DecodeError with the reason."""
    value = decode_envelope(data)
    for i, event in enumerate(value["events"]):
        problem = event_problem(event)
        if problem:
            raise DecodeError(f"events[{i}]: {problem}")
    return value


def event_problem(event: Any) -> str | None:
    """Why one event is malformed, or None."""
    if not isinstance(event, dict):
        return "event is not an object"
    if event.get("type") not in EVENT_TYPES:
        return f"unknown event type {event.get('type')!r}"
    if not isinstance(event.get("ts"), str):
        return "event without ts"
    if event["type"] in OBJECT_EVENTS and not isinstance(event.get("object"), dict):
        return f"{event['type']} event without object"
    if event["type"] == "RESYNC" and event.get("scope") is not None:
        return scope_problem(event["scope"])
    if event["type"] == "OUTCOME":
        return outcome_problem(event.get("outcome"))
    return None


def scope_problem(scope: Any) -> str | None:
    """Why a RESYNC's scope is malformed, or None."""
    if not isinstance(scope, dict):
        return "scope is not an object"
    names = scope.get("schedulerNames")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        return "scope.schedulerNames must be a non-empty list of scheduler names"
    return None


def outcome_problem(outcome: Any) -> str | None:
    """Why an OUTCOME event's outcome is malformed, or None."""
    if not isinstance(outcome, dict):
        return "OUTCOME event without outcome"
    for name in ("decisionId", "preemptorUid", "nomination"):
        if not isinstance(outcome.get(name), str):
            return f"outcome.{name} must be a string"
    victims = outcome.get("victims")
    if not isinstance(victims, dict) or not all(
        isinstance(u, str) and isinstance(r, str) for u, r in victims.items()
    ):
        return "outcome.victims must map victim uids to results"
    return None


def decode(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from exc
