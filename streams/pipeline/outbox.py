"""What the worker publishes and how: every outgoing record is built here, and sent through one Outbox.

Building (one function per kind of record, the place to add headers such as
CloudEvents attributes): `decision`, `dead_letter`; the snapshot records are
built by streams.pipeline.snapshot through `Outgoing` too. Every record of
cluster-events partition p goes to partition p of its topic, so one worker
owns all that partition's output.

Sending (`Outbox`): `send` queues a record, `flush` waits for everything queued
to be acknowledged and returns the offsets, `commit` ends the unit of work.
- `KafkaOutbox(transactional=True)` (`--processing-guarantee exactly_once`, real
  Kafka): one transactional producer per cluster-events partition, with the
  transactional id `<group>-<cluster-events>-<partition>`. Starting it fences
  every earlier producer of that id (a worker that owned the partition before
  and may still be running, paused or partitioned away), and aborts what it
  left open; its later sends fail with ProducerFenced. Records become visible
  to read_committed consumers (the actuator) only when `commit` succeeds.
- `KafkaOutbox(transactional=False)` (at_least_once; the embedded broker has no
  transactions): records are visible once acknowledged; `commit` = `flush`.
- `MemoryOutbox`: the same over a streams.kafka.memory.MemoryBroker.
Any failure raises SendFailed (or Fenced): the caller must treat everything
since its last successful commit as unpublished (streams.pipeline.worker).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import InvalidProducerEpoch, KafkaError, ProducerFenced

from schemas import cloudevent, records
from schemas.records import DecisionRecord
from streams.common import signing
from streams.kafka import connection, deadletter
from streams.kafka.deadletter import Origin
from streams.kafka.memory import MemoryBroker
from streams.pipeline.faults import NONE, Faults, InjectedFault

Headers = tuple[tuple[str, bytes], ...]

# On every decision: the cluster-events incarnation it was folded from (streams.pipeline.worker.
# incarnation_of). A worker opening a partition tells by it which published decisions are of
# the log it folds, and which of a cluster-events topic since deleted and re-created.
INCARNATION_HEADER = "preemptctl-incarnation"

# Acknowledged by every in-sync replica: a decision the worker counts as published
# must survive the loss of the partition leader.
PRODUCER_ACKS = "all"
# How long the producer retries a send (leader elections, a broker restart)
# before the worker sees the failure and reopens the partition from its store.
PRODUCER_REQUEST_TIMEOUT_MS = 30_000
# Decisions are sent as soon as they are made; a short linger batches the few a
# record of events leads to without adding noticeable latency.
PRODUCER_LINGER_MS = 2
# A transactional producer's InitProducerId (which fences the previous owner) must
# answer within this long, or the broker has no transactions (the embedded tansu).
TRANSACTIONS_INIT_TIMEOUT_S = 30.0
# How long a transaction may stay open on the broker before it aborts it: a worker
# that stops without committing cannot block read_committed consumers for longer.
TRANSACTION_TIMEOUT_MS = 60_000


class SendFailed(RuntimeError):
    """A record was not published (or its acknowledgement was lost): nothing since the last commit counts."""


class Fenced(SendFailed):
    """Another worker has taken the partition over: this one must publish nothing more."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None  # None: a tombstone (compacted topics)
    headers: Headers = ()
    # What it is, whatever its topic is called (--topic-prefix): counted by kind.
    decision: bool = False
    dead_letter: bool = False


# ---- building records ----------------------------------------------------------------------


def decision(
    record: DecisionRecord,
    *,
    partition: int,
    encoded: bytes | None = None,
    key_id: str | None = None,
    topic: str = records.DECISIONS,
    incarnation: str | None = None,
) -> Outgoing:
    """A decision record, keyed by its cluster (docs/topics.md); its size is held by the controller.

    `encoded`: the record's bytes when the caller has them (the controller encodes
    each decision once, to hold it to the size limit). `key_id`: the id of the key
    that signed it, in the signing.KEY_ID_HEADER header (the actuator verifies with it).
    `incarnation`: the cluster-events incarnation it was folded from (INCARNATION_HEADER).
    """
    value = encoded if encoded is not None else records.encode(record)
    headers = tuple(cloudevent.decision_headers(record))  # CloudEvents binary mode (docs/topics.md)
    if key_id is not None and record.get("sig"):
        headers += ((signing.KEY_ID_HEADER, key_id.encode()),)
    if incarnation is not None:
        headers += ((INCARNATION_HEADER, incarnation.encode()),)
    return Outgoing(topic, partition, record["cluster"].encode(), value, headers, decision=True)


