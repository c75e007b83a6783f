"""Typed shapes of every topic's values (docs/topics.md) and their orjson encode/decode.

Each value carries `v`, the envelope version. Compatibility policy: within a
version, fields are only ever added (consumers must ignore unknown fields);
a change that removes or retypes a field bumps `v`, and consumers reject
versions they do not know.
"""

from typing import Any, Literal, NotRequired, TypedDict

import orjson

from schemas import VERSION, names

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


def batch(cluster: str, events: list[Any]) -> ClusterEventBatch:
    """A cluster-events record's value: `events`, in order, in the envelope naming their cluster.

    The one place the envelope is built: every writer (the source, the actuator's OUTCOME,
    `preemptctl run`, the benchmarks) writes the same bytes for the same events, its members
    in this order (records are orjson-encoded as built, and hashed in places).
    """
    return {"v": VERSION, "cluster": cluster, "events": events}


def encode_batch(cluster: str, events: list[Any]) -> bytes:
    """`batch(cluster, events)`, encoded."""
    return orjson.dumps(batch(cluster, events))


def batch_frame(cluster: str) -> tuple[bytes, bytes]:
    """The bytes of `encode_batch(cluster, events)` before and after its events, which are joined
    by `,` in between: for a writer that encodes each event once and batches the bytes later."""
    empty = encode_batch(cluster, [])  # ...,"events":[]}
    return empty[:-2], empty[-2:]


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
    memberUids: NotRequired[dict[str, str]]  # a gang's members by namespace/name: the actuator checks each
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

# ---- bounds on input (docs/topics.md, "Bounds on input") -------------------------------------
# Every stage that reads cluster events (the worker, `replay`, the simulator) checks these
# here, in time bounded by the record's size, and rejects what is beyond them with the reason:
# a record (DecodeError) or one event (BadEvent, fold.controller).

# The cluster a record names when it names none (a single-cluster install).
DEFAULT_CLUSTER = "default"

# Record sizes, end to end. The source batches events into records of at most
# ~1 MiB, but one Kubernetes object may be up to etcd's 1.5 MiB, so a record may
# be ~1.5 MiB; Kafka's default limit (1 MiB + 12 bytes) would refuse it. Every
# preemptctl topic therefore accepts RECORD_MAX_BYTES (max.message.bytes, which
# bounds a whole record batch), every producer may send requests that large, and
# what a producer puts in one record value is held to VALUE_MAX_BYTES, leaving
# room for the key, headers and the batch framing. What does not fit: a decision
# loses its explanation (a marker says so), a dead letter carries a reference to
# its origin instead of the bytes (streams.pipeline.outbox).
RECORD_MAX_BYTES = 2 * 1024 * 1024
RECORD_OVERHEAD_BYTES = 64 * 1024
VALUE_MAX_BYTES = RECORD_MAX_BYTES - RECORD_OVERHEAD_BYTES

# Events in one cluster-events record. The source never writes more (its queue holds
# QUEUE_MAX_EVENTS = this many); a record of 100,000 tiny bad events held its partition for
# ~10 s and wrote 100,000 dead letters: such a record is dead-lettered whole instead.
MAX_EVENTS_PER_RECORD = 10_000
# A cluster name, in UTF-8 bytes: a Kubernetes DNS subdomain's length. It is the record key,
# the decision ids' first segment and a store key segment.
MAX_CLUSTER_NAME_BYTES = 253
# An object's identity strings (metadata name, namespace, uid): Kubernetes' longest name (a DNS
# subdomain, 253). They go into store keys, decision ids and every log line about the object.
MAX_NAME_BYTES = 253
# An object's `kind` (a CamelCase Go type name: Kubernetes' longest is well under this).
MAX_KIND_CHARS = 63
# An event's `ts` (RFC 3339 with nanoseconds and an offset is 35 characters).
MAX_TS_CHARS = 64
# Nesting of an event's object, in levels: the most orjson encodes (it refuses deeper values),
# so an object the controller takes can always be written to the store and to a snapshot.
# A deeper object was folded once and then failed every store write (issue 19). Parsing
# itself stops at 1024 levels (a record nested deeper does not decode).
MAX_OBJECT_DEPTH = 254


class DecodeError(ValueError):
    """Bytes that are not a valid record of the expected shape."""


class ObjectTooDeep(ValueError):
    """An object nested deeper than MAX_OBJECT_DEPTH levels: no store could write it."""


