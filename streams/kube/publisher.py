"""The source's writer: events batched, in order, into preemption.cluster-events records.

Each event is encoded once, as it is put; a record is the envelope (schemas.records,
`batch_frame`) around as many encoded events as arrived while the previous record was
being written, keyed by cluster name. What it handles:
- Backpressure: at most QUEUE_MAX_EVENTS wait for the producer; a full queue pauses
  whoever puts (the source's watches) instead of growing memory while Kafka is slow or away.
- A failed write is retried, in order, with backoff, until it succeeds: a record is never
  skipped, and nothing after it is written first.
- An event larger than MAX_EVENT_BYTES is refused when put (EventTooLarge, nothing queued):
  the producer would refuse its record for good and, retried, it would hold back the whole log.
- One writer per log: `guard` (the Lease check, streams.kube.lease) runs before every
  write. A record it refuses is dropped, and so is every later one (`fenced`), until the
  writer has stopped following and calls `discard()`: events after a gap must not look
  continuous; the next holder's RESYNC restates the cluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client import Counter, Gauge, Histogram

from engine import projection
from schemas import records
from schemas.records import CLUSTER_EVENTS
from streams.common.backoff import Backoff
from streams.kafka.sink import PRODUCER_MAX_REQUEST_BYTES, RecordSink
from streams.kube import lease

log = logging.getLogger(__name__)

# A record holds at most this much event JSON (docs/topics.md: ~1 MiB), well under the
# topic's max.message.bytes; a single larger object still goes alone.
MAX_RECORD_BYTES = 1024 * 1024
# One event alone must fit in a record the producer accepts (PRODUCER_MAX_REQUEST_BYTES),
# with room for the record's envelope, key, headers and batch overhead. A larger record is
# refused for good, and retrying it would hold back every event after it forever.
MAX_EVENT_BYTES = PRODUCER_MAX_REQUEST_BYTES - 64 * 1024
# Events waiting for the producer; a full queue pauses the watches (backpressure)
# instead of growing memory while Kafka is slow or away.
QUEUE_MAX_EVENTS = 10_000

RECORDS = Counter("preemptctl_source_records_total", "Records written to preemption.cluster-events.")
RECORD_BYTES = Histogram(
    "preemptctl_source_record_size_bytes",
    "Size of each cluster-events record.",
    buckets=(512, 4096, 16384, 65536, 262144, 524288, 1048576, 2097152),
)
RECORD_EVENTS = Histogram(
    "preemptctl_source_record_events",
    "Events per cluster-events record.",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
SEND_SECONDS = Histogram("preemptctl_source_send_duration_seconds", "Time to write one record to Kafka.")
SEND_ERRORS = Counter("preemptctl_source_send_errors_total", "Failed record writes (retried).")
QUEUED = Gauge("preemptctl_source_queued_events", "Events waiting to be written.")

# On every record: its objects are engine.projection's of this very allow-list (every event
# goes through Source._emit, or is a tombstone of identity fields only), so the worker need
# not project them again (docs/topics.md, "What the worker keeps").
PROJECTED = ((projection.HEADER, projection.HEADER_VALUE),)


class EventTooLarge(Exception):
    """One event larger than MAX_EVENT_BYTES: no record could carry it."""


class Publisher:
    """Batches events into cluster-events records, in order, and writes them through a sink.

    A record holds every event that arrived while the previous one was being
    written, up to MAX_RECORD_BYTES: one event per record when idle, hundreds
    under load, with no artificial delay (the write itself is the linger).
    """

    def __init__(
        self,
        sink: RecordSink,
        *,
        cluster: str,
        topic: str = CLUSTER_EVENTS,
        max_record_bytes: int = MAX_RECORD_BYTES,
        max_event_bytes: int = MAX_EVENT_BYTES,
        queue_size: int = QUEUE_MAX_EVENTS,
        backoff: Callable[[], Backoff] = Backoff,
        guard: Callable[[], None] = lambda: None,
    ) -> None:
        self._sink = sink
        self._guard = guard
        self._topic = topic
        self._key = cluster.encode()
        self._head, self._tail = records.batch_frame(cluster)
        self._max = max_record_bytes
        self._max_event = max_event_bytes
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(queue_size)
        self._carry: bytes | None = None
        self._backoff = backoff
        # Set when the Lease check refused a record: the log has a gap from then on. Every later
        # record is dropped too (events after a gap must not look continuous) until `discard()`,
        # which the source calls once it has stopped following, before it relists.
        self.fenced = asyncio.Event()

    async def put(self, event: dict[str, Any]) -> None:
        """Queue one event; EventTooLarge (nothing queued) when no record could carry it."""
        value = orjson.dumps(event)
        if len(value) > self._max_event:
            raise EventTooLarge(f"{len(value)} bytes, more than {self._max_event}")
        await self._queue.put(value)
        QUEUED.set(self._queue.qsize())

    async def flush(self) -> None:
        """Return once every event put so far is written."""
        await self._queue.join()

    def discard(self) -> int:
        """Drop every event not written yet (the Lease was lost, or a write was refused) and clear
        `fenced`; returns how many were dropped. The caller relists next: RESYNC restates the cluster."""
        self.fenced.clear()
        dropped = 0
        if self._carry is not None:
            self._carry = None
            dropped += 1
            self._queue.task_done()
        while self._queue.qsize():
            self._queue.get_nowait()
            self._queue.task_done()
            dropped += 1
        QUEUED.set(0)
        return dropped

    def _take(self, first: bytes) -> list[bytes]:
        parts, size = [first], len(first)
        while self._queue.qsize():
            nxt = self._queue.get_nowait()
            if size + len(nxt) + 1 > self._max:
                self._carry = nxt
                break
            parts.append(nxt)
            size += len(nxt) + 1
        return parts

    async def run(self) -> None:
        """Write records until cancelled; a failed write is retried (in order) until it succeeds."""
        while True:
            first, self._carry = (self._carry, None) if self._carry else (await self._queue.get(), None)
            parts = self._take(first)
            value = self._head + b",".join(parts) + self._tail
            backoff = self._backoff()
            while not self.fenced.is_set():
                try:
                    self._guard()  # one writer per log: never after the Lease has passed on
                    with SEND_SECONDS.time():
                        await self._sink.send(self._topic, value, key=self._key, headers=PROJECTED)
                    RECORDS.inc()
                    RECORD_BYTES.observe(len(value))
                    RECORD_EVENTS.observe(len(parts))
                    break
                except lease.NotLeader as exc:
                    # Dropped, and so is everything after it until the source relists: whoever
                    # writes next (this source, once renewed, or another) starts with RESYNC. A
                    # renewal may well land before the Lease is lost, so the drop itself must
                    # trigger the relist (Source._deposed), not only a lost Lease.
                    log.warning("not writing %d events, relisting: %s", len(parts), exc)
                    self.fenced.set()
                except Exception as exc:  # any producer failure: the record must still go, in order
                    SEND_ERRORS.inc()
                    delay = backoff.delay()
                    log.warning("writing %d events failed (%s); retrying in %.1fs", len(parts), exc, delay)
                    await asyncio.sleep(delay)
            for _ in parts:
                self._queue.task_done()
            QUEUED.set(self._queue.qsize())
