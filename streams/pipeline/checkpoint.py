"""A partition's checkpoint: what it folded made durable, in order, so the store never runs ahead of the log.

`Checkpoint` is the part of `PartitionWorker` (streams.pipeline.worker) that
commits. A commit is due every CHECKPOINT_INTERVAL_S, at most
CHECKPOINT_MAX_RECORDS records apart, and at revocation and close; its steps,
in this order (`Checkpoint._commit`):

1. Flush: every record queued to the outbox since the last commit (decisions,
   dead letters) is sent and acknowledged. A failed send or commit breaks the
   worker (PartitionBroken): nothing after the last commit counts.
2. Commit: the outbox's commit (the transaction, under exactly_once). The
   decisions and dead letters are counted and logged as published before it
   when the outbox is not transactional (acknowledged is published), after it
   when it is (visible only once committed).
3. Mark: the state's `decisionsNext` (the decisions offset after the last
   decision published), `committed` and the fingerprint of the record there.
4. Store: the controllers' state and every object changed since the last write
   (the keys their `Ready`s named) in one rocksdict batch, unless the last
   write was costly (STORE_TIME_SHARE): then a later commit writes it. A failed
   write keeps the changes for the next one; STORE_WRITE_ATTEMPTS in a row
   stall the partition (Stalled).
5. Snapshot: when enough events were folded since the last one
   (SnapshotPolicy), the stored state is written to the snapshots topic
   (streams.pipeline.snapshot).

The store therefore never reflects a record whose output is not in the log; it
may lag what is published, which only means more log to fold again after a
crash, its decisions found published, not sent again (streams.pipeline.recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from fold.controller import Controller
from schemas.records import DecisionRecord
from streams.common import logs
from streams.kafka import deadletter
from streams.pipeline import metrics, snapshot
from streams.pipeline import outbox as outbox_mod
from streams.pipeline.outbox import Fenced, Outbox, Outgoing, SendFailed
from streams.pipeline.setup import Setup
from streams.pipeline.snapshot import Manifest
from streams.pipeline.store import Store

log = logging.getLogger("preemptctl.worker")

POSITION = Gauge("preemptctl_worker_position", "The cluster-events offset the store reflects.", ["partition"])
SEND_FAILURES = Counter(
    "preemptctl_worker_send_failures_total", "Sends or commits that failed (the partition was reopened)."
)
STORE_FAILURES = Counter(
    "preemptctl_worker_store_write_failures_total", "Store writes that failed (retried at the next commit)."
)
SNAPSHOTS = Counter("preemptctl_worker_snapshots_total", "Snapshots written to Kafka.")
SNAPSHOT_SECONDS = Histogram(
    "preemptctl_worker_snapshot_seconds",
    "Time to write one snapshot.",
    buckets=(0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


# The store is written (after the outputs are published) at most this often, and after
# this many records: writing it per record would cap small records at ~1k/s. A crash
# in between only means re-folding a little log; nothing published is sent twice.
CHECKPOINT_INTERVAL_S = 0.2
CHECKPOINT_MAX_RECORDS = 1000
# The most of its time a partition spends writing its store: a write costs O(state) (the
# controllers' state record holds every pending preemptor, nomination and tombstone), and
# commits come every CHECKPOINT_INTERVAL_S of wall time, so on a loaded machine or with a
# large state writing it at every commit once took most of the fold. A write that took
# t seconds is followed by the next no sooner than t / STORE_TIME_SHARE later; publishing
# is not delayed (only the store lags, by a little more log to fold again after a crash).
STORE_TIME_SHARE = 0.1
# Store writes that may fail in a row (a full disk, an I/O error) before the partition is
# declared stalled: the changes wait for the next commit meanwhile, but without a written
# store no snapshot is taken either and every restart re-folds more log. ~4 s of commits.
STORE_WRITE_ATTEMPTS = 20
# The most of an error message a log line repeats: an error may quote a huge input.
LOG_ERROR_CHARS = 500


class PartitionBroken(RuntimeError):
    """A send or commit failed: this worker's state may be ahead of the log; reopen it from its store."""