def cluster_problem(name: object) -> str | None:
    """Why `name` cannot be a cluster name, or None: one rule for every stage (docs/topics.md).

    Non-empty (an empty key gave different decision ids in the worker and `replay`), at most
    MAX_CLUSTER_NAME_BYTES of UTF-8, no control characters (it is a log, header and key
    segment). Any other character is allowed: store keys escape `/` and `%` (store.py).
    """
    if not isinstance(name, str):
        return f"cluster name must be a string, got {type(name).__name__}"
    if not name:
        return "empty cluster name"
    if len(name) > MAX_CLUSTER_NAME_BYTES:
        return f"cluster name longer than {MAX_CLUSTER_NAME_BYTES} bytes"
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return "cluster name is not valid UTF-8"
    if size > MAX_CLUSTER_NAME_BYTES:
        return f"cluster name longer than {MAX_CLUSTER_NAME_BYTES} bytes"
    if not name.isprintable():
        return f"cluster name {name[:40]!r} has control characters"
    return None


def encode_object(obj: Any) -> bytes:
    """An object's stored bytes; ObjectTooDeep when it cannot be encoded (nested too deep)."""
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError as exc:
        raise ObjectTooDeep(f"object nested deeper than {MAX_OBJECT_DEPTH} levels ({exc})") from exc


def encode(value: Any) -> bytes:
    return orjson.dumps(value)


def decode_envelope(data: bytes) -> ClusterEventBatch:
    """Parse a cluster-events record and check its envelope (v, cluster, events); DecodeError otherwise.

    The events themselves are not checked: a consumer that folds events one by one
    rejects each bad one on its own (`event_problem`), not the whole record.
    """
    if not data:
        raise DecodeError("the record has no value (a tombstone)")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DecodeError("record is not a JSON object")
    if value.get("v") != VERSION:
        raise DecodeError(f"unsupported envelope version {_short(value.get('v'))}")
    if not isinstance(value.get("cluster"), str) or not isinstance(value.get("events"), list):
        raise DecodeError("record needs cluster (string) and events (list)")
    problem = cluster_problem(value["cluster"])
    if problem:
        raise DecodeError(problem)
    if len(value["events"]) > MAX_EVENTS_PER_RECORD:
        raise DecodeError(f"{len(value['events'])} events, more than {MAX_EVENTS_PER_RECORD} in one record")
    return value  # type: ignore[return-value]


def _short(value: Any, chars: int = 80) -> str:
    """repr(value) cut to `chars`: an error names the value without copying a huge one."""
    if isinstance(value, (dict, list)):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= chars else text[:chars] + "..."


def key_problem(key: bytes | None, batch: ClusterEventBatch) -> str | None:
    """Why a record's key does not fit its envelope, or None.

    The key decides the partition, and one partition holds a cluster's whole log
    in order; a record keyed by another cluster could be folded out of order.
    """
    if key != batch["cluster"].encode():
        shown = key.decode(errors="replace") if key is not None else None
        return f"record key {_short(shown)} is not the envelope's cluster {batch['cluster']!r}"
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
    """Why one event is malformed or beyond the bounds above, or None. O(1): no walk of the object."""
    if not isinstance(event, dict):
        return "event is not an object"
    kind = event.get("type")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        return f"unknown event type {_short(kind)}"
    ts = event.get("ts")
    if not isinstance(ts, str):
        return "event without ts"
    if len(ts) > MAX_TS_CHARS:
        return f"ts longer than {MAX_TS_CHARS} characters"
    if kind in OBJECT_EVENTS:
        obj = event.get("object")
        if not isinstance(obj, dict):
            return f"{kind} event without object"
        return object_problem(obj)
    if kind == "RESYNC" and event.get("scope") is not None:
        return scope_problem(event["scope"])
    if kind == "OUTCOME":
        return outcome_problem(event.get("outcome"))
    return None


def object_problem(obj: dict[str, Any]) -> str | None:
    """Why an object's identity strings are beyond the bounds, or None (their shape is the engine's)."""
    kind = obj.get("kind")
    if isinstance(kind, str) and len(kind) > MAX_KIND_CHARS:
        return f"kind longer than {MAX_KIND_CHARS} characters"
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for name in ("name", "namespace", "uid"):
            value = meta.get(name)
            # Characters first: a str holds at most 4 bytes per character, so a short one is
            # within the bound without encoding it.
            if (
                isinstance(value, str)
                and len(value) * 4 > MAX_NAME_BYTES
                and (len(value) > MAX_NAME_BYTES or len(value.encode(errors="replace")) > MAX_NAME_BYTES)
            ):
                return f"metadata.{name} longer than {MAX_NAME_BYTES} bytes"
        # The API server stores no other names (schemas/names.py); an empty or missing one is
        # the engine's to refuse, with the object's own reason.
        namespace = meta.get("namespace")
        if isinstance(namespace, str) and namespace and not names.dns_label(namespace):
            return f"metadata.namespace {_short(namespace)} is not a DNS-1123 label"
        own = meta.get("name")
        if kind == "Namespace" and isinstance(own, str) and own and not names.dns_label(own):
            return f"metadata.name {_short(own)} is not a DNS-1123 label"  # a namespace's name
        if isinstance(own, str) and own and not names.dns_subdomain(own):
            return f"metadata.name {_short(own)} is not a DNS-1123 subdomain"
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
