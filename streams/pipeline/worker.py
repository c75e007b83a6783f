"""One cluster-events partition's worker: fold, publish, commit, snapshot, and open again after anything.

`PartitionWorker` owns partition p: its controllers (one per cluster keyed to
p), its rocksdict store, the outbox its records go through, and the rules that
keep the published log and the state in step:
- Folding is per event and atomic (fold.controller): an event that cannot be
  folded or decided is dead-lettered with its origin (offset and index) and the
  rest of its record goes on. A record that does not decode, or whose key is
  not its envelope's cluster, is dead-lettered whole. Each event's `Ready`
  hands over its decisions' bytes, queued to the outbox as they are made, and
  the store keys it changed, gathered in `unstored` until the store is written.
- Decisions and dead letters are queued to the outbox as they are made; a
  commit (every CHECKPOINT_INTERVAL_S, at most CHECKPOINT_MAX_RECORDS records
  apart) waits until they are published (acknowledged, or the transaction
  committed) and only then writes the store (not at every commit when writing it
  is costly: STORE_TIME_SHARE). The store therefore never reflects a record whose
  output is not in the log; it may lag what is published, which only means more
  log to fold again after a crash, its decisions found published, not sent again.
  A failed send breaks the worker (PartitionBroken): nothing more is folded or
  stored, and the owner reopens the partition from its store
  (streams.pipeline.partitions), which re-derives the same decisions byte for
  byte. A failed store write keeps the changes it did not write for the next
  commit.
- Each commit also records `decisionsNext`, the decisions offset after the last
  decision published. Opening reads the decisions written from there to the
  end (a bounded read: what was published after the state's commit) and does
  not send those again.
- Opening takes the newest of the local store and the latest snapshot in
  Kafka (streams.pipeline.snapshot) whose position belongs to the
  cluster-events topic as it is now: the state records the fingerprint of the
  record at its position, and a position past the end or a record that differs
  means the topic was recreated (the state is discarded). Then the log after
  the position is folded to its end (`catch_up`). Nothing reads a topic from its
  beginning, except a partition that has no state at all yet.
- After a commit, a snapshot is written when enough events were folded since
  the last one (SnapshotPolicy), so recovery time is bounded by the snapshot
  interval, and retention may delete the log before the latest snapshot.
  A snapshot that cannot be read (a garbage manifest, a missing or altered
  chunk, a state that does not decode) is skipped for the one before it, then
  the store, then the log.

No silent failure (docs/topics.md, "Progress"): every record handled ends with
each of its events folded or dead-lettered. A dead letter that cannot carry the
rejected bytes (an event nested too deep to encode) carries a reference to its
origin instead, and one that cannot be built at all a minimal reference. What
still prevents progress (an exception outside the per-event rules, a store that
fails STORE_WRITE_ATTEMPTS writes in a row) raises Stalled: the partition stops
counting and the process exits with its own code (streams.pipeline.app).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import Counter, Gauge, Histogram

from engine import flows, projection
from engine.config import Config
from fold.controller import BadEvent, Controller, Decide
from schemas import chain, records
from schemas.records import DecisionRecord
from streams.common import logs
from streams.kafka import deadletter, topics
from streams.kafka.deadletter import Origin
from streams.pipeline import metrics, snapshot
from streams.pipeline import outbox as outbox_mod
from streams.pipeline.faults import Faults
from streams.pipeline.outbox import Fenced, Outbox, Outgoing, SendFailed
from streams.pipeline.snapshot import Manifest, Reader
from streams.pipeline.store import Store, Unmigratable

log = logging.getLogger("preemptctl.worker")

EVENTS = Counter("preemptctl_worker_events_total", "Cluster events folded.")
RECORDS = Counter("preemptctl_worker_records_total", "cluster-events records processed.")
RECORD_SECONDS = Histogram(
    "preemptctl_worker_record_seconds",
    "Time to fold one cluster-events record, decide and checkpoint.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
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
OPEN_SECONDS = Histogram(
    "preemptctl_worker_open_seconds",
    "Time to open a partition: state from the store or a snapshot, and the published decisions after it.",
    buckets=(0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
LOG_GAPS = Counter(
    "preemptctl_worker_log_gaps_total",
    "Partitions opened with events missing between their state and the log start (retention).",
)
DIVERGENT = Counter(
    "preemptctl_worker_divergent_decisions_total",
    "Re-derived decisions whose bytes differ from the published record with the same id.",
)
UNREADABLE_SNAPSHOTS = Counter(
    "preemptctl_worker_unreadable_snapshots_total",
    "Snapshots skipped while opening a partition because they could not be read (the one before, "
    "the store or the log was used instead).",
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


class StoreUnavailable(RuntimeError):
    """The partition's local store cannot be opened, migrated or rebuilt (a full or read-only
    volume, a broken RocksDB directory). Tried like any failure to open; after the last try the
    process exits with its own code (streams.pipeline.app.EXIT_STORE): a restart finds the same
    disk, and the supervisor's alert must say so rather than "the broker away"."""

    def __init__(self, partition: int, path: Path, exc: BaseException) -> None:
        super().__init__(f"partition {partition}: the store at {path} cannot be opened: {_error(exc)}")
        self.partition = partition


