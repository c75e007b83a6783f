"""The topics and how a broker is named: what every component agrees on about Kafka.

This module owns the topic names (`Names`: the five topics under one
`--topic-prefix`) and their configs (`topic_specs`, `Layout`: names plus the
replication factor and min.insync.replicas of the topics a component creates,
with their flags), the record size limits every producer and topic share, and
`ensure_topics`, which creates the missing topics on any Kafka-protocol broker.
How a broker is reached (addresses, TLS, SASL) is streams.kafka.connection's.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Iterable

from aiokafka.admin import NewTopic
from aiokafka.errors import KafkaError

from schemas import records
from streams.common.errors import UsageError
from streams.kafka import connection
from streams.kafka.connection import BrokerUnavailable

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
# Right for the embedded broker and single-node test Kafka; production passes 3 (the chart does).
DEFAULT_REPLICATION_FACTOR = 1
# The names of every topic begin with this (`--topic-prefix`); two installs on one Kafka
# use two prefixes, and their consumer groups differ too (`--group`, `--group-id`).
DEFAULT_PREFIX = "preemption."
# Kafka's own limit on a topic name, and the characters it allows.
TOPIC_NAME_MAX = 249
_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")

_DAY_MS = 24 * 60 * 60 * 1000
# The audit horizon: how far back `preemptctl replay` and `audit verify` can reach.
# Records older than this are deleted (never compacted: compaction would keep only
# the last record per cluster key and destroy the log the decisions derive from).
AUDIT_RETENTION_MS = 90 * _DAY_MS
# Long enough to triage a poison record after a long weekend; the dead-letter copy
# holds the raw bytes, so it does not depend on the origin topic's retention.
DEAD_LETTER_RETENTION_MS = 30 * _DAY_MS
# Snapshot topic segments roll this often so the log cleaner can drop superseded
# heads and tombstoned chunks (it never cleans the active segment).
SNAPSHOTS_SEGMENT_MS = 6 * 60 * 60 * 1000

# How long one admin request (list or create topics) may take before ensure_topics
# gives up: covers a KRaft controller still electing itself right after start.
ADMIN_REQUEST_TIMEOUT_MS = 30_000

# Kafka error code for "topic already exists": another process won the race
# between our list and our create, which is success for an idempotent ensure.
_TOPIC_ALREADY_EXISTS = 36


class TopicsMissing(BrokerUnavailable):
    """Topics the component does not create (--no-create-topics) are not there (yet)."""


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    """A topic as ensure_topics creates it."""

    name: str
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = DEFAULT_REPLICATION_FACTOR
    configs: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Names:
    """The five topic names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        longest = self.prefix + "cluster-events"
        if not _TOPIC_CHARS.match(self.prefix) or len(longest) > TOPIC_NAME_MAX:
            raise UsageError(
                f"--topic-prefix {self.prefix!r}: Kafka topic names take letters, digits, '.', '_' "
                f"and '-', at most {TOPIC_NAME_MAX} in all"
            )

    @property
    def cluster_events(self) -> str:
        return self.prefix + "cluster-events"

    @property
    def decisions(self) -> str:
        return self.prefix + "decisions"

    @property
    def evictions(self) -> str:
        return self.prefix + "evictions"

    @property
    def dead_letter(self) -> str:
        return self.prefix + "dead-letter"

    @property
    def snapshots(self) -> str:
        return self.prefix + "snapshots"

    def all(self) -> tuple[str, ...]:
        return (self.cluster_events, self.decisions, self.evictions, self.dead_letter, self.snapshots)


DEFAULT_NAMES = Names()


def topic_specs(
    *,
    partitions: int = DEFAULT_PARTITIONS,
    replication_factor: int = DEFAULT_REPLICATION_FACTOR,
    min_insync_replicas: int | None = None,
    names: Names = DEFAULT_NAMES,
) -> tuple[TopicSpec, ...]:
    """The preemptctl topics (docs/topics.md, and the worker's snapshots) as they are created.

    Every topic has the same partition count: the worker writes the decisions, dead
    letters and snapshots of cluster-events partition p to partition p. docs/deploy.md's
    topic table states these (tests/test_topics.py keeps it equal).
    """
    audit = (("cleanup.policy", "delete"), ("retention.ms", str(AUDIT_RETENTION_MS)))
    size = ("max.message.bytes", str(records.RECORD_MAX_BYTES))
    # With acks=all, a write succeeds only while this many replicas have it: with 3 replicas
    # and 2, one broker may be down and no acknowledged record is on a single disk.
    isr = (("min.insync.replicas", str(min_insync_replicas)),) if min_insync_replicas else ()

    def spec(name: str, *configs: tuple[str, str]) -> TopicSpec:
        return TopicSpec(name, partitions, replication_factor, (*configs, *isr))

    return (
        spec(names.cluster_events, *audit, size),
        spec(names.decisions, *audit, size),
        spec(names.evictions, *audit),
        spec(
            names.dead_letter,
            ("cleanup.policy", "delete"),
            ("retention.ms", str(DEAD_LETTER_RETENTION_MS)),
            size,
        ),
        spec(names.snapshots, ("cleanup.policy", "compact"), ("segment.ms", str(SNAPSHOTS_SEGMENT_MS)), size),
    )


