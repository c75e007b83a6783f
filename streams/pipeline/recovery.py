"""A partition's recovery: its worker opened from the newer of its store and latest snapshot, caught up.

The steps, in this order (`open`, then `catch_up`):

1. Outbox: the partition's outbox is created first; under exactly_once that
   fences the previous owner, so nothing it still sends can count.
2. Store: the local rocksdict store is opened and migrated to the current
   layout (dropped when it cannot be); a store whose position belongs to
   another cluster-events topic (the state records the fingerprint of the
   record at its position: a position past the end or a record that differs
   means the topic was re-created) is dropped too.
3. Snapshot: a snapshot in Kafka (streams.pipeline.snapshot) newer than the
   store replaces it, if it belongs to this topic; one that cannot be read (a
   garbage manifest, a missing or altered chunk, a state that does not decode)
   is skipped for the one before it, then the store, then the log.
4. Restore: one controller per cluster from the state and the store's objects
   (fold.controller.Controller.restore), with the position, fingerprint,
   incarnation and `decisionsNext` the state recorded.
5. Gap: a state that ends before the log's start (retention ran ahead of
   snapshots) folds on from the log start, and says so.
6. Published: the decisions written from `decisionsNext` to the end of the
   decisions topic (a bounded read: what was published after the state's
   commit) are noted, so folding them again does not send them again.
7. Catch up (`catch_up`): the log after the position is folded to its end as it
   is now, then committed (streams.pipeline.checkpoint).

Nothing reads a topic from its beginning, except a partition that has no state
at all yet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Histogram

from fold.controller import Controller
from streams.kafka import topics
from streams.pipeline import snapshot
from streams.pipeline.checkpoint import fingerprint, short_error
from streams.pipeline.outbox import Outbox
from streams.pipeline.setup import Setup
from streams.pipeline.snapshot import Reader
from streams.pipeline.store import Store, Unmigratable
from streams.pipeline.worker import PartitionWorker

log = logging.getLogger("preemptctl.worker")

OPEN_SECONDS = Histogram(
    "preemptctl_worker_open_seconds",
    "Time to open a partition: state from the store or a snapshot, and the published decisions after it.",
    buckets=(0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
LOG_GAPS = Counter(
    "preemptctl_worker_log_gaps_total",
    "Partitions opened with events missing between their state and the log start (retention).",
)
UNREADABLE_SNAPSHOTS = Counter(
    "preemptctl_worker_unreadable_snapshots_total",
    "Snapshots skipped while opening a partition because they could not be read (the one before, "
    "the store or the log was used instead).",
)


class StoreUnavailable(RuntimeError):
    """The partition's local store cannot be opened, migrated or rebuilt (a full or read-only
    volume, a broken RocksDB directory). Tried like any failure to open; after the last try the
    process exits with its own code (streams.pipeline.app.EXIT_STORE): a restart finds the same
    disk, and the supervisor's alert must say so rather than "the broker away"."""

    def __init__(self, partition: int, path: Path, exc: BaseException) -> None:
        super().__init__(f"partition {partition}: the store at {path} cannot be opened: {short_error(exc)}")
        self.partition = partition


async def open(*, partition: int, setup: Setup) -> PartitionWorker:
    """The partition's worker from the newer of its store and its latest snapshot (steps 1-6); not
    caught up yet."""
    started = time.perf_counter()
    # 1. outbox: under exactly_once, creating it fences the previous owner first.
    outbox = await setup.outbox(partition)
    try:
        async with setup.reader() as reader:
            worker = await _load(partition, setup, outbox, reader)
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


async def _load(partition: int, setup: Setup, outbox: Outbox, reader: Reader) -> PartitionWorker:
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

    store = opened(lambda: Store(path, faults=setup.faults))  # 2. store
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
        latest = await snapshot.latest(reader, partition, topic=setup.names.snapshots)  # 3. snapshot
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
        worker = PartitionWorker(partition, setup, store, outbox, manifest=manifest)
        if state is not None:
            _restore(worker, state)  # 4. restore
        if worker.position + 1 < start:  # 5. gap
            LOG_GAPS.inc()
            log.error(
                "partition %d: the state ends at %d but the log starts at %d: the events between are "
                "gone (retention ran ahead of snapshots); folding on from the log start",
                partition,
                worker.position,
                start,
            )
            worker.position = worker.committed = start - 1
        await _read_published(worker, reader)  # 6. published
    except BaseException:
        store.close()
        raise
    return worker


def _restore(worker: PartitionWorker, state: Mapping[str, Any]) -> None:
    for name, cstate in sorted(state.get("clusters", {}).items()):
        worker.controllers[name] = Controller.restore(
            config=worker.setup.config,
            key=worker.setup.key,
            state=cstate,
            objects_raw=list(worker.store.objects(name)),
            decide=worker.setup.decide,
            install=worker.setup.install,
        )
    worker.position = worker.committed = worker.stored = int(state["position"])
    worker._fingerprint = str(state.get("fingerprint", ""))
    # A state written before incarnations were recorded: named after its own position's record,
    # so what this worker publishes from now on is told from another incarnation's.
    incarnation = state.get("incarnation")
    if incarnation is None and worker._fingerprint and worker.position >= 0:
        incarnation = f"{worker.position}-{worker._fingerprint}"
    worker.incarnation = None if incarnation is None else str(incarnation)
    next_offset = state.get("decisionsNext")
    worker.decisions_next = None if next_offset is None else int(next_offset)
    at_snapshot = worker.manifest is not None and worker.manifest.position == worker.position
    worker.since_snapshot = 0 if at_snapshot else int(state.get("sinceSnapshot", 0))


async def _read_published(worker: PartitionWorker, reader: Reader) -> None:
    """The decisions published after the state's commit (by this worker before it stopped, or another)."""
    start, end = await reader.bounds(worker.setup.names.decisions, worker.partition)
    first = start if worker.decisions_next is None else worker.decisions_next
    if first > end:
        log.warning(
            "partition %d: the decisions topic ends at %d, before the state's %d: it was recreated",
            worker.partition,
            end,
            first,
        )
        return
    async for m in reader.read(worker.setup.names.decisions, worker.partition, max(first, start), end):
        worker.published.add(m.value, m.headers)


async def same_log(worker: PartitionWorker) -> bool:
    """Is cluster-events still the topic this worker folded (not deleted and re-created since)?"""
    state = {"position": worker.committed, "fingerprint": worker._fingerprint}
    async with worker.setup.reader() as reader:
        start, end = await reader.bounds(worker.setup.names.cluster_events, worker.partition)
        return await _belongs(reader, worker.setup.names, worker.partition, state, start, end)


async def catch_up(worker: PartitionWorker, until: int | None = None) -> None:
    """Fold the log after the state up to `until` (None: its end as it is now), then commit (step 7)."""
    async with worker.setup.reader() as reader:
        if until is None:
            # The end when catching up starts: a live log never goes quiet, and the
            # transport feeds what comes after.
            until = (await reader.bounds(worker.setup.names.cluster_events, worker.partition))[1]
        async for m in reader.read(
            worker.setup.names.cluster_events, worker.partition, worker.position + 1, until
        ):
            await worker.process(m.offset, m.key, m.value, m.headers)
    await worker.commit()


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
