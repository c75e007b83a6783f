"""The worker: a faust-streaming app that folds cluster-events into state and emits decisions.

`PartitionWorker` owns one cluster-events partition: its controllers (one per
cluster in the partition), its rocksdict store and the log position the store
reflects, and the rules that keep decisions exactly-once in effect:
- input resumes at the store's recorded position + 1 (not the group's committed
  offset), so state and input cannot drift apart (DESIGN §3);
- decisions are sent and acknowledged before the store moves past their record
  (at-least-once), and decisions already visible in the decisions topic (matched
  by sequence number and id) are not sent again, so a restart doubles none; the
  store is written every CHECKPOINT_INTERVAL_S, and a crash in between only
  means re-folding a little log;
- if the store is ahead of the visible decisions (a crash after the store write
  but before the decisions became visible, e.g. an aborted transaction), the
  store is discarded and the partition is re-derived from the start of the log:
  the replayed decisions are byte-identical, and the missing ones are sent.
Malformed records and events go to the dead-letter topic with their origin.

The faust app (streams.pipeline.app) is the thin transport around it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import Counter, Gauge, Histogram

from engine.config import Config
from schemas import records
from schemas.records import DecisionRecord
from streams.pipeline import metrics
from streams.pipeline.controller import BadEvent, Controller
from streams.pipeline.store import Store

log = logging.getLogger("preemptctl.worker")

EVENTS = Counter("preemptctl_worker_events_total", "Cluster events folded.")
RECORDS = Counter("preemptctl_worker_records_total", "cluster-events records processed.")
DECISIONS = Counter("preemptctl_worker_decisions_total", "Decision records sent.", ["outcome"])
DEAD_LETTERS = Counter(
    "preemptctl_worker_dead_letters_total", "Records or events sent to the dead-letter topic."
)
RECORD_SECONDS = Histogram(
    "preemptctl_worker_record_seconds",
    "Time to fold one cluster-events record, decide and checkpoint.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
# The store is written at most this often (and after this many records): writing
# the controller state per record would cap small records at ~1k/s. A crash loses
# nothing: input resumes after the store's position and the decisions already in
# the topic are not sent again.
CHECKPOINT_INTERVAL_S = 0.2
CHECKPOINT_MAX_RECORDS = 1000


POSITION = Gauge("preemptctl_worker_position", "The cluster-events offset the store reflects.", ["partition"])

Emit = Callable[[Sequence[DecisionRecord]], Awaitable[None]]
DeadLetter = Callable[[bytes | None, bytes, list[tuple[str, bytes]]], Awaitable[None]]


def origin_headers(
    topic: str, partition: int, offset: int, error: Exception, index: int | None = None
) -> list[tuple[str, bytes]]:
    where = str(offset) if index is None else f"{offset}"
    headers = [
        ("origin-topic", topic.encode()),
        ("origin-partition", str(partition).encode()),
        ("origin-offset", where.encode()),
        ("error-class", type(error).__name__.encode()),
        ("error", str(error)[:1000].encode()),
    ]
    if index is not None:
        headers.append(("origin-index", str(index).encode()))
    return headers


@dataclass(slots=True)
class PartitionWorker:
    partition: int
    store: Store
    config: Config
    key: bytes | None
    emit: Emit
    dead_letter: DeadLetter
    position: int = -1  # the last cluster-events offset reflected in the store
    controllers: dict[str, Controller] = field(default_factory=dict)
    # cluster -> (highest decision seq already in the topic, ids at that seq). One TICK
    # can decide for several waiting pods, so several decisions may share a seq.
    visible: dict[str, tuple[int, frozenset[str]]] = field(default_factory=dict)
    events: int = 0
    decisions_sent: int = 0
    dead_letters: int = 0
    stored: int = -1  # the position written to the store
    _last_write: float = 0.0

    @classmethod
    def open(
        cls,
        *,
        partition: int,
        path: Path,
        config: Config,
        key: bytes | None,
        emit: Emit,
        dead_letter: DeadLetter,
        visible: Mapping[str, tuple[int, frozenset[str]]],
    ) -> PartitionWorker:
        store = Store(path)
        state = store.state()
        worker = cls(partition, store, config, key, emit, dead_letter, visible=dict(visible))
        if state is not None:
            clusters = state.get("clusters", {})
            ahead = [c for c, s in clusters.items() if not _already_visible(s, visible.get(c))]
            if ahead:
                log.warning(
                    "store of partition %d is ahead of the visible decisions of %s: "
                    "re-deriving from the log start",
                    partition,
                    ", ".join(sorted(ahead)),
                )
                store.close()
                Store.destroy(path)
                return cls.open(
                    partition=partition,
                    path=path,
                    config=config,
                    key=key,
                    emit=emit,
                    dead_letter=dead_letter,
                    visible=visible,
                )
            for name, cstate in sorted(clusters.items()):
                worker.controllers[name] = Controller.restore(
                    config=config, key=key, state=cstate, objects_raw=list(store.objects(name))
                )
            worker.position = worker.stored = int(state["position"])
        return worker

    @property
    def resume_offset(self) -> int:
        return self.position + 1

    def _controller(self, name: str) -> Controller:
        ctl = self.controllers.get(name)
        if ctl is None:
            ctl = self.controllers[name] = Controller(name, self.config, self.key)
        return ctl

    async def process(self, offset: int, key: bytes | None, value: bytes) -> None:
        if offset <= self.position:
            return  # already reflected in the store (re-delivery after a restart)
        started = time.perf_counter()
        out: list[DecisionRecord] = []
        try:
            batch = records.decode_batch(value)
        except records.DecodeError as exc:
            self.dead_letters += 1
            await self.dead_letter(
                key, value, origin_headers(records.CLUSTER_EVENTS, self.partition, offset, exc)
            )
        else:
            ctl = self._controller(batch["cluster"])
            for i, event in enumerate(batch["events"]):
                try:
                    decisions = ctl.handle(event)
                except BadEvent as exc:
                    self.dead_letters += 1
                    DEAD_LETTERS.inc()
                    await self.dead_letter(
                        key,
                        orjson.dumps(event),
                        origin_headers(records.CLUSTER_EVENTS, self.partition, offset, exc, i),
                    )
                    continue
                seen_seq, seen_ids = self.visible.get(ctl.cluster_name, (-1, frozenset()))
                out.extend(
                    d
                    for d in decisions
                    if d["seq"] > seen_seq or (d["seq"] == seen_seq and d["id"] not in seen_ids)
                )
            self.events += len(batch["events"])
            EVENTS.inc(len(batch["events"]))
            if batch["events"]:
                metrics.folded(self.partition, batch["events"][-1]["ts"])  # issue 14
        if out:
            await self.emit(out)  # acknowledged before the store moves past this record
            self.decisions_sent += len(out)
            for d in out:
                DECISIONS.labels(d["outcome"]).inc()
            metrics.emitted(out, time.perf_counter() - started)  # issue 14
        self.position = offset
        now = time.monotonic()
        if now - self._last_write >= CHECKPOINT_INTERVAL_S or offset - self.stored >= CHECKPOINT_MAX_RECORDS:
            self.checkpoint()
        RECORDS.inc()
        RECORD_SECONDS.observe(time.perf_counter() - started)

    def checkpoint(self) -> None:
        """Write the state and the position it reflects, atomically."""
        if self.stored == self.position:
            return
        offset = self.position
        self._last_write = time.monotonic()
        self.stored = offset
        POSITION.labels(str(self.partition)).set(offset)
        dirty = {name: ctl.take_dirty() for name, ctl in self.controllers.items()}
        state = {
            "position": offset,
            "clusters": {name: ctl.state() for name, ctl in sorted(self.controllers.items())},
        }
        self.store.write(dirty, state)

    def close(self) -> None:
        self.checkpoint()
        self.store.close()


def _already_visible(state: Mapping[str, Any], seen: tuple[int, frozenset[str]] | None) -> bool:
    """Is the store's last decision already in the decisions topic (or did it make none)?"""
    last_seq = int(state.get("lastDecisionSeq", -1))
    if last_seq < 0:
        return True
    if seen is None or last_seq > seen[0]:
        return False
    return last_seq < seen[0] or state.get("lastDecisionId") in seen[1]


def last_visible_decisions(decisions: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, frozenset[str]]]:
    """Per cluster: the highest decision seq in the topic and the ids recorded at that seq."""
    top: dict[str, int] = {}
    ids: dict[str, set[str]] = {}
    for d in decisions:
        c, seq = str(d.get("cluster")), int(d.get("seq", -1))
        if seq > top.get(c, -1):
            top[c], ids[c] = seq, set()
        if seq == top[c]:
            ids[c].add(str(d.get("id")))
    return {c: (top[c], frozenset(ids[c])) for c in top}