def dead_letter(
    *,
    key: bytes | None,
    value: bytes | None,
    origin: Origin,
    error_class: str,
    error: str,
    partition: int,
    topic: str = records.DEAD_LETTER,
) -> Outgoing:
    """The rejected bytes with where they came from and why (docs/topics.md).

    Bytes too large to publish with their headers (a whole record near the topic's
    limit) are replaced by a reference to their origin, with their size and digest,
    and the header `value-omitted: too-large`; a key still too large is left out
    (`key-omitted: too-large`). The origin topic still holds both. `value` None is
    an event that cannot be encoded again (nested deeper than the encoder goes):
    the reference says so (`value-omitted: unencodable`).
    """
    origin_headers = deadletter.origin_headers(origin, error_class, error)
    reference = {
        "topic": origin.topic,
        "partition": origin.partition,
        "offset": origin.offset,
        "index": origin.index,
    }
    if value is None:
        value = orjson.dumps({"omitted": "unencodable", "origin": reference})
        origin_headers.append(("value-omitted", b"unencodable"))
    # The origin headers, then the CloudEvents attributes of what is actually sent.
    headers = deadletter.headers(key, value, origin_headers)
    if _size(key, value, headers) > records.VALUE_MAX_BYTES:
        value = orjson.dumps(
            {
                "omitted": "too-large",
                "bytes": len(value),
                "sha256": hashlib.sha256(value).hexdigest(),
                "origin": reference,
            }
        )
        origin_headers.append(("value-omitted", b"too-large"))
        headers = deadletter.headers(key, value, origin_headers)
        if _size(key, value, headers) > records.VALUE_MAX_BYTES:
            # A key that alone nearly fills a record: the origin still holds it too.
            key = None
            origin_headers.append(("key-omitted", b"too-large"))
            headers = deadletter.headers(key, value, origin_headers)
    return Outgoing(topic, partition, key, value, tuple(headers), dead_letter=True)


def _size(key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes]]) -> int:
    """What a record counts against the producer's limit, but for its fixed overhead."""
    return len(key or b"") + len(value) + sum(len(name) + len(v) for name, v in headers)


# ---- sending them --------------------------------------------------------------------------


class Outbox(Protocol):
    # With transactions a record is visible at `commit`; without, once `flush` returned.
    transactional: bool

    async def send(self, record: Outgoing) -> None:
        """Queue one record (raise SendFailed if it cannot even be queued)."""

    async def flush(self) -> list[int]:
        """Wait until every record queued since the last flush is written; their offsets, in order."""

    async def commit(self) -> None:
        """End the unit of work: flush and, with transactions, commit (records become visible)."""

    async def abort(self) -> None:
        """Drop the unit of work (with transactions: aborted; without: what was sent stays sent)."""

    async def close(self) -> None: ...


def _failure(exc: BaseException) -> SendFailed:
    if isinstance(exc, (ProducerFenced, InvalidProducerEpoch)):
        return Fenced(f"fenced: another worker owns this partition now ({exc!r})")
    return SendFailed(f"{type(exc).__name__}: {exc}")


