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
- Committing (streams.pipeline.checkpoint, its steps numbered there): every
  CHECKPOINT_INTERVAL_S, at most CHECKPOINT_MAX_RECORDS records apart, the
  queued records are published (acknowledged, or the transaction committed),
  and only then the store is written (not at every commit when writing it is
  costly), then a snapshot when one is due. A failed send breaks the worker
  (PartitionBroken): nothing more is folded or stored, and the owner reopens
  the partition from its store (streams.pipeline.partitions), which re-derives
  the same decisions byte for byte.
- Opening (streams.pipeline.recovery, its steps numbered there): the newest of
  the local store and the latest snapshot in Kafka whose position belongs to
  the cluster-events topic as it is now, the decisions published after it (not
  sent again), then the log after the position folded to its end.

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
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import Counter, Histogram

from engine import projection
from fold.controller import BadEvent, Controller
from schemas import records
from schemas.records import DecisionRecord
from streams.kafka.deadletter import Origin
from streams.pipeline import checkpoint, metrics
from streams.pipeline import outbox as outbox_mod
from streams.pipeline.checkpoint import (
    LOG_ERROR_CHARS,
    Checkpoint,
    PartitionBroken,
    fingerprint,
    short_error,
)
from streams.pipeline.outbox import Outbox, Outgoing, SendFailed
from streams.pipeline.setup import Setup
from streams.pipeline.snapshot import Manifest
from streams.pipeline.store import Store

log = logging.getLogger("preemptctl.worker")

EVENTS = Counter("preemptctl_worker_events_total", "Cluster events folded.")
RECORDS = Counter("preemptctl_worker_records_total", "cluster-events records processed.")
RECORD_SECONDS = Histogram(
    "preemptctl_worker_record_seconds",
    "Time to fold one cluster-events record, decide and checkpoint.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
DIVERGENT = Counter(
    "preemptctl_worker_divergent_decisions_total",
    "Re-derived decisions whose bytes differ from the published record with the same id.",
)


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
class PartitionWorker(Checkpoint):
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

    @property
    def resume_offset(self) -> int:
        return self.position + 1

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
                    f"offset {offset} could not be folded or dead-lettered: {short_error(exc)}"
                ) from exc
            for record in out:
                await self._send(record)
            self.position = offset
            self._last = (key, value)
            RECORDS.inc()
            if offset - self.committed >= checkpoint.CHECKPOINT_MAX_RECORDS or self.commit_due():
                await self._commit()
            RECORD_SECONDS.observe(time.perf_counter() - started)

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
                short_error(exc),
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

    async def _send(self, record: Outgoing) -> None:
        try:
            await self.outbox.send(record)
        except SendFailed as exc:
            self._break(exc)
            raise PartitionBroken(self.broken) from exc
        self._sent.append(record)
        if record.decision:
            self.decisions_sent += 1

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


def _encoded(event: Any) -> bytes | None:
    """A rejected event's bytes for its dead letter; None when it does not encode (nested too deep)."""
    try:
        return orjson.dumps(event)
    except orjson.JSONEncodeError:
        return None
