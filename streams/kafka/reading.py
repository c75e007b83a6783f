"""Reading whole topics with a plain aiokafka consumer (replay, export, audit, worker recovery).

The embedded broker reports a partition's end short by the last record batch
(DESIGN §11), so "read to the end" never trusts end offsets alone: it keeps
polling until the end offsets are reached *and* a poll comes back empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.common.errors import UsageError

# An empty poll this long after reaching the reported end means the topic is read.
IDLE_POLL_MS = 300
# The embedded broker holds every fetch for the full wait (no early answer on data).
FETCH_MAX_WAIT_MS = 50
# How long to wait for a topic's metadata before calling it missing.
METADATA_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def parse_topic_url(url: str) -> tuple[str, str]:
    """kafka://host:port/topic -> (bootstrap, topic)."""
    if not url.startswith("kafka://"):
        raise UsageError(f"not a kafka:// URL: {url}")
    rest = url[len("kafka://") :]
    bootstrap, _, topic = rest.partition("/")
    if not bootstrap or not topic or ":" not in bootstrap:
        raise UsageError(f"expected kafka://host:port/topic, got {url}")
    return bootstrap, topic


async def read_all(
    bootstrap: str, topic: str, *, read_committed: bool = False, partitions: list[int] | None = None
) -> AsyncIterator[Message]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
    )
    try:
        # Inside the try: a broker that cannot be reached still gets the consumer stopped.
        await consumer.start()
        deadline = asyncio.get_running_loop().time() + METADATA_TIMEOUT_S
        parts = consumer.partitions_for_topic(topic)
        while not parts:
            if asyncio.get_running_loop().time() > deadline:
                raise UsageError(f"topic {topic} not found on {bootstrap}")
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts) if partitions is None or p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
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


async def read_range(
    bootstrap: str, topic: str, partition: int, start: int, end: int
) -> AsyncIterator[Message]:
    """Records of one partition with start <= offset < end, in order."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        while True:
            batch = await consumer.getmany(tp, timeout_ms=IDLE_POLL_MS)
            msgs = batch.get(tp, [])
            if not msgs and await consumer.position(tp) >= end:
                return
            for m in msgs:
                if m.offset >= end:
                    return
                yield Message(m.partition, m.offset, m.key, m.value or b"", tuple(m.headers or ()))
    finally:
        await consumer.stop()
