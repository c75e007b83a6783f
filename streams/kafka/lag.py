"""A consumer group's lag measured from outside it: log end offsets minus the group's committed offsets.

A worker that is hung, paused or gone cannot report its own lag: its scrape
fails and its series go stale exactly when the lag matters. So another process
(the actuator, `--lag-group-id`) asks the broker every `--lag-interval-seconds`
for the topic's end offsets and the group's committed offsets, and exports

    preemptctl_consumer_group_lag_records{group, topic, partition}

The worker commits what it has folded every second (streams.pipeline.app), so
this trails the worker's own `preemptctl_worker_lag_records` by about that.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from prometheus_client import Gauge

from schemas import records
from streams.kafka import connection

log = logging.getLogger(__name__)

LAG = Gauge(
    "preemptctl_consumer_group_lag_records",
    "Records between a consumer group's committed offset and the log end, per partition, "
    "measured from the broker (not by the consumer).",
    ["group", "topic", "partition"],
)
# The worker's group (its faust app id, `preemptctl worker --group-id`).
DEFAULT_GROUP = "preemptctl-worker"
# Two small requests per check (ListOffsets, OffsetFetch); Prometheus scrapes every
# 15-30 s, so checking more often would only show the same number twice.
DEFAULT_INTERVAL_S = 10.0
# A broker that accepts the connection but never answers holds one check at most this
# long; then the next check starts, instead of the gauge silently freezing.
CHECK_TIMEOUT_S = 30.0


async def measure(
    admin: AIOKafkaAdminClient, consumer: AIOKafkaConsumer, *, group: str, topic: str
) -> dict[int, int]:
    """Partition -> records the group has not committed yet (0 when caught up)."""
    described = await admin.describe_topics([topic])
    partitions = [
        TopicPartition(topic, p["partition"])
        for t in described
        if t["topic"] == topic and not t["error_code"]
        for p in t["partitions"]
    ]
    if not partitions:
        return {}
    ends = await consumer.end_offsets(partitions)
    starts = await consumer.beginning_offsets(partitions)
    committed = await admin.list_consumer_group_offsets(group, partitions=partitions)
    lag = {}
    for tp in partitions:
        done = committed[tp].offset if tp in committed else -1
        if done > ends[tp]:
            # Committed past the end: on an earlier incarnation of the topic (deleted and
            # re-created). The group resumes at the start of this one: all of it is to do.
            done = -1
        # Never committed (-1), or committed before what retention has since deleted: the
        # group resumes at the log start, so everything from there on is still to do.
        done = max(done, starts[tp])
        lag[tp.partition] = max(0, ends[tp] - done)
    return lag


async def watch(
    kafka: connection.Connect,
    *,
    group: str,
    topic: str = records.CLUSTER_EVENTS,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> None:
    """Export `group`'s lag on `topic` every `interval_s` until cancelled.

    Broker errors are logged and the check retried: the lag must never take its host component down.
    """
    config = connection.of(kafka)
    admin = config.admin()
    consumer = config.consumer(enable_auto_commit=False)
    started: list[AIOKafkaAdminClient | AIOKafkaConsumer] = []
    try:
        while True:
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_S):
                    for each in (admin, consumer):
                        if each not in started:
                            await connection.start(config, each)
                            started.append(each)
                    lag = await measure(admin, consumer, group=group, topic=topic)
                for partition, behind in lag.items():
                    LAG.labels(group, topic, str(partition)).set(behind)
            except (KafkaError, OSError, TimeoutError, connection.BrokerUnavailable) as exc:
                log.warning("measuring the lag of %s on %s failed (%s); retrying", group, topic, exc)
            await asyncio.sleep(interval_s)
    finally:
        for each in started:
            await (each.close() if isinstance(each, AIOKafkaAdminClient) else each.stop())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lag-group-id",
        "--lag-group",  # the spelling before 0.2.0, kept so deployments that pass it go on working
        dest="lag_group",
        default=DEFAULT_GROUP,
        metavar="GROUP",
        help="export this consumer group's lag on preemption.cluster-events, measured from the broker "
        f"(default {DEFAULT_GROUP}: the worker's --group-id; '' turns it off)",
    )
    parser.add_argument(
        "--lag-interval-seconds",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="S",
        help=f"how often to measure it (default {DEFAULT_INTERVAL_S:g})",
    )


def start(
    kafka: connection.Connect, args: argparse.Namespace, *, topic: str = records.CLUSTER_EVENTS
) -> asyncio.Task[None] | None:
    """The lag watch `add_arguments`' flags ask for, as a task (None when turned off)."""
    if not args.lag_group:
        return None
    return asyncio.create_task(
        watch(kafka, group=args.lag_group, topic=topic, interval_s=args.lag_interval_seconds)
    )
