"""An in-memory stand-in for the partitions of a broker: for tests and in-process benchmarks.

`MemoryBroker` keeps each (topic, partition) as a list of records with offsets,
reads them through the same calls as `reading.PartitionReader` (bounds, read,
at, last), and can lose its head the way retention does (`delete_before`).
Writers append; transactions are modelled by the writer (streams.pipeline.outbox),
which appends only what it commits, so readers here see the read_committed view.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from streams.kafka.reading import Message

Headers = Sequence[tuple[str, bytes]]


@dataclass
class _Log:
    start: int = 0
    records: list[Message | None] = field(default_factory=list)  # index = offset - base
    base: int = 0

    @property
    def end(self) -> int:
        return self.base + len(self.records)


class MemoryBroker:
    def __init__(self, partitions: int = 1) -> None:
        self.partition_count = partitions
        self._logs: dict[tuple[str, int], _Log] = {}

    def _log(self, topic: str, partition: int) -> _Log:
        return self._logs.setdefault((topic, partition), _Log())

    def append(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> int:
        log = self._log(topic, partition)
        offset = log.end
        log.records.append(Message(partition, offset, key, value or b"", tuple(headers)))
        return offset

    def delete_before(self, topic: str, partition: int, offset: int) -> None:
        """Drop every record below `offset`, as retention or DeleteRecords does."""
        log = self._log(topic, partition)
        offset = min(offset, log.end)
        for i in range(log.start - log.base, offset - log.base):
            log.records[i] = None
        log.start = max(log.start, offset)

    def messages(self, topic: str, partition: int = 0) -> list[Message]:
        return [m for m in self._log(topic, partition).records if m is not None]

    # ---- the reader interface (streams.kafka.reading.PartitionReader) ----------------------

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def partitions(self, topic: str) -> int:
        return self.partition_count

    async def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        log = self._log(topic, partition)
        return log.start, log.end

    async def read(
        self, topic: str, partition: int, start: int, end: int | None = None
    ) -> AsyncIterator[Message]:
        log = self._log(topic, partition)
        stop = log.end if end is None else min(end, log.end)
        for offset in range(max(start, log.start), stop):
            m = log.records[offset - log.base]
            if m is not None:
                yield m

    async def at(self, topic: str, partition: int, offset: int) -> Message | None:
        log = self._log(topic, partition)
        if log.start <= offset < log.end:
            return log.records[offset - log.base]
        return None

    async def last(
        self, topic: str, partition: int, match: Callable[[Message], bool], *, start: int, end: int
    ) -> Message | None:
        found = None
        async for m in self.read(topic, partition, start, end):
            if match(m):
                found = m
        return found
