"""The Kafka ACLs each component needs, and nothing more.

One table, read three ways: the chart's Strimzi KafkaUser templates grant exactly
these (tests/test_kafka_acls.py renders the chart and compares), the secured-Kafka
tests create exactly these on a real broker with the StandardAuthorizer and run
the pipeline under them (tests/integration/test_secure_kafka.py), and
docs/deploy.md lists them for an operator who grants ACLs by hand.

What each component does with Kafka, and so what it is granted:
- source: writes cluster-events.
- worker: reads cluster-events in its consumer group; reads and writes decisions
  (it reads back what it published after its last commit), snapshots; writes
  dead letters; with exactly_once, owns the transactional ids `<group>-...`.
- actuator: reads decisions in its consumer group; writes and reads back
  evictions; writes dead letters; writes each decision's OUTCOME event into
  cluster-events (what it did, for the worker to fold); measures the worker
  group's lag on cluster-events (Describe on the group).
- auditor (replay, export, audit verify, explain): reads every topic, no group.
A component that creates missing topics (the default; `--no-create-topics` turns
it off) also gets Create on the topic prefix.

Writing decisions is what gets pods deleted: only the worker may (and the HMAC
signature is the second line, docs/topics.md). Writing cluster-events is what
decisions are made of: only the source (objects) and the actuator (outcomes) may.
"""

from __future__ import annotations

import dataclasses

from streams.kafka.topics import DEFAULT_NAMES, Names

TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER = "topic", "group", "transactionalId", "cluster"
LITERAL, PREFIX = "literal", "prefix"
COMPONENTS = ("source", "worker", "actuator", "auditor")

# The consumer groups when nothing else is configured (`--group`, `--group-id`, chart values).
DEFAULT_WORKER_GROUP = "preemptctl-worker"


def default_actuator_group(cluster: str, *, dry_run: bool = False) -> str:
    return f"preemptctl-actuator-{cluster}" + ("-dry-run" if dry_run else "")


@dataclasses.dataclass(frozen=True, order=True)
class Acl:
    """Allow `operations` on one resource (a literal name, or every name with a prefix), from any host."""

    resource: str
    name: str
    pattern: str
    operations: tuple[str, ...]


def _topic(name: str, *operations: str) -> Acl:
    return Acl(TOPIC, name, LITERAL, tuple(sorted(operations)))


def required(
    component: str,
    *,
    names: Names = DEFAULT_NAMES,
    worker_group: str = DEFAULT_WORKER_GROUP,
    actuator_group: str = "",
    create_topics: bool = False,
    exactly_once: bool = True,
    measures_lag: bool = True,
) -> tuple[Acl, ...]:
    """The ACLs `component` needs (COMPONENTS), sorted."""
    acls: list[Acl] = []
    if component == "source":
        acls += [_topic(names.cluster_events, "Describe", "Write")]
    elif component == "worker":
        acls += [
            _topic(names.cluster_events, "Describe", "Read"),
            _topic(names.decisions, "Describe", "Read", "Write"),
            _topic(names.snapshots, "Describe", "Read", "Write"),
            _topic(names.dead_letter, "Describe", "Write"),
            Acl(GROUP, worker_group, LITERAL, ("Read",)),
        ]
        if exactly_once:
            # streams.pipeline.app.transactional_id: `<group>-<cluster-events>-<partition>`.
            acls.append(Acl(TRANSACTIONAL_ID, f"{worker_group}-", PREFIX, ("Describe", "Write")))
    elif component == "actuator":
        if not actuator_group:
            raise ValueError("the actuator's ACLs name its consumer group")
        acls += [
            _topic(names.decisions, "Describe", "Read"),
            _topic(names.evictions, "Describe", "Read", "Write"),
            _topic(names.dead_letter, "Describe", "Write"),
            _topic(names.cluster_events, "Describe", "Write"),  # OUTCOME events
            Acl(GROUP, actuator_group, LITERAL, ("Read",)),
        ]
        if measures_lag:  # streams.kafka.lag: the worker group's committed offsets on cluster-events
            acls.append(Acl(GROUP, worker_group, LITERAL, ("Describe",)))
    elif component == "auditor":
        acls += [Acl(TOPIC, names.prefix, PREFIX, ("Describe", "Read"))]
    else:
        raise ValueError(f"unknown component {component!r} (one of {', '.join(COMPONENTS)})")
    if create_topics and component != "auditor":
        acls.append(Acl(TOPIC, names.prefix, PREFIX, ("Create",)))
    return tuple(sorted(acls))


# ---- the Kafka protocol's codes (CreateAcls), for granting them on a broker ----------------

RESOURCE_CODES = {TOPIC: 2, GROUP: 3, CLUSTER: 4, TRANSACTIONAL_ID: 5}
PATTERN_CODES = {LITERAL: 3, PREFIX: 4}
OPERATION_CODES = {
    "All": 2,
    "Read": 3,
    "Write": 4,
    "Create": 5,
    "Delete": 6,
    "Alter": 7,
    "Describe": 8,
    "ClusterAction": 9,
    "DescribeConfigs": 10,
    "AlterConfigs": 11,
    "IdempotentWrite": 12,
}
ALLOW = 3
