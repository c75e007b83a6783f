"""`preemptctl worker`: the faust-streaming app around PartitionWorker.

One agent consumes preemption.cluster-events; on partition assignment the
partition's store is opened. Input continues at the store's position + 1
(DESIGN §3): records at or below it are skipped, and if faust's committed offset
is past it (a lost or lagging store) the gap is read from the log first, so
faust's committed offsets are only a lower bound. (Seeking faust's consumer is
not used: its assignment flow moves the consumer to the committed offset after
the hook runs.) Decisions go to preemption.decisions keyed by cluster, rejected
input to preemption.dead-letter. With `--processing-guarantee exactly_once` (real Kafka
only: the embedded broker has no transactions) faust sends decisions and
commits offsets in one transaction.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faust
import orjson

from engine import config as config_mod
from schemas import cloudevent, records
from schemas.records import DecisionRecord
from streams.common import health as health_mod
from streams.common import options
from streams.kafka import deadletter, reading
from streams.kafka import topics as kafka_topics
from streams.pipeline import metrics, transport
from streams.pipeline.fold import tune_gc
from streams.pipeline.worker import PartitionWorker, last_visible_decisions

log = logging.getLogger("preemptctl.worker")

# Group membership: low so a restarted worker rejoins quickly (the embedded
# broker makes joins wait about half the session timeout, DESIGN §11).
SESSION_TIMEOUT_S = 6.0
HEARTBEAT_S = 1.0
# faust commits acknowledged offsets this often; the store is the real resume point.
COMMIT_INTERVAL_S = 1.0


def build_app(
    *,
    bootstrap: str,
    store_dir: Path,
    config: config_mod.Config,
    key: bytes | None,
    guarantee: str,
    app_id: str = "preemptctl-worker",
    health_host: str = health_mod.DEFAULT_HOST,
    health_port: int | None = None,
) -> faust.App:
    transport.register()
    app = faust.App(
        app_id,
        broker=f"{transport.SCHEME}://{bootstrap}",
        store="memory://",
        processing_guarantee=guarantee,
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=HEARTBEAT_S,
        broker_commit_interval=COMMIT_INTERVAL_S,
        consumer_auto_offset_reset="earliest",
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        producer_acks=-1,
    )
    events_topic = app.topic(records.CLUSTER_EVENTS, key_serializer="raw", value_serializer="raw")
    decisions_topic = app.topic(records.DECISIONS, key_serializer="raw", value_serializer="raw")
    dead_topic = app.topic(records.DEAD_LETTER, key_serializer="raw", value_serializer="raw")
    workers: dict[int, PartitionWorker] = {}
    # The agent and the assignment hook may both open a partition first: only one may.
    opening = asyncio.Lock()

    async def emit(decisions: Sequence[DecisionRecord]) -> None:
        futures = [
            await decisions_topic.send(
                key=d["cluster"].encode(),
                value=records.encode(d),
                headers=cloudevent.decision_headers(d),  # CloudEvents binary mode (issue 14)
            )
            for d in decisions
        ]
        for fut in futures:
            await fut  # acknowledged by the broker before the store moves on

    async def dead_letter(k: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        fut = await dead_topic.send(key=k, value=value, headers=deadletter.headers(k, value, headers))
        await fut
        deadletter.sent("worker", headers)  # issue 14: counted once the broker has it
        log.warning(
            "dead-lettered %s: %s",
            dict(headers).get("origin-offset", b"?").decode(),
            dict(headers)["error"].decode(),
        )

    async def open_partition(partition: int) -> PartitionWorker:
        async with opening:
            existing = workers.get(partition)
            if existing is not None:
                return existing
            return await _open(partition)

    async def _open(partition: int) -> PartitionWorker:
        visible = last_visible_decisions(
            [
                orjson.loads(m.value)
                async for m in reading.read_all(
                    bootstrap, records.DECISIONS, read_committed=guarantee == "exactly_once"
                )
            ]
        )
        worker = PartitionWorker.open(
            partition=partition,
            path=store_dir / f"cluster-events-{partition}",
            config=config,
            key=key,
            emit=emit,
            dead_letter=dead_letter,
            visible=visible,
        )
        workers[partition] = worker
        log.info(
            "partition %d: resuming at offset %d (%d clusters restored)",
            partition,
            worker.resume_offset,
            len(worker.controllers),
        )
        return worker

    health = health_mod.Health("worker")

    if health_port is not None:

        async def serve_health() -> None:
            # Ready once the group is joined and the assigned partitions' state is recovered.
            await health_mod.HealthServer(health, host=health_host, port=health_port).start()

        app.task(serve_health)

    @app.agent(events_topic)
    async def fold(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            worker = await open_partition(msg.partition)
            if msg.offset > worker.resume_offset:
                # Input is ahead of the state (the group's committed offset is past the
                # store, e.g. the store was lost): replay the gap from the log first.
                log.warning(
                    "partition %d: input at %d but state ends at %d: replaying the gap from the log",
                    msg.partition,
                    msg.offset,
                    worker.position,
                )
                async for gap in reading.read_range(
                    bootstrap, records.CLUSTER_EVENTS, msg.partition, worker.resume_offset, msg.offset
                ):
                    await worker.process(gap.offset, gap.key, gap.value)
                worker.position = max(worker.position, msg.offset - 1)  # offsets the log no longer has
            await worker.process(msg.offset, msg.key, msg.value)
            # issue 14: the worker's own lag, from the log end its consumer last fetched.
            metrics.positioned(
                msg.partition, functools.partial(app.consumer.highwater, msg.tp), worker.position
            )

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, /, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        assigned: set[Any] = kwargs.get("assigned") or (args[0] if args else set())
        for tp in sorted(assigned):
            if tp.topic != records.CLUSTER_EVENTS:
                continue
            await open_partition(tp.partition)
        health.set_ready()

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, /, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        revoked: set[Any] = kwargs.get("revoked") or (args[0] if args else set())
        for tp in revoked:
            if tp.topic == records.CLUSTER_EVENTS and tp.partition in workers:
                workers.pop(tp.partition).close()

    return app


def cmd(args: argparse.Namespace) -> int:
    bootstrap = kafka_topics.parse_broker_url(args.broker)
    tune_gc()
    config = options.load_config(args.config)
    key = options.load_key(args.hmac_key_file)
    app = build_app(
        bootstrap=bootstrap,
        store_dir=Path(args.store_dir),
        config=config,
        key=key,
        guarantee=args.processing_guarantee,
        app_id=args.group,
        health_host=args.health_host,
        health_port=args.health_port,
    )
    worker = faust.Worker(app, loglevel=args.log_level, quiet=True)
    worker.execute_from_commandline()
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="fold cluster-events and emit decisions (faust app)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  preemptctl worker --broker kafka://127.0.0.1:9092 --store-dir /var/lib/pc",
    )
    p.add_argument("--broker", required=True, help="kafka://host:port")
    p.add_argument(
        "--store-dir", default="./preemptctl-state", help="local rocksdict state (default ./preemptctl-state)"
    )
    p.add_argument("--config", help="engine config YAML (conformance/FORMAT.md config keys)")
    p.add_argument("--hmac-key-file", help="sign decision records with this key")
    p.add_argument(
        "--processing-guarantee", choices=("at_least_once", "exactly_once"), default="at_least_once"
    )
    p.add_argument("--group", default="preemptctl-worker", help="consumer group / faust app id")
    p.add_argument("--log-level", default="warning")
    health_mod.add_arguments(p)
    p.set_defaults(func=cmd)
