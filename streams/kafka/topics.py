"""The topics and how a broker is named: what every component agrees on about Kafka.

This module owns the topic names and their configs (`TOPICS`, `topic_specs`),
the record size limits every producer and topic share, `ensure_topics`, which
creates the missing topics on any Kafka-protocol broker, `check_partitions`,
and `parse_broker_url`, the one reading of `--broker kafka://host:port`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from streams.common.errors import BadBrokerUrl

CLUSTER_EVENTS = "preemption.cluster-events"
DECISIONS = "preemption.decisions"
EVICTIONS = "preemption.evictions"
DEAD_LETTER = "preemption.dead-letter"
# The worker's snapshots and decision heads (streams.pipeline.snapshot): compacted,
# partition p holds what the worker of cluster-events partition p needs to open it.
SNAPSHOTS = "preemption.snapshots"

# One partition keeps each cluster's events in one total order, which is what makes
# decisions a pure function of the log; more partitions only help many clusters.
DEFAULT_PARTITIONS = 1
# Right for the embedded broker and single-node test Kafka; production passes 3.
DEFAULT_REPLICATION_FACTOR = 1

_DAY_MS = 24 * 60 * 60 * 1000
# The audit horizon: how far back `preemptctl replay` and `audit verify` can reach.
# Records older than this are deleted (never compacted: compaction would keep only
# the last record per cluster key and destroy the log the decisions derive from).
AUDIT_RETENTION_MS = 90 * _DAY_MS
# Long enough to triage a poison record after a long weekend; the dead-letter copy
# holds the raw bytes, so it does not depend on the origin topic's retention.
DEAD_LETTER_RETENTION_MS = 30 * _DAY_MS
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
# Snapshot topic segments roll this often so the log cleaner can drop superseded
# heads and tombstoned chunks (it never cleans the active segment).
SNAPSHOTS_SEGMENT_MS = 6 * 60 * 60 * 1000

# How long one admin request (list or create topics) may take before ensure_topics
# gives up: covers a KRaft controller still electing itself right after start.
ADMIN_REQUEST_TIMEOUT_MS = 30_000

# Kafka error code for "topic already exists": another process won the race
# between our list and our create, which is success for an idempotent ensure.
_TOPIC_ALREADY_EXISTS = 36


class BrokerUnavailable(RuntimeError):
    """A broker could not be found, started, or reached; the message is one line."""


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    """A topic as ensure_topics creates it."""

    name: str
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = DEFAULT_REPLICATION_FACTOR
    configs: tuple[tuple[str, str], ...] = ()


def topic_specs(
    *, partitions: int = DEFAULT_PARTITIONS, replication_factor: int = DEFAULT_REPLICATION_FACTOR
) -> tuple[TopicSpec, ...]:
    """The preemptctl topics (DESIGN.md §5, and the worker's snapshots) with the given partition count.

    Every topic has the same partition count: the worker writes the decisions, dead
    letters and snapshots of cluster-events partition p to partition p.
    """
    audit = (("cleanup.policy", "delete"), ("retention.ms", str(AUDIT_RETENTION_MS)))
    size = ("max.message.bytes", str(RECORD_MAX_BYTES))

    def spec(name: str, *configs: tuple[str, str]) -> TopicSpec:
        return TopicSpec(name, partitions, replication_factor, configs)

    return (
        spec(CLUSTER_EVENTS, *audit, size),
        spec(DECISIONS, *audit, size),
        spec(EVICTIONS, *audit),
        spec(
            DEAD_LETTER, ("cleanup.policy", "delete"), ("retention.ms", str(DEAD_LETTER_RETENTION_MS)), size
        ),
        spec(SNAPSHOTS, ("cleanup.policy", "compact"), ("segment.ms", str(SNAPSHOTS_SEGMENT_MS)), size),
    )


TOPICS = topic_specs()


def parse_broker_url(url: str) -> str:
    """`kafka://host:port[,host:port...]` -> the bootstrap string aiokafka takes.

    Raises BadBrokerUrl (a ValueError) naming the url and the expected shape otherwise.
    """
    scheme, sep, rest = url.partition("://")
    rest = rest.removesuffix("/")
    if scheme != "kafka" or not sep or not rest or any(c in rest for c in "/?#@"):
        raise BadBrokerUrl(f"bad broker url {url!r}: expected kafka://host:port")
    for address in rest.split(","):
        host, colon, port = address.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BadBrokerUrl(f"bad broker url {url!r}: expected kafka://host:port, got {address!r}")
    return rest


async def ensure_topics(bootstrap: str, topics: Iterable[TopicSpec] = TOPICS) -> list[str]:
    """Create the topics that do not exist yet; return the names created.

    Idempotent: existing topics are left as they are (their partitions and configs
    are not changed), and a concurrent creator winning the race counts as success.
    """
    wanted = list(topics)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ADMIN_REQUEST_TIMEOUT_MS)
    try:
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            missing = [t for t in wanted if t.name not in existing]
            if not missing:
                return []
            response = await admin.create_topics(
                [
                    NewTopic(t.name, t.partitions, t.replication_factor, topic_configs=dict(t.configs))
                    for t in missing
                ]
            )
        finally:
            await admin.close()
    except KafkaError as e:
        raise BrokerUnavailable(f"cannot create topics on {bootstrap}: {e}") from e
    created = []
    # aiokafka returns per-topic errors in the response instead of raising them.
    for topic, code, *message in response.topic_errors:
        if code == 0:
            created.append(topic)
        elif code != _TOPIC_ALREADY_EXISTS:
            detail = message[0] if message and message[0] else f"error code {code}"
            raise BrokerUnavailable(f"cannot create topic {topic} on {bootstrap}: {detail}")
    return created


async def ensure_worker_topics(bootstrap: str) -> int:
    """Make sure the worker can run: the topics exist, each with at least cluster-events' partitions.

    The worker writes the output of cluster-events partition p to partition p of
    the decisions, dead-letter and snapshots topics, so those need as many
    partitions. Missing topics are created with cluster-events' count (a new
    snapshots topic included). Returns that count; BrokerUnavailable (one line)
    naming a topic with too few partitions.
    """
    counts = await partition_counts(bootstrap)
    partitions = counts.get(CLUSTER_EVENTS) or DEFAULT_PARTITIONS
    await ensure_topics(bootstrap, topic_specs(partitions=partitions))
    counts = await partition_counts(bootstrap)
    for name in (DECISIONS, DEAD_LETTER, SNAPSHOTS):
        if counts.get(name, 0) < partitions:
            raise BrokerUnavailable(
                f"topic {name} has {counts.get(name, 0)} partition(s), fewer than {CLUSTER_EVENTS}'s "
                f"{partitions}: the worker writes partition p's output to partition p"
            )
    return partitions


async def partition_counts(bootstrap: str) -> dict[str, int]:
    """Partitions per existing topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ADMIN_REQUEST_TIMEOUT_MS)
    try:
        await admin.start()
        try:
            names = [t for t in await admin.list_topics() if not t.startswith("__")]
            described = await admin.describe_topics(names) if names else []
        finally:
            await admin.close()
    except KafkaError as e:
        raise BrokerUnavailable(f"cannot reach {bootstrap}: {e}") from e
    counts = {}
    for topic in described:
        name, parts = topic.get("topic"), topic.get("partitions")
        if isinstance(name, str) and isinstance(parts, list) and not topic.get("error_code"):
            counts[name] = len(parts)
    return counts
