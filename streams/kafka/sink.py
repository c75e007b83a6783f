"""Where the source and the actuator put records: the one replaceable side effect of producing.

`KafkaSink` sends to a broker and returns once the record is acknowledged;
`MemorySink` keeps records in a list, for tests and in-process runs. Both keep
the order of `send` calls, which the cluster-events log depends on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self

from schemas import records
from streams.kafka import connection

# Acknowledged by every in-sync replica before `send` returns: a record the source
# or actuator considers written must survive the loss of the partition leader.
PRODUCER_ACKS = "all"
# How long the producer retries one send (leader elections, broker restarts)
# before the caller sees the failure and applies its own backoff.
PRODUCER_REQUEST_TIMEOUT_MS = 30_000
# Large enough for a ~1 MiB cluster-events batch, or a single Kubernetes object
# at etcd's 1.5 MiB limit, and equal to every topic's max.message.bytes
# (streams.kafka.topics explains the limits end to end).
PRODUCER_MAX_REQUEST_BYTES = records.RECORD_MAX_BYTES

Headers = Sequence[tuple[str, bytes]]


class RecordSink(Protocol):
    async def send(
        self, topic: str, value: bytes, *, key: bytes | None = None, headers: Headers = ()
    ) -> None:
        """Write one record; return once it is durable (or raise)."""


@dataclass(frozen=True)
class SentRecord:
    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass
class MemorySink:
    """Records in a list; `changed` wakes waiters on every send."""

    records: list[SentRecord] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def send(
        self, topic: str, value: bytes, *, key: bytes | None = None, headers: Headers = ()
    ) -> None:
        async with self.changed:
            self.records.append(SentRecord(topic, key, value, tuple(headers)))
            self.changed.notify_all()

    def on(self, topic: str) -> list[SentRecord]:
        return [r for r in self.records if r.topic == topic]

    async def wait_for(self, predicate: Callable[[list[SentRecord]], bool], *, timeout: float) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: predicate(self.records)), timeout)


class KafkaSink:
    """An aiokafka producer behind `send`; use as an async context manager."""

    def __init__(self, kafka: connection.Connect, *, client_id: str = "preemptctl") -> None:
        self._kafka = connection.of(kafka)
        # Not idempotent: the embedded tansu broker cannot serve InitProducerId
        # (docs/architecture.md §6). Duplicates after a retry are harmless downstream: object
        # events fold idempotently by resourceVersion and outcomes are deduplicated
        # by (decision id, victim uid).
        self._producer = self._kafka.producer(
            client_id=client_id,
            acks=PRODUCER_ACKS,
            request_timeout_ms=PRODUCER_REQUEST_TIMEOUT_MS,
            max_request_size=PRODUCER_MAX_REQUEST_BYTES,
        )

    async def send(
        self, topic: str, value: bytes, *, key: bytes | None = None, headers: Headers = ()
    ) -> None:
        await self._producer.send_and_wait(topic, value, key=key, headers=list(headers))

    async def __aenter__(self) -> Self:
        try:
            await connection.start(self._kafka, self._producer)
        except BaseException:
            await self._producer.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._producer.stop()