class Stalled(RuntimeError):
    """The partition cannot make progress: a record can be neither folded nor dead-lettered, or
    the state cannot be stored. Reopening would stop at the same place; the process exits with
    its own code for the supervisor (streams.pipeline.app.EXIT_STALLED)."""

    def __init__(self, partition: int, reason: str) -> None:
        super().__init__(f"partition {partition}: {reason}")
        self.partition = partition
        self.reason = reason


def fingerprint(key: bytes | None, value: bytes) -> str:
    """Identifies a record of one topic incarnation: another topic's record at that offset differs."""
    return hashlib.blake2b((key or b"") + b"\0" + value, digest_size=16).hexdigest()


class Checkpoint:
    """Committing, storing and snapshotting one partition: the worker's methods for steps 1-5."""

    # The worker's own fields (streams.pipeline.worker.PartitionWorker), which a checkpoint
    # reads and advances.
    partition: int
    setup: Setup
    store: Store
    outbox: Outbox
    controllers: dict[str, Controller]
    position: int
    committed: int
    stored: int
    decisions_next: int | None
    incarnation: str | None
    manifest: Manifest | None
    since_snapshot: int
    broken: str | None
    fenced: bool
    unstored: dict[str, dict[str, bytes | None]]
    _fingerprint: str
    _last: tuple[bytes | None, bytes] | None
    _sent: list[Outgoing]
    _decided: list[tuple[float, DecisionRecord]]
    _last_commit: float
    _store_failures: int
    _stored_at: float
    _store_seconds: float
    _lock: asyncio.Lock

    def commit_due(self) -> bool:
        """Is there something to commit, and was the last commit CHECKPOINT_INTERVAL_S ago?"""
        pending = self.position != self.committed or self.stored != self.committed
        return pending and time.monotonic() - self._last_commit >= CHECKPOINT_INTERVAL_S

    def _stall(self, reason: str) -> Stalled:
        """Stop counting (nothing after the last commit is stored) and say why."""
        self.broken = f"stalled: {reason}"
        log.critical("partition %d: stalled: %s", self.partition, reason)
        return Stalled(self.partition, reason)

    def _break(self, exc: BaseException) -> None:
        SEND_FAILURES.inc()
        self.broken = f"{type(exc).__name__}: {exc}"
        self.fenced = isinstance(exc, Fenced)
        log.warning(
            "partition %d: %s; nothing after offset %d counts", self.partition, self.broken, self.committed
        )

    async def commit(self, *, final: bool = False) -> None:
        """Publish everything queued, then write the store; a snapshot after, when one is due.

        Called after records (when due), by the owner's timer (a partition that went
        quiet must still publish: under exactly_once nothing is visible before its
        commit), and on revocation and close (`final`: the store is written whatever
        its last write cost, STORE_TIME_SHARE).
        """
        async with self._lock:
            await self._commit(final=final)

    def _store_due(self, final: bool) -> bool:
        return final or time.monotonic() - self._stored_at >= self._store_seconds / STORE_TIME_SHARE

    async def _commit(self, *, final: bool = False) -> None:
        if self.broken is not None:
            raise PartitionBroken(self.broken)
        self._last_commit = time.monotonic()
        if self.position == self.committed and not self._sent:
            if self.stored != self.committed and self._store_due(final):
                self._write_store()  # a failed write is retried even when nothing new came
            return
        try:
            offsets = await self.outbox.flush()  # 1. flush
            if not self.outbox.transactional:
                # Acknowledged is published: a commit that fails after this must not lose
                # the count (a reopened worker finds these decisions published, sends none).
                self._count_published()
            await self.outbox.commit()  # 2. commit
        except SendFailed as exc:
            self._break(exc)
            raise PartitionBroken(self.broken) from exc
        if self.outbox.transactional:
            self._count_published()  # visible to read_committed consumers from now on
        sent, self._sent = self._sent, []  # 3. mark
        decided = outbox_mod.sent_offsets(sent, offsets, self.setup.names.decisions)
        if decided:
            self.decisions_next = max(decided) + 1
        self.committed = self.position
        if self._last is not None:
            self._fingerprint = fingerprint(*self._last)
        if not self._store_due(final):
            return  # published; the store follows at a later commit (the state stays dirty)
        self._write_store()  # 4. store
        if self._snapshot_due():
            await self._snapshot()  # 5. snapshot

    def _count_published(self) -> None:
        """Decisions (with their latency) and dead letters, counted and logged once they are published."""
        published, self._decided = self._decided, []
        now = time.perf_counter()
        logging_decisions = log.isEnabledFor(logging.INFO)
        for started, d in published:
            metrics.emitted(d, now - started)
            if logging_decisions:
                log_decision(d)
        for record in self._sent:
            if record.dead_letter:
                deadletter.sent("worker", record.headers)

    def _state(self) -> dict[str, Any]:
        return {
            "position": self.committed,
            "fingerprint": self._fingerprint,
            "decisionsNext": self.decisions_next,
            "incarnation": self.incarnation,
            "sinceSnapshot": self.since_snapshot,
            "clusters": {name: ctl.state() for name, ctl in sorted(self.controllers.items())},
        }

    def _write_store(self) -> None:
        started = time.monotonic()
        try:
            self.store.write(self.unstored, self._state())
        except Exception as exc:  # a full disk, an I/O error, an injected fault
            # The changes stay marked dirty: the next commit writes them with its own.
            STORE_FAILURES.inc()
            self._store_failures += 1
            if self._store_failures >= STORE_WRITE_ATTEMPTS:
                raise self._stall(
                    f"{self._store_failures} store writes failed in a row, the last: {short_error(exc)}"
                ) from exc
            log.error(
                "partition %d: store write failed (%s); retried at the next commit", self.partition, exc
            )
            return
        self._store_failures = 0
        self._stored_at = time.monotonic()
        self._store_seconds = self._stored_at - started
        self.unstored = {}
        self.stored = self.committed
        POSITION.labels(str(self.partition)).set(self.committed)

    def _snapshot_due(self) -> bool:
        if self.since_snapshot == 0 or self.stored != self.committed:
            return False
        if self.manifest is None:
            return True  # the first one right away, while the state is small
        if not self.manifest.projected or (
            self.manifest.previous is not None and not self.manifest.previous.projected
        ):
            return True  # it may hold whole objects: replaced (and tombstoned) right away
        objects = sum(len(c.cluster.pods) + len(c.cluster.nodes) for c in self.controllers.values())
        policy = self.setup.snapshots
        return self.since_snapshot >= max(policy.min_events, policy.events_per_object * objects)

    async def _snapshot(self) -> None:
        if self.manifest is not None and self.manifest.position >= self.stored:
            return
        state = self.store.state()
        if state is None:
            return
        started = time.perf_counter()
        try:
            manifest = await snapshot.write(
                self.outbox,
                partition=self.partition,
                state=state,
                entries=self.store.entries(),
                previous=self.manifest,
                topic=self.setup.names.snapshots,
            )
        except SendFailed as exc:
            if isinstance(exc, Fenced):
                self._break(exc)
                raise PartitionBroken(self.broken) from exc
            log.warning("partition %d: snapshot at %d not written (%s)", self.partition, self.stored, exc)
            with contextlib.suppress(SendFailed):
                await self.outbox.abort()
            return
        self.manifest = manifest
        self.since_snapshot = 0
        SNAPSHOTS.inc()
        SNAPSHOT_SECONDS.observe(time.perf_counter() - started)
        log.info(
            "partition %d: snapshot at %d written (%d chunks) in %.2fs",
            self.partition,
            manifest.position,
            len(manifest.chunks),
            time.perf_counter() - started,
        )


def short_error(exc: BaseException) -> str:
    """An exception for a log line or a reason: its class and the start of its message."""
    return f"{type(exc).__name__}: {str(exc)[:LOG_ERROR_CHARS]}"


def log_decision(d: DecisionRecord) -> None:
    """One line per published decision, with its id, cluster and preemptor as fields (streams.common.logs)."""
    where = d.get("node") or ", ".join(sorted(set((d.get("placements") or {}).values())))
    fresh = [f"{v['namespace']}/{v['name']}" for v in d["victims"] if not v.get("terminating")]
    detail = f"{len(fresh)} victim(s) {', '.join(fresh)}" if fresh else d["reason"]
    log.info(
        "%s %s%s: %s",
        d["outcome"],
        d["preemptor"],
        f" on {where}" if where else "",
        detail,
        extra=logs.decision_fields(d),
    )
