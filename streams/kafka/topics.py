"""The four topics and how a broker is named: what every component agrees on about Kafka.

This module owns the topic names and their configs (`TOPICS`, `topic_specs`),
`ensure_topics`, which creates the missing ones on any Kafka-protocol broker, and
`parse_broker_url`, the one reading of `--broker kafka://host:port`.
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
# The source batches events into records of at most ~1 MiB (DESIGN.md §5); Kafka's
# default limit (1 MiB + 12 bytes) would reject a full batch once headers and the
# record-batch overhead are added, so the cluster-events topic accepts twice that.
CLUSTER_EVENTS_MAX_MESSAGE_BYTES = 2 * 1024 * 1024

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
    """The four preemptctl topics (DESIGN.md §5) with the given partition count."""
    audit = (("cleanup.policy", "delete"), ("retention.ms", str(AUDIT_RETENTION_MS)))

    def spec(name: str, *configs: tuple[str, str]) -> TopicSpec:
        return TopicSpec(name, partitions, replication_factor, configs)

    return (
        spec(CLUSTER_EVENTS, *audit, ("max.message.bytes", str(CLUSTER_EVENTS_MAX_MESSAGE_BYTES))),
        spec(DECISIONS, *audit),
        spec(EVICTIONS, *audit),
        spec(DEAD_LETTER, ("cleanup.policy", "delete"), ("retention.ms", str(DEAD_LETTER_RETENTION_MS))),
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