@dataclass(frozen=True)
class SnapshotPolicy:
    """When a snapshot is written: recovery replays at most the events folded since the last one."""

    # Small clusters: at most this many events between snapshots (~4 s of replay).
    min_events: int = 100_000
    # Large clusters: a snapshot per this many events per object held, so replaying the
    # log after a snapshot costs about as much as loading the snapshot itself.
    events_per_object: float = 1.0


@dataclass(frozen=True)
class Setup:
    """What every partition of one worker process shares."""

    config: Config
    key: bytes | None
    store_dir: Path
    # A fresh reader of single partitions (read_committed under exactly_once).
    reader: Callable[[], AbstractAsyncContextManager[Reader]]
    # The outbox for a partition; under exactly_once creating it fences the previous owner.
    outbox: Callable[[int], Awaitable[Outbox]]
    faults: Faults = field(default_factory=Faults)
    decide: Decide = flows.decide
    snapshots: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    # The id of `key`, sent with each decision (streams.common.signing.KEY_ID_HEADER).
    key_id: str | None = None
    # The topics' names (--topic-prefix).
    names: topics.Names = topics.DEFAULT_NAMES
    # The install `key` signs for (--install-id, default the topic prefix: schemas.chain), as the
    # actuators of this install verify (streams.common.signing.Keyring).
    install: str = chain.DEFAULT_INSTALL
    # Why Kafka does not answer, or None when it does (None here: always). A partition that
    # cannot open while Kafka is away waits for it instead of using up its reopen attempts.
    unreachable: Callable[[], Awaitable[str | None]] | None = None


def fingerprint(key: bytes | None, value: bytes) -> str:
    """Identifies a record of one topic incarnation: another topic's record at that offset differs."""
    return hashlib.blake2b((key or b"") + b"\0" + value, digest_size=16).hexdigest()


def incarnation_of(offset: int, key: bytes | None, value: bytes) -> str:
    """The cluster-events incarnation a fold from `offset` (its first record) belongs to.

    Deterministic: every worker that folds this log from its start (after a crash, on another
    node) names it the same, so its decisions are recognised as published; a re-created topic's
    first record differs (a relist carries its own times), so the old log's decisions are not.
    """
    return f"{offset}-{fingerprint(key, value)}"


class Published:
    """Decisions found in the decisions topic after the state's commit: not sent again.

    Each is kept with the cluster-events incarnation it was folded from (the decision's
    outbox.INCARNATION_HEADER; None for a record of a worker before that header). A decision
    of another incarnation (the topic re-created: a relist folded from scratch reproduces the
    old ids with new bytes) is not this log's: the new one is sent, and is not divergent.
    """

    def __init__(self) -> None:
        self._hashes: dict[str, tuple[str, str | None]] = {}

    def add(self, value: bytes, headers: Iterable[tuple[str, bytes]] = ()) -> None:
        incarnation = next(
            (v.decode("utf-8", "replace") for k, v in headers if k == outbox_mod.INCARNATION_HEADER), None
        )
        try:
            d = orjson.loads(value)
            self._hashes[str(d["id"])] = (str(d["hash"]), incarnation)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return  # not a decision record: nothing of ours

    def __len__(self) -> int:
        return len(self._hashes)

    def seen(self, d: Mapping[str, Any], incarnation: str | None = None) -> bool:
        """Was `d` published already, from the log of `incarnation` (None: any)?"""
        found = self._hashes.pop(str(d["id"]), None)
        if found is None:
            return False
        published, of = found
        if of is not None and incarnation is not None and of != incarnation:
            log.info(
                "decision %s was published from another cluster-events incarnation (%s, not %s): "
                "the topic was re-created; sending this log's",
                d["id"],
                of,
                incarnation,
            )
            return False
        if published != d["hash"]:
            # Determinism is the contract (docs/architecture.md §2): say so loudly, keep the published one.
            DIVERGENT.inc()
            log.error(
                "re-derived decision %s differs from the published record (hash %s, not %s)",
                d["id"],
                d["hash"],
                published,
            )
        return True


