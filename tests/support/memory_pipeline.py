"""The worker's partitions over an in-memory broker: the whole open/fold/commit/snapshot path, no Kafka.

`Pipeline` wires streams.pipeline.partitions to a MemoryBroker (reader and
outbox) and a store directory, so tests can produce records, run the partition
to the end of its log, break things between runs (a lost store, retention,
a recreated topic) and read back what was published.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from engine.config import Config
from schemas import VERSION, records
from streams.kafka.memory import MemoryBroker
from streams.kafka.reading import Message
from streams.pipeline.faults import Faults
from streams.pipeline.outbox import MemoryOutbox, Outbox
from streams.pipeline.partitions import Partitions
from streams.pipeline.setup import Setup, SnapshotPolicy

CLUSTER = "default"


def batches(
    events: Sequence[Any], *, cluster: str = CLUSTER, per_record: int = 10
) -> list[tuple[bytes, bytes]]:
    """(key, value) records of a cluster's events, `per_record` a record."""
    out = []
    for i in range(0, len(events), per_record):
        chunk = [
            {k: v for k, v in e.items() if k != "cluster"} if isinstance(e, dict) else e
            for e in events[i : i + per_record]
        ]
        out.append((cluster.encode(), orjson.dumps({"v": VERSION, "cluster": cluster, "events": chunk})))
    return out


class RecordingReader:
    """The broker, noting every read's (topic, start) so tests can tell bounded reads from full ones."""

    def __init__(self, broker: MemoryBroker, reads: list[tuple[str, int]]) -> None:
        self._broker = broker
        self._reads = reads

    async def __aenter__(self) -> RecordingReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        return await self._broker.bounds(topic, partition)

    def read(self, topic: str, partition: int, start: int, end: int | None = None) -> Any:
        self._reads.append((topic, start))
        return self._broker.read(topic, partition, start, end)

    async def at(self, topic: str, partition: int, offset: int) -> Message | None:
        return await self._broker.at(topic, partition, offset)

    async def last(self, topic: str, partition: int, match: Any, *, start: int, end: int) -> Message | None:
        return await self._broker.last(topic, partition, match, start=start, end=end)


class Pipeline:
    def __init__(
        self,
        store_dir: Path,
        *,
        broker: MemoryBroker | None = None,
        transactional: bool = True,
        faults: Faults | None = None,
        snapshots: SnapshotPolicy | None = None,
        config: Config | None = None,
    ) -> None:
        self.broker = broker or MemoryBroker()
        self.store_dir = store_dir
        self.reads: list[tuple[str, int]] = []
        self.faults = faults or Faults()
        self.fatal: list[BaseException] = []

        async def outbox(partition: int) -> Outbox:
            return MemoryOutbox(self.broker, transactional=transactional, faults=self.faults)

        self.setup = Setup(
            config=config or Config(),
            key=None,
            store_dir=store_dir,
            reader=lambda: RecordingReader(self.broker, self.reads),
            outbox=outbox,
            faults=self.faults,
            snapshots=snapshots or SnapshotPolicy(),
        )

    def produce(self, recs: Sequence[tuple[bytes | None, bytes]], partition: int = 0) -> None:
        for key, value in recs:
            self.broker.append(records.CLUSTER_EVENTS, partition, key, value)

    async def run(self, partition: int = 0) -> Partitions:
        """Open the partition (catching up to the log end), then close it; the Partitions used."""
        parts = Partitions(self.setup, on_fatal=self.fatal.append)
        await parts.assign([partition])
        while parts.opening:
            await asyncio.gather(*parts.opening.values())
        await parts.close()
        return parts

    async def feed(self, partition: int = 0) -> None:
        """Like the transport: open, then hand every record of the log to `handle` in order."""
        parts = Partitions(self.setup, on_fatal=self.fatal.append)
        await parts.assign([partition])
        for m in self.broker.messages(records.CLUSTER_EVENTS, partition):
            await parts.handle(partition, m.offset, m.key, m.value)
        await parts.close()

    def decisions(self, partition: int = 0) -> list[dict[str, Any]]:
        return [orjson.loads(m.value) for m in self.broker.messages(records.DECISIONS, partition)]

    def dead_letters(self, partition: int = 0) -> list[Message]:
        return self.broker.messages(records.DEAD_LETTER, partition)