def new_producer(kafka: connection.Connect, *, transactional_id: str | None = None) -> AIOKafkaProducer:
    """A producer within the record size limits of streams.kafka.topics."""
    extra: dict[str, Any] = {}
    if transactional_id is not None:
        extra = {"transactional_id": transactional_id, "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS}
    return connection.of(kafka).producer(
        client_id="preemptctl-worker",
        acks=PRODUCER_ACKS,
        linger_ms=PRODUCER_LINGER_MS,
        request_timeout_ms=PRODUCER_REQUEST_TIMEOUT_MS,
        max_request_size=records.RECORD_MAX_BYTES,
        **extra,
    )


class TransactionsUnavailable(RuntimeError):
    """The broker did not answer InitProducerId: exactly_once cannot run on it."""


async def start_transactional(kafka: connection.Connect, transactional_id: str) -> AIOKafkaProducer:
    """A started transactional producer; starting it fences every earlier one with this id."""
    producer = new_producer(kafka, transactional_id=transactional_id)
    try:
        await asyncio.wait_for(producer.start(), TRANSACTIONS_INIT_TIMEOUT_S)
    except TimeoutError as exc:
        await producer.stop()
        raise TransactionsUnavailable(
            f"the broker at {connection.of(kafka).describe()} did not initialise a transactional producer "
            "within "
            f"{TRANSACTIONS_INIT_TIMEOUT_S:.0f}s: exactly_once needs Kafka transactions "
            "(the embedded broker has none: use --processing-guarantee at_least_once)"
        ) from exc
    except BaseException:
        await producer.stop()
        raise
    return producer


async def _commit_faults(faults: Faults, decided: int, abort: Callable[[], Awaitable[None]]) -> None:
    """The injected commit faults (streams.pipeline.faults), where a commit with decisions is made."""
    if not decided:
        return
    if faults.hit("abort-commit"):
        await abort()
        raise SendFailed(f"injected abort-commit (call {faults.calls['abort-commit']})")
    if faults.hit("stop-before-commit"):
        os.kill(os.getpid(), signal.SIGSTOP)  # until SIGCONT: a paused worker, mid-transaction


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a send's outcome as seen (the flush that awaits it reports a failure, if any does)."""
    if not fut.cancelled():
        fut.exception()


class KafkaOutbox:
    """An Outbox over an aiokafka producer; `owns_producer`: close() stops it too."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        *,
        transactional: bool,
        owns_producer: bool,
        faults: Faults = NONE,
    ) -> None:
        self._producer = producer
        self.transactional = transactional
        self._owns = owns_producer
        self._faults = faults
        self._pending: list[Awaitable[Any]] = []
        self._open = False  # a transaction is open
        self._decisions = 0  # decisions sent since the last commit (what the commit faults count)

    async def send(self, record: Outgoing) -> None:
        try:
            self._faults.check("fail-send")
            if self.transactional and not self._open:
                await self._producer.begin_transaction()
                self._open = True
            fut = await self._producer.send(
                record.topic,
                record.value,
                key=record.key,
                partition=record.partition,
                headers=list(record.headers),
            )
        except (KafkaError, InjectedFault) as exc:
            raise _failure(exc) from exc
        # Retrieved whatever happens: a flush stops at the first failed send, and an abort drops
        # the rest, whose failures asyncio would log as "Future exception was never retrieved".
        fut.add_done_callback(_retrieve)
        self._pending.append(fut)
        self._decisions += record.decision

    async def flush(self) -> list[int]:
        pending, self._pending = self._pending, []
        offsets = []
        try:
            for fut in pending:
                offsets.append((await fut).offset)
        except KafkaError as exc:
            raise _failure(exc) from exc
        return offsets

    async def commit(self) -> None:
        await self.flush()
        decided, self._decisions = self._decisions, 0
        await _commit_faults(self._faults, decided, self.abort)
        if self.transactional and self._open:
            try:
                await self._producer.commit_transaction()
            except KafkaError as exc:
                raise _failure(exc) from exc
            self._open = False

    async def abort(self) -> None:
        self._pending = []
        self._decisions = 0
        if self.transactional and self._open:
            self._open = False
            try:
                await self._producer.abort_transaction()
            except KafkaError as exc:
                raise _failure(exc) from exc

    async def close(self) -> None:
        if self._owns:
            await self._producer.stop()


class MemoryOutbox:
    """An Outbox over a MemoryBroker: committed records are appended (read_committed view)."""

    def __init__(self, broker: MemoryBroker, *, transactional: bool = True, faults: Faults = NONE) -> None:
        self.broker = broker
        self.transactional = transactional
        self._faults = faults
        self._queued: list[Outgoing] = []  # transactional: appended at commit
        self._offsets: list[int] = []
        self._decisions = 0

    def _append(self, record: Outgoing) -> int:
        return self.broker.append(record.topic, record.partition, record.key, record.value, record.headers)

    async def send(self, record: Outgoing) -> None:
        try:
            self._faults.check("fail-send")
        except InjectedFault as exc:
            raise SendFailed(str(exc)) from exc
        self._decisions += record.decision
        if self.transactional:
            self._queued.append(record)
            # Offsets as the broker will give them at commit (nothing else writes there meanwhile).
            end = (await self.broker.bounds(record.topic, record.partition))[1]
            ahead = sum(
                1 for r in self._queued[:-1] if (r.topic, r.partition) == (record.topic, record.partition)
            )
            self._offsets.append(end + ahead)
        else:
            self._offsets.append(self._append(record))

    async def flush(self) -> list[int]:
        offsets, self._offsets = self._offsets, []
        return offsets

    async def commit(self) -> None:
        await self.flush()
        decided, self._decisions = self._decisions, 0
        await _commit_faults(self._faults, decided, self.abort)
        queued, self._queued = self._queued, []
        for record in queued:
            self._append(record)

    async def abort(self) -> None:
        self._queued = []
        self._offsets = []
        self._decisions = 0

    async def close(self) -> None:
        await self.abort()


def sent_offsets(sent: Sequence[Outgoing], offsets: Sequence[int], topic: str) -> list[int]:
    """The offsets of the records of `topic` among those sent."""
    return [o for r, o in zip(sent, offsets, strict=True) if r.topic == topic]