@dataclasses.dataclass(frozen=True)
class Layout:
    """The topics a component uses and how it creates those missing: `add_arguments`' flags."""

    names: Names = DEFAULT_NAMES
    replication_factor: int = DEFAULT_REPLICATION_FACTOR
    min_insync_replicas: int | None = None

    def __post_init__(self) -> None:
        if self.replication_factor < 1:
            raise UsageError(f"--replication-factor must be at least 1, got {self.replication_factor}")
        if (
            self.min_insync_replicas is not None
            and not 1 <= self.min_insync_replicas <= self.replication_factor
        ):
            raise UsageError(
                f"--min-insync-replicas must be between 1 and --replication-factor "
                f"({self.replication_factor}), got {self.min_insync_replicas}"
            )

    def specs(self, *, partitions: int = DEFAULT_PARTITIONS) -> tuple[TopicSpec, ...]:
        return topic_specs(
            partitions=partitions,
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
            names=self.names,
        )


DEFAULT_LAYOUT = Layout()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--topic-prefix, --replication-factor, --min-insync-replicas (`from_args` reads them)."""
    group = parser.add_argument_group("topics")
    group.add_argument(
        "--topic-prefix",
        default=DEFAULT_PREFIX,
        metavar="PREFIX",
        help=f"every topic's name begins with this (default {DEFAULT_PREFIX}; e.g. team-a.preemption.)",
    )
    group.add_argument(
        "--replication-factor",
        type=int,
        default=DEFAULT_REPLICATION_FACTOR,
        metavar="N",
        help=f"replicas of each topic this process creates (default {DEFAULT_REPLICATION_FACTOR}; "
        "production: 3)",
    )
    group.add_argument(
        "--min-insync-replicas",
        type=int,
        metavar="N",
        help="min.insync.replicas of each topic this process creates (default: the broker's; production: 2)",
    )


def from_args(args: argparse.Namespace) -> Layout:
    return Layout(
        names=Names(args.topic_prefix),
        replication_factor=args.replication_factor,
        min_insync_replicas=args.min_insync_replicas,
    )


TOPICS = topic_specs()


async def ensure_topics(kafka: connection.Connect, topics: Iterable[TopicSpec] = TOPICS) -> list[str]:
    """Create the topics that do not exist yet; return the names created.

    Idempotent: existing topics are left as they are (their partitions and configs
    are not changed), and a concurrent creator winning the race counts as success.
    """
    wanted = list(topics)
    config = connection.of(kafka)
    admin = config.admin(request_timeout_ms=ADMIN_REQUEST_TIMEOUT_MS)
    try:
        await connection.start(config, admin)
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
        raise BrokerUnavailable(f"cannot create topics on {config.describe()}: {e}") from e
    created = []
    # aiokafka returns per-topic errors in the response instead of raising them.
    for topic, code, *message in response.topic_errors:
        if code == 0:
            created.append(topic)
        elif code != _TOPIC_ALREADY_EXISTS:
            detail = message[0] if message and message[0] else f"error code {code}"
            raise BrokerUnavailable(f"cannot create topic {topic} on {config.describe()}: {detail}")
    return created


async def ensure_worker_topics(
    kafka: connection.Connect, layout: Layout = DEFAULT_LAYOUT, *, create: bool = True
) -> int:
    """Make sure the worker can run: the topics exist, each with at least cluster-events' partitions.

    The worker writes the output of cluster-events partition p to partition p of
    the decisions, dead-letter and snapshots topics, so those need as many
    partitions. Missing topics are created with cluster-events' count (a new
    snapshots topic included) unless `create` is off (the operator creates them).
    Returns that count; BrokerUnavailable (one line) naming a topic missing or
    with too few partitions.
    """
    names = layout.names
    counts = await partition_counts(kafka)
    partitions = counts.get(names.cluster_events) or DEFAULT_PARTITIONS
    if create:
        await ensure_topics(kafka, layout.specs(partitions=partitions))
        counts = await partition_counts(kafka)
    for name in (names.cluster_events, names.decisions, names.dead_letter, names.snapshots):
        if name not in counts:
            raise TopicsMissing(
                f"topic {name} does not exist (or this principal may not Describe it) on "
                f"{connection.of(kafka).describe()}: create it, or run the worker without --no-create-topics"
            )
        if counts[name] < partitions:
            raise BrokerUnavailable(
                f"topic {name} has {counts[name]} partition(s), fewer than {names.cluster_events}'s "
                f"{partitions}: the worker writes partition p's output to partition p"
            )
    return partitions


async def partition_counts(kafka: connection.Connect) -> dict[str, int]:
    """Partitions per existing topic."""
    config = connection.of(kafka)
    admin = config.admin(request_timeout_ms=ADMIN_REQUEST_TIMEOUT_MS)
    try:
        await connection.start(config, admin)
        try:
            names = [t for t in await admin.list_topics() if not t.startswith("__")]
            described = await admin.describe_topics(names) if names else []
        finally:
            await admin.close()
    except KafkaError as e:
        raise BrokerUnavailable(f"cannot reach {config.describe()}: {e}") from e
    counts = {}
    for topic in described:
        name, parts = topic.get("topic"), topic.get("partitions")
        if isinstance(name, str) and isinstance(parts, list) and not topic.get("error_code"):
            counts[name] = len(parts)
    return counts