@dataclass
class PartitionWorker:
    partition: int
    setup: Setup
    store: Store
    outbox: Outbox
    controllers: dict[str, Controller] = field(default_factory=dict)
    position: int = -1  # the last cluster-events offset folded (in memory)
    committed: int = -1  # the last offset whose outputs are published
    stored: int = -1  # the last offset the store reflects
    decisions_next: int | None = None  # decisions offset after the last decision published
    # The cluster-events incarnation folded (incarnation_of its first record), in every decision's
    # header and in the state; None until the first record of a fold from scratch.
    incarnation: str | None = None
    manifest: Manifest | None = None  # the latest snapshot of this partition
    since_snapshot: int = 0  # events folded since it
    published: Published = field(default_factory=Published)
    broken: str | None = None  # why the worker stopped counting (a failed send or commit)
    fenced: bool = False  # ... because another worker took the partition over
    events: int = 0
    decisions_sent: int = 0
    dead_letters: int = 0
    _fingerprint: str = ""  # of the record at `committed`
    _last: tuple[bytes | None, bytes] | None = None  # the record at `position`
    _sent: list[Outgoing] = field(default_factory=list)  # since the last commit
    # The decisions among them, with when their record was taken up (the latency metric).
    _decided: list[tuple[float, DecisionRecord]] = field(default_factory=list)
    _last_commit: float = 0.0
    _closed: bool = False
    _store_failures: int = 0  # store writes failed in a row
    _stored_at: float = 0.0  # when the store was last written (monotonic)
    _store_seconds: float = 0.0  # how long that write took
    # process() and commit() each run whole: a commit must not interleave with a record
    # being folded and queued (the owner's timer commits while the transport may feed).
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Cluster -> the store keys changed since the store was last written (each Ready's dirty).
    unstored: dict[str, dict[str, bytes | None]] = field(default_factory=dict)

    # ---- opening ---------------------------------------------------------------------------

    @classmethod
    async def open(cls, *, partition: int, setup: Setup) -> PartitionWorker:
        """The partition's state from the newer of its store and its latest snapshot; not caught up yet."""
        started = time.perf_counter()
        outbox = await setup.outbox(partition)  # under exactly_once: fences the previous owner first
        try:
            async with setup.reader() as reader:
                worker = await cls._load(partition, setup, outbox, reader)
        except BaseException:
            await outbox.close()
            raise
        OPEN_SECONDS.observe(time.perf_counter() - started)
        log.info(
            "partition %d: opened at offset %d (%d clusters, %d published decisions after it) in %.2fs",
            partition,
            worker.position,
            len(worker.controllers),
            len(worker.published),
            time.perf_counter() - started,
        )
        return worker

    @classmethod
    async def _load(cls, partition: int, setup: Setup, outbox: Outbox, reader: Reader) -> PartitionWorker:
        path = setup.store_dir / f"cluster-events-{partition}"
        start, end = await reader.bounds(setup.names.cluster_events, partition)

        def opened(make: Callable[[], Store]) -> Store:
            """`make()`; a store that cannot be opened or written is StoreUnavailable."""
            try:
                return make()
            except (Unmigratable, snapshot.Unreadable):
                raise  # the store or snapshot's content, not the disk: handled below
            except Exception as exc:  # OSError from the directory, RocksDB's own errors
                raise StoreUnavailable(partition, path, exc) from exc

        store = opened(lambda: Store(path, faults=setup.faults))
        try:
            try:
                store = opened(store.migrated)
            except Unmigratable as exc:
                log.warning(
                    "partition %d: the local store is dropped, rebuilt from a snapshot or the log: %s",
                    partition,
                    exc,
                )
                store.close()
                Store.destroy(path)
                store = opened(lambda: Store(path, faults=setup.faults))
            state = store.state()
            if state is not None and not await _belongs(reader, setup.names, partition, state, start, end):
                log.warning(
                    "partition %d: the local store is of another cluster-events topic: dropped", partition
                )
                store.close()
                Store.destroy(path)
                store, state = opened(lambda: Store(path, faults=setup.faults)), None
            local = int(state["position"]) if state is not None else -1
            latest = await snapshot.latest(reader, partition, topic=setup.names.snapshots)
            manifest = latest if latest is not None and latest.position <= local else None
            for candidate in (latest, latest.previous) if manifest is None and latest is not None else ():
                if candidate is None or candidate.position <= local:
                    break
                try:
                    loaded, entries = await snapshot.load(reader, candidate, topic=setup.names.snapshots)
                    if not await _belongs(reader, setup.names, partition, loaded, start, end):
                        log.warning(
                            "partition %d: the snapshot at %d is of another topic",
                            partition,
                            candidate.position,
                        )
                        continue
                    log.info(
                        "partition %d: loading the snapshot at %d (store at %d)",
                        partition,
                        candidate.position,
                        local,
                    )
                    store.close()
                    try:
                        store = opened(lambda: Store.replace(path, loaded, entries))  # noqa: B023
                    except BaseException:
                        # As it was: replace builds beside it.
                        store = opened(lambda: Store(path, faults=setup.faults))
                        raise
                except (snapshot.Unreadable, Unmigratable) as exc:
                    UNREADABLE_SNAPSHOTS.inc()
                    log.warning(
                        "partition %d: skipping the snapshot at %d: %s", partition, candidate.position, exc
                    )
                    continue
                state, manifest = loaded, candidate
                break
            worker = cls(partition, setup, store, outbox, manifest=manifest)
            if state is not None:
                worker._restore(state)
            if worker.position + 1 < start:
                LOG_GAPS.inc()
                log.error(
                    "partition %d: the state ends at %d but the log starts at %d: the events between are "
                    "gone (retention ran ahead of snapshots); folding on from the log start",
                    partition,
                    worker.position,
                    start,
                )
                worker.position = worker.committed = start - 1
            await worker._read_published(reader)
        except BaseException:
            store.close()
            raise
        return worker

    def _restore(self, state: Mapping[str, Any]) -> None:
        for name, cstate in sorted(state.get("clusters", {}).items()):
            self.controllers[name] = Controller.restore(
                config=self.setup.config,
                key=self.setup.key,
                state=cstate,
                objects_raw=list(self.store.objects(name)),
                decide=self.setup.decide,
                install=self.setup.install,
            )
        self.position = self.committed = self.stored = int(state["position"])
        self._fingerprint = str(state.get("fingerprint", ""))
        # A state written before incarnations were recorded: named after its own position's record,
        # so what this worker publishes from now on is told from another incarnation's.
        incarnation = state.get("incarnation")
        if incarnation is None and self._fingerprint and self.position >= 0:
            incarnation = f"{self.position}-{self._fingerprint}"
        self.incarnation = None if incarnation is None else str(incarnation)
        next_offset = state.get("decisionsNext")
        self.decisions_next = None if next_offset is None else int(next_offset)
        at_snapshot = self.manifest is not None and self.manifest.position == self.position
        self.since_snapshot = 0 if at_snapshot else int(state.get("sinceSnapshot", 0))

    async def _read_published(self, reader: Reader) -> None:
        """The decisions published after the state's commit (by this worker before it stopped, or another)."""
        start, end = await reader.bounds(self.setup.names.decisions, self.partition)
        first = start if self.decisions_next is None else self.decisions_next
        if first > end:
            log.warning(
                "partition %d: the decisions topic ends at %d, before the state's %d: it was recreated",
                self.partition,
                end,
                first,
            )
            return
        async for m in reader.read(self.setup.names.decisions, self.partition, max(first, start), end):
            self.published.add(m.value, m.headers)

    async def same_log(self) -> bool:
        """Is cluster-events still the topic this worker folded (not deleted and re-created since)?"""
        state = {"position": self.committed, "fingerprint": self._fingerprint}
        async with self.setup.reader() as reader:
            start, end = await reader.bounds(self.setup.names.cluster_events, self.partition)
            return await _belongs(reader, self.setup.names, self.partition, state, start, end)

    @property
    def resume_offset(self) -> int:
        return self.position + 1

    async def catch_up(self, until: int | None = None) -> None:
        """Fold the log after the state up to `until` (None: its end as it is now), then commit."""
        async with self.setup.reader() as reader:
            if until is None:
                # The end when catching up starts: a live log never goes quiet, and the
                # transport feeds what comes after.
                until = (await reader.bounds(self.setup.names.cluster_events, self.partition))[1]
            async for m in reader.read(
                self.setup.names.cluster_events, self.partition, self.position + 1, until
            ):
                await self.process(m.offset, m.key, m.value, m.headers)
        await self.commit()

    # ---- folding ---------------------------------------------------------------------------

    def _controller(self, name: str) -> Controller:
        ctl = self.controllers.get(name)
        if ctl is None:
            ctl = self.controllers[name] = Controller(
                name, self.setup.config, self.setup.key, self.setup.decide, install=self.setup.install
            )
        return ctl

    async def process(
        self, offset: int, key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes]] = ()
    ) -> None:
        """Fold one record and queue what it leads to; commit when one is due.

        Every event ends folded or dead-lettered; Stalled when neither can be done. The
        record's objects are folded as its projection (engine.projection) unless its headers
        declare them projected already (the source's do): a writer that sends whole objects
        leaves nothing the engine does not read in the store or the snapshots.
        """
        async with self._lock:
            if self.broken is not None:
                raise PartitionBroken(self.broken)
            if offset <= self.position:
                return  # already folded (re-delivery after a restart or a reopen)
            started = time.perf_counter()
            value = b"" if value is None else value  # a tombstone: dead-lettered as no value
            if self.incarnation is None:  # the first record of a fold from scratch names the log
                self.incarnation = incarnation_of(offset, key, value)
            try:
                out = self._fold(offset, key, value, not projection.declared(headers))
            except Exception as exc:
                # Outside every per-event rule: the controllers may be half-way through the
                # record. Nothing of it may be committed, and reopening would stop here again.
                raise self._stall(
                    f"offset {offset} could not be folded or dead-lettered: {_error(exc)}"
                ) from exc
            for record in out:
                await self._send(record)
            self.position = offset
            self._last = (key, value)
            RECORDS.inc()
            if offset - self.committed >= CHECKPOINT_MAX_RECORDS or self.commit_due():
                await self._commit()
            RECORD_SECONDS.observe(time.perf_counter() - started)

    def commit_due(self) -> bool:
        """Is there something to commit, and was the last commit CHECKPOINT_INTERVAL_S ago?"""
        pending = self.position != self.committed or self.stored != self.committed
        return pending and time.monotonic() - self._last_commit >= CHECKPOINT_INTERVAL_S

    def _fold(self, offset: int, key: bytes | None, value: bytes, project: bool = True) -> list[Outgoing]:
        started = time.perf_counter()
        origin = Origin(self.setup.names.cluster_events, self.partition, offset)
        try:
            batch = records.decode_envelope(value)
        except records.DecodeError as exc:
            return [self._dead(key, value, origin, "DecodeError", str(exc))]
        problem = records.key_problem(key, batch)
        if problem:
            return [self._dead(key, value, origin, "KeyMismatch", problem)]
        ctl = self._controller(batch["cluster"])
        out: list[Outgoing] = []
        for i, event in enumerate(batch["events"]):
            try:
                ready = ctl.step(event, project=project)
            except BadEvent as exc:
                where = dataclasses.replace(origin, index=i)
                out.append(self._dead(key, _encoded(event), where, exc.error_class, str(exc)))
                continue
            if ready.dirty:
                self.unstored.setdefault(ctl.cluster_name, {}).update(ready.dirty)
            for decided in ready.decisions:
                d = decided.record
                if not self.published.seen(d, self.incarnation):
                    out.append(
                        outbox_mod.decision(
                            d,
                            partition=self.partition,
                            encoded=decided.encoded,
                            key_id=self.setup.key_id,
                            topic=self.setup.names.decisions,
                            incarnation=self.incarnation,
                        )
                    )
                    self._decided.append((started, d))
        n = len(batch["events"])
        self.events += n
        self.since_snapshot += n
        EVENTS.inc(n)
        if n and isinstance(batch["events"][-1], dict):  # anything else was dead-lettered
            metrics.folded(self.partition, batch["events"][-1].get("ts"))
        metrics.waiting(ctl.cluster_name, *ctl.waiting_summary(), now=ctl.clock)
        return out

    def _dead(
        self, key: bytes | None, value: bytes | None, origin: Origin, error_class: str, error: str
    ) -> Outgoing:
        """The dead letter of a record or an event; `value` None: the event does not encode.

        Never raises for its input: a dead letter that cannot be built as usual becomes a
        minimal reference to its origin (the origin topic keeps the bytes).
        """
        self.dead_letters += 1
        where = f"{origin.offset}" if origin.index is None else f"{origin.offset}[{origin.index}]"
        log.warning("partition %d: dead-lettered %s: %s", self.partition, where, error[:LOG_ERROR_CHARS])
        try:
            return outbox_mod.dead_letter(
                key=key,
                value=value,
                origin=origin,
                error_class=error_class,
                error=error,
                partition=self.partition,
                topic=self.setup.names.dead_letter,
            )
        except Exception as exc:
            log.error(
                "partition %d: the dead letter of %s could not be built (%s); sending a reference",
                self.partition,
                where,
                _error(exc),
            )
            return outbox_mod.dead_letter(
                key=None,
                value=None,
                origin=origin,
                error_class=error_class,
                error=f"{type(exc).__name__} while dead-lettering",
                partition=self.partition,
                topic=self.setup.names.dead_letter,
            )

    def _stall(self, reason: str) -> Stalled:
        """Stop counting (nothing after the last commit is stored) and say why."""
        self.broken = f"stalled: {reason}"
        log.critical("partition %d: stalled: %s", self.partition, reason)
        return Stalled(self.partition, reason)

    async def _send(self, record: Outgoing) -> None:
        try:
            await self.outbox.send(record)
        except SendFailed as exc:
            self._break(exc)
            raise PartitionBroken(self.broken) from exc
        self._sent.append(record)
        if record.decision:
            self.decisions_sent += 1

    def _break(self, exc: BaseException) -> None:
        SEND_FAILURES.inc()
        self.broken = f"{type(exc).__name__}: {exc}"
        self.fenced = isinstance(exc, Fenced)
        log.warning(
            "partition %d: %s; nothing after offset %d counts", self.partition, self.broken, self.committed
        )

    # ---- committing ------------------------------------------------------------------------

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
            offsets = await self.outbox.flush()
            if not self.outbox.transactional:
                # Acknowledged is published: a commit that fails after this must not lose
                # the count (a reopened worker finds these decisions published, sends none).
                self._count_published()
            await self.outbox.commit()
        except SendFailed as exc:
            self._break(exc)
            raise PartitionBroken(self.broken) from exc
        if self.outbox.transactional:
            self._count_published()  # visible to read_committed consumers from now on
        sent, self._sent = self._sent, []
        decided = outbox_mod.sent_offsets(sent, offsets, self.setup.names.decisions)
        if decided:
            self.decisions_next = max(decided) + 1
        self.committed = self.position
        if self._last is not None:
            self._fingerprint = fingerprint(*self._last)
        if not self._store_due(final):
            return  # published; the store follows at a later commit (the state stays dirty)
        self._write_store()
        if self._snapshot_due():
            await self._snapshot()

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
                    f"{self._store_failures} store writes failed in a row, the last: {_error(exc)}"
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

    # ---- snapshots -------------------------------------------------------------------------

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

    # ---- closing ---------------------------------------------------------------------------

    async def close(self, *, commit: bool = True) -> None:
        """Commit (unless broken or told not to) and release the store and the outbox; once."""
        if self._closed:
            return
        self._closed = True
        try:
            if commit and self.broken is None:
                await self.commit(final=True)
        finally:
            if self.broken is not None or not commit:
                with contextlib.suppress(SendFailed):
                    await self.outbox.abort()
            with contextlib.suppress(SendFailed):
                await self.outbox.close()
            self.store.close()


def _error(exc: BaseException) -> str:
    """An exception for a log line or a reason: its class and the start of its message."""
    return f"{type(exc).__name__}: {str(exc)[:LOG_ERROR_CHARS]}"


def _encoded(event: Any) -> bytes | None:
    """A rejected event's bytes for its dead letter; None when it does not encode (nested too deep)."""
    try:
        return orjson.dumps(event)
    except orjson.JSONEncodeError:
        return None


async def _belongs(
    reader: Reader, names: topics.Names, partition: int, state: Mapping[str, Any], start: int, end: int
) -> bool:
    """Does a state's position belong to the cluster-events topic as it is now (not a recreated one)?"""
    position = int(state.get("position", -1))
    if position < 0:
        return True
    if position >= end:
        return False  # the topic ends before the state's position: another topic
    expected = state.get("fingerprint")
    if position < start or not expected:
        return True  # the record is gone (retention) or was never recorded: nothing to compare
    record = await reader.at(names.cluster_events, partition, position)
    return record is not None and fingerprint(record.key, record.value) == expected


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
