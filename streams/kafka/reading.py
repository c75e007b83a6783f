"""Reading topics with a plain aiokafka consumer: whole topics (replay, export, audit) and
bounded windows of one partition (`PartitionReader`, what the worker reads to open a partition).

The embedded broker reports a partition's end short by the last record batch
(docs/architecture.md §6), so "read to the end" never trusts end offsets alone: it keeps
polling until the end offsets are reached *and* a poll comes back empty.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from aiokafka import TopicPartition

from schemas import records
from streams.common.errors import UsageError
from streams.kafka import connection

# An empty poll this long after reaching the reported end means the topic is read.
IDLE_POLL_MS = 300
# The embedded broker holds every fetch for the full wait (no early answer on data).
FETCH_MAX_WAIT_MS = 50
# How long to wait for a topic's metadata before calling it missing.
METADATA_TIMEOUT_S = 10.0
# One fetch may return a whole record of the largest size any topic accepts.
MAX_PARTITION_FETCH_BYTES = 2 * records.RECORD_MAX_BYTES
# A backward search reads windows of this many offsets, growing 4x each time.
BACKWARD_WINDOW = 64


@dataclass(frozen=True, slots=True)
class Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def parse_topic_url(url: str) -> tuple[str, str]:
    """kafka://host:port[,host:port]/topic -> (bootstrap, topic).

    `kafka:///topic` (no host) leaves the brokers to --bootstrap-server or the
    --kafka-config file (`topic_config`): the bootstrap returned is then "".
    """
    if not url.startswith("kafka://"):
        raise UsageError(f"not a kafka:// URL: {url}")
    rest = url[len("kafka://") :]
    bootstrap, _, topic = rest.partition("/")
    if not topic or (bootstrap and ":" not in bootstrap):
        raise UsageError(f"expected kafka://host:port/topic, got {url}")
    if bootstrap:
        bootstrap = connection.parse_bootstrap(bootstrap, what="kafka:// URL")
    return bootstrap, topic


def topic_config(url: str, kafka: connection.KafkaConfig | None) -> tuple[connection.KafkaConfig, str]:
    """The Kafka and the topic of a kafka:// location: the URL's brokers with the connection
    flags' security settings (`kafka`), or the flags' brokers when the URL names none."""
    bootstrap, topic = parse_topic_url(url)
    if kafka is None:
        kafka = connection.KafkaConfig(bootstrap="")
    if bootstrap:
        kafka = dataclasses.replace(kafka, bootstrap=bootstrap)
    if not kafka.bootstrap:
        raise UsageError(f"{url} names no broker: give kafka://host:port/topic or --bootstrap-server")
    return kafka, topic


async def read_all(
    kafka: connection.Connect,
    topic: str,
    *,
    read_committed: bool = False,
    partitions: list[int] | None = None,
    since_ms: int | None = None,
) -> AsyncIterator[Message]:
    """Every record of the topic (of `partitions`), or those from the first one at or after the
    broker timestamp `since_ms` (epoch milliseconds), until the end offsets taken at start."""
    config = connection.of(kafka)
    consumer = config.consumer(
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
    )
    try:
        # Inside the try: a broker that cannot be reached still gets the consumer stopped.
        await connection.start(config, consumer)
        deadline = asyncio.get_running_loop().time() + METADATA_TIMEOUT_S
        parts = consumer.partitions_for_topic(topic)
        while not parts:
            if asyncio.get_running_loop().time() > deadline:
                raise UsageError(f"topic {topic} not found on {config.describe()}")
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts) if partitions is None or p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        if since_ms is not None:
            # The broker's time index: no record before `since_ms` is fetched at all.
            starts = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            for tp in tps:
                found = starts.get(tp)
                consumer.seek(tp, found.offset if found is not None else ends[tp])
        while True:
            batch = await consumer.getmany(timeout_ms=IDLE_POLL_MS)
            if not batch:
                positions = {tp: await consumer.position(tp) for tp in tps}
                if all(positions[tp] >= ends[tp] for tp in tps):
                    return
                continue
            for _tp, msgs in sorted(batch.items(), key=lambda kv: kv[0].partition):
                for m in msgs:
                    yield Message(m.partition, m.offset, m.key, m.value or b"", tuple(m.headers or ()))
    finally:
        await consumer.stop()


class PartitionReader:
    """Bounded reads of single partitions with one consumer: no read starts at a log's beginning
    unless asked to. Use as an async context manager.
    """

    def __init__(self, kafka: connection.Connect, *, read_committed: bool = False) -> None:
        self._kafka = connection.of(kafka)
        self._consumer = self._kafka.consumer(
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
            isolation_level="read_committed" if read_committed else "read_uncommitted",
        )

    async def __aenter__(self) -> Self:
        try:
            await connection.start(self._kafka, self._consumer)
        except BaseException:
            await self._consumer.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._consumer.stop()

    async def partitions(self, topic: str) -> int:
        """How many partitions `topic` has (0 when it does not exist)."""
        await self._consumer._client.force_metadata_update()
        return len(self._consumer.partitions_for_topic(topic) or ())

    async def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start, end): the first offset held and one past the last, the end read, not trusted."""
        tp = TopicPartition(topic, partition)
        self._consumer.assign([tp])
        start = (await self._consumer.beginning_offsets([tp]))[tp]
        end = (await self._consumer.end_offsets([tp]))[tp]
        # The embedded broker reports the end short by the last batch, so fetch once at the
        # reported end: a fetch returns whole batches, that one included. Once only: on a live
        # log records keep coming, and reading on until it went quiet might never end.
        consumer = self._consumer
        consumer.seek(tp, end)
        while True:
            msgs = (await consumer.getmany(tp, timeout_ms=IDLE_POLL_MS)).get(tp, [])
            if msgs:
                return start, msgs[-1].offset + 1
            if await consumer.position(tp) >= end:  # asked after a poll (see `read`)
                return start, end

    async def read(
        self, topic: str, partition: int, start: int, end: int | None = None
    ) -> AsyncIterator[Message]:
        """Records with start <= offset < end (None: up to the end as it is read), in order."""
        if end is not None and start >= end:
            return
        tp = TopicPartition(topic, partition)
        consumer = self._consumer
        consumer.assign([tp])
        consumer.seek(tp, start)
        reported: int | None = None
        while True:
            batch = await consumer.getmany(tp, timeout_ms=IDLE_POLL_MS)
            msgs = batch.get(tp, [])
            if not msgs:
                # Asked only after a poll: right after a seek, position() can leave the
                # consumer unable to stop on the embedded broker.
                position = await consumer.position(tp)
                if end is None:
                    if reported is None:
                        reported = (await consumer.end_offsets([tp]))[tp]
                    if position >= reported:
                        return  # at the reported end and nothing more came: the end
                elif position >= end:
                    return  # only compacted-away records or transaction markers were left
                continue
            for m in msgs:
                if end is not None and m.offset >= end:
                    return
                yield Message(m.partition, m.offset, m.key, m.value or b"", tuple(m.headers or ()))
                if end is not None and m.offset + 1 >= end:
                    return

    async def at(self, topic: str, partition: int, offset: int) -> Message | None:
        """The record at `offset`, or None when the partition holds none there."""
        async for m in self.read(topic, partition, offset, offset + 1):
            return m if m.offset == offset else None
        return None

    async def last(
        self, topic: str, partition: int, match: Callable[[Message], bool], *, start: int, end: int
    ) -> Message | None:
        """The last record in [start, end) that `match`es, read backwards in growing windows."""
        hi, window = end, BACKWARD_WINDOW
        while hi > start:
            lo = max(start, hi - window)
            found = None
            async for m in self.read(topic, partition, lo, hi):
                if match(m):
                    found = m
            if found is not None:
                return found
            hi, window = lo, window * 4
        return None
