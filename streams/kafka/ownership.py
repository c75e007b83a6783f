"""Which partitions of a topic no member of a consumer group owns, as the broker sees the group.

A worker cannot tell from its own assignment that a partition is orphaned: an
empty assignment is normal beside a second worker. Deleting and re-creating
preemption.cluster-events under a running group left every worker with an empty
assignment, ready, exporting no lag, deciding nothing until restarted by hand
(issue 19). So the worker asks the broker (streams.pipeline.app, every
OWNERSHIP_CHECK_INTERVAL_S): the topic's partitions (DescribeTopics) and the
partitions the group's members hold (DescribeGroups, each member's assignment in
the consumer protocol). A partition that exists and is in no member's
assignment while the group is Stable is unowned. A broker that describes members
without their assignments (the embedded tansu) answers nothing: unknown, never
"unowned" (that took every worker on it for orphaned, and stopped it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

# A group is only settled when Stable: during a rebalance assignments are empty by design.
STABLE = "Stable"
# Kafka's state of a consumer group every member has left (its protocol type kept): nobody owns
# anything. A worker whose consumer lost its membership and never rejoined (logins refused
# after a password rotation) saw "not settled" here and stayed ready, consuming nothing. A
# group never joined is Empty with no protocol type (tansu, before its first member): unknown.
EMPTY = "Empty"


def unowned_of(existing: Iterable[int], groups: Sequence[Any], *, group: str, topic: str) -> set[int] | None:
    """The partitions in `existing` that no member of `group` holds; None while it is not Stable
    (but every one when the consumer group is Empty: all its members left).

    `groups` are DescribeGroups' entries: (error_code, group, state, protocol_type,
    protocol, members, ...), a member being (member_id, client_id, client_host,
    metadata, assignment).
    """
    for entry in groups:
        error_code, name, state, protocol_type, _, members = entry[:6]
        if name != group:
            continue
        if not error_code and state == EMPTY and protocol_type == "consumer" and not members:
            return set(existing)
        if error_code or state != STABLE or protocol_type != "consumer":
            return None
        owned: set[int] = set()
        for member in members:
            raw = member[4]
            if not raw:
                # Kafka encodes every member's assignment, an empty one too (its version and an
                # empty list); no bytes at all is a broker that does not say (the embedded
                # tansu): ownership cannot be told, and must not be taken for "nobody".
                return None
            assignment = ConsumerProtocolMemberAssignment.decode(raw)
            for assigned_topic, partitions in assignment.assignment:
                if assigned_topic == topic:
                    owned.update(partitions)
        return set(existing) - owned
    return None


async def unowned(admin: AIOKafkaAdminClient, *, group: str, topic: str) -> set[int] | None:
    """Partitions of `topic` that exist and no member of `group` owns (None: the group is not settled)."""
    described = await admin.describe_topics([topic])
    existing = {
        p["partition"]
        for t in described
        if t["topic"] == topic and not t["error_code"]  # 3: the topic does not exist (deleted)
        for p in t["partitions"]
    }
    if not existing:
        return set()
    responses = await admin.describe_consumer_groups([group])
    return unowned_of(existing, [g for r in responses for g in r.groups], group=group, topic=topic)
