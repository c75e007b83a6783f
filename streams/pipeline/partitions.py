"""The partitions one worker process owns: opened in the background, fed, reopened after a failure.

`Partitions` is what the transport (the faust app, streams.pipeline.app) drives:
- `assign` starts opening each new partition in its own task, outside the
  rebalance callback: state from the store or a snapshot, the decisions
  published after it, then the log folded to its end. The process is ready
  (`/readyz`) once every assigned partition is open and caught up.
- `handle` folds one record of an open partition (waiting for it to be open);
  records at or below its position are skipped, and a gap before the record is
  read from the log first.
- A failed send or commit (PartitionBroken) reopens the partition from its
  store, which re-derives the same decisions and publishes what is missing;
  after REOPEN_ATTEMPTS failures in a row while Kafka answers (while it does not, it
  waits, unready, as long as it takes), or when another worker has fenced
  this one (it owns the partition now), `on_fatal` ends the process for its
  supervisor to restart. Exiting is always safe: the store never reflects a
  record whose output is not in the log.
- `tick`, on a timer, commits each partition when a commit is due, so a
  partition whose records stopped still publishes (under exactly_once its
  decisions become visible only at a commit).
- `revoke` commits and keeps the workers aside, with the ends of the partition's
  output topics (decisions, snapshots) as they were after that
  commit. When the next assignment gives a partition back (faust revokes
  everything on each rebalance), it continues in memory only if those ends are
  unchanged: nobody published for the partition since. Otherwise another worker
  owned it meanwhile (this one was paused, or away from the group), and its
  in-memory position is stale: it is reopened from its store, which reads what
  the other one published (issue 19: 89 of 254 decisions were published twice).
- `owners_seen`, every OWNERSHIP_CHECK_INTERVAL_S, takes the partitions of
  cluster-events that exist but no member of the group holds (streams.kafka.
  ownership): while there are any the process is not ready and exports
  preemptctl_worker_unowned_partitions; after UNOWNED_GRACE_S it exits
  (EXIT_STALLED) so that its restart subscribes afresh (a topic deleted and
  re-created under the group left every worker with nothing, looking healthy).
- A partition that cannot make progress (Stalled: a record that can be neither
  folded nor dead-lettered, a store that cannot be written) stops the process
  with its own exit code (streams.pipeline.app.EXIT_STALLED), counted in
  preemptctl_worker_stalls_total.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from aiokafka.errors import KafkaError
from prometheus_client import Counter, Gauge

from schemas import records
from streams.common.health import Health
from streams.kafka import topics
from streams.kafka.connection import BrokerUnavailable
from streams.pipeline import metrics, recovery
from streams.pipeline.checkpoint import POSITION, PartitionBroken, Stalled
from streams.pipeline.outbox import Fenced, TransactionsUnavailable
from streams.pipeline.pauses import Pauses
from streams.pipeline.recovery import StoreUnavailable
from streams.pipeline.setup import Setup
from streams.pipeline.worker import PartitionWorker

log = logging.getLogger("preemptctl.worker")

# Opening a partition again after a failed send: this many tries, waiting REOPEN_BACKOFF_S,
# doubled each time up to REOPEN_BACKOFF_MAX_S (~1 min in all, long enough for a leader
# election), then the process exits and its supervisor restarts it. While Kafka itself does not
# answer (Setup.unreachable), tries do not count: the worker waits, unready, as long as it takes,
# since a restart could only wait the same way (streams.pipeline.app.wait_for_kafka).
REOPEN_ATTEMPTS = 6
REOPEN_BACKOFF_S = 1.0
REOPEN_BACKOFF_MAX_S = 16.0
# What a partition's worker publishes to and may read: if either moved while the worker was
# revoked, someone else owned the partition meanwhile. Not the dead letters: a worker may
# only write those (its ACLs), and one dead-lettered twice is what at least once allows.
OUTPUTS = (records.DECISIONS, topics.SNAPSHOTS)

# After a pause the worker closes its partitions and waits for the rebalance that gives them
# back; if none has come within this many session timeouts, the broker kept its membership
# (it never expired the session) and the partitions are reopened from their stores.
REGAIN_AFTER_SESSIONS = 2
# How long a partition may exist with no owner in the group before this process exits to
# re-subscribe: a rebalance (session timeout, join, sync) takes a few session timeouts at most.
UNOWNED_GRACE_S = 60.0

UNOWNED = Gauge(
    "preemptctl_worker_unowned_partitions",
    "cluster-events partitions that exist but no member of the worker's group owns (the group as "
    "the broker describes it).",
)
STALLS = Counter(
    "preemptctl_worker_stalls_total",
    "Partitions that could not make progress (the process exits with code 4 right after).",
)
STORE_UNAVAILABLE = Counter(
    "preemptctl_worker_store_unavailable_total",
    "Partitions whose local store could not be opened through every try (the process exits with "
    "code 5 right after).",
)
RESUMED = Counter(
    "preemptctl_worker_resumed_total",
    "Partitions given back after a revoke, by what happened: continued in memory (nothing was "
    "published for them meanwhile) or reopened from the store (someone else published).",
    ["how"],
)


# Every way a Kafka client of the worker fails (one rule, docs/topics.md "Progress"): a request
# refused or timed out (KafkaError, TimeoutError), a connection that breaks (OSError, ssl.SSLError),
# a client that cannot start, since new connections are refused (BrokerUnavailable: a rotated
# SASL password, a connection quota, a certificate that no longer verifies, DNS). None of them
# may escape a timer, a rebalance callback or the agent: they make the process unready and
# are tried again, or lead to a documented exit code.
KAFKA_FAILURES: tuple[type[BaseException], ...] = (KafkaError, OSError, BrokerUnavailable)


class Fatal(RuntimeError):
    """This process must stop: fenced by another worker, or a partition cannot be opened."""


class Partitions:
    def __init__(
        self,
        setup: Setup,
        *,
        health: Health | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        session_timeout_s: float | None = None,
        pauses: Pauses | None = None,
        unowned_grace_s: float = UNOWNED_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.setup = setup
        self.health = health
        self.on_fatal = on_fatal
        # A process that did not run for this long (paused, swapped out) has lost its group
        # membership: the broker gave its partitions away. None: never assume so.
        self.session_timeout_s = session_timeout_s
        # Tells a stopped process from a busy event loop (whose membership faust's consumer
        # thread kept); None: every long gap counts as a stop.
        self._pauses = pauses
        self.unowned_grace_s = unowned_grace_s
        self._clock = clock
        self._alive = clock()  # when this process last ran (the commit timer ticks every 0.2 s)
        self.workers: dict[int, PartitionWorker] = {}
        self.opening: dict[int, asyncio.Task[PartitionWorker | None]] = {}
        # Revoked workers kept aside, with the ends of OUTPUTS after their last commit.
        self.suspended: dict[int, tuple[PartitionWorker, tuple[int, ...]]] = {}
        self.assigned = False
        self.unowned: set[int] = set()
        # Why Kafka did not answer the last ownership check (None: it did): not ready meanwhile.
        self.kafka_away: str | None = None
        self._unowned_since: float | None = None
        # assign and revoke each run whole: a revoke still committing a worker (or reading its
        # output ends) must be done before an assignment opens the partition again, or two
        # workers hold one store (RocksDB refuses the second).
        self._membership = asyncio.Lock()
        # After a pause: (when, partitions) to reopen if no rebalance has come by then.
        self._regain: tuple[float, list[int]] | None = None

    # ---- the transport's calls -------------------------------------------------------------

    async def assign(self, partitions: Iterable[int]) -> None:
        self._regain = None  # the group spoke: what it assigns is ours
        async with self._membership:
            await self._assign(partitions)

    async def _assign(self, partitions: Iterable[int]) -> None:
        wanted = set(partitions)
        for p in sorted(set(self.suspended) - wanted):
            await self._close(self.suspended.pop(p)[0])
        for p in sorted(wanted):
            if p in self.workers or p in self.opening:
                continue
            kept = self.suspended.pop(p, None)
            self.opening[p] = asyncio.create_task(self._open(p, kept), name=f"open-partition-{p}")
        self.assigned = True
        self._update_ready()

    async def revoke(self, partitions: Iterable[int]) -> None:
        """Commit and keep the workers aside for a later `assign`; closed instead after a pause."""
        keep = not self._asleep()
        async with self._membership:
            await self._revoke(partitions, keep=keep)

    async def _revoke(self, partitions: Iterable[int], *, keep: bool = True) -> None:
        for p in sorted(set(partitions)):
            metrics.forget(p)
            with contextlib.suppress(KeyError):
                POSITION.remove(str(p))
            task = self.opening.pop(p, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    opened = await task
                    if opened is not None:
                        await self._close(opened)
            worker = self.workers.pop(p, None)
            if worker is None:
                continue
            try:
                await worker.commit(final=True)
            except PartitionBroken:
                await self._discard(worker)
                if worker.fenced:
                    self._fatal(Fatal(str(worker.broken)))
                continue
            except Stalled as exc:
                await self._discard(worker)
                self._stalled(exc)
                continue
            if not keep:
                await self._close(worker)
                continue
            try:
                ends = await self._output_ends(p)
            except KAFKA_FAILURES as exc:
                log.warning("partition %d: revoked; its output ends are unknown (%s): closed", p, exc)
                await self._close(worker)
                continue
            self.suspended[p] = (worker, ends)
        self._update_ready()

    async def check_logs(self) -> bool:
        """Reopen each open partition whose cluster-events log is not the one it folded (re-created
        under it: its position means nothing there); called with the ownership check.

        False when Kafka refused a new connection (BrokerUnavailable: a rotated password, a
        quota, ...): then the process is not ready (`kafka_unanswered`) until a later check
        gets through. A request that fails is only tried again at the next check.
        """
        for partition, worker in sorted(self.workers.items()):
            try:
                same = await recovery.same_log(worker)
            except BrokerUnavailable as exc:
                self.kafka_unanswered(str(exc))
                return False
            except KAFKA_FAILURES as exc:
                log.warning("partition %d: could not check its log (%s); again later", partition, exc)
                continue
            if not same and self.workers.get(partition) is worker:
                log.error("partition %d: cluster-events was re-created under it: reopening", partition)
                await self._reopen(partition)
        return True

    async def _output_ends(self, partition: int) -> tuple[int, ...]:
        async with self.setup.reader() as reader:
            outputs = (self.setup.names.decisions, self.setup.names.snapshots)  # OUTPUTS, by their names
            return tuple([(await reader.bounds(topic, partition))[1] for topic in outputs])

    def _asleep(self) -> bool:
        """Did this process just resume after not running for a session timeout (paused)?

        Then its group membership is gone: the group gave its partitions to another worker,
        which may have published for them. The output ends a revoke reads now would already
        include that, so nothing of what it holds may be kept in memory.
        """
        now = self._clock()
        since, self._alive = self._alive, now
        asleep = now - since
        if self.session_timeout_s is None or asleep < self.session_timeout_s:
            return False
        if self._pauses is not None and not self._pauses.stopped(since, at_least=self.session_timeout_s):
            log.info("the event loop was busy for %.1fs; the process kept running", asleep)
            return False
        log.warning(
            "this process did not run for %.1fs (over the %.0fs session timeout): its partitions "
            "%s are closed, reopened from their stores when the group assigns them again",
            asleep,
            self.session_timeout_s,
            sorted({*self.workers, *self.opening}),
        )
        return True

    async def _woke_up(self) -> bool:
        """Before a record or a commit: after a pause, close every partition until the next assignment.

        Its consumer still believes in its assignment and would hand over records the group
        has since given to another worker: folding them would publish that worker's decisions
        again (at_least_once has no fencing). The rebalance that follows gives back what is
        ours, reopened from the store (which reads what the other worker published).
        """
        if not self._asleep():
            return False
        held = sorted({*self.workers, *self.opening})
        self.assigned = False  # not ready until the group assigns again
        async with self._membership:
            await self._revoke(held, keep=False)
        # The broker may have kept the membership after all (its own clock, a lenient broker):
        # then no rebalance comes, and these must not stay closed (a silent stall).
        assert self.session_timeout_s is not None
        self._regain = (self._clock() + REGAIN_AFTER_SESSIONS * self.session_timeout_s, held)
        return True

    async def _regained(self) -> None:
        """After a pause no rebalance came in time: the group kept us; reopen what we held."""
        if self._regain is None or self._clock() < self._regain[0]:
            return
        held = self._regain[1]
        log.warning(
            "no rebalance came after the pause: the group kept this worker; reopening partitions %s "
            "from their stores",
            held,
        )
        await self.assign(held)

    def position(self, partition: int) -> int | None:
        """The last offset folded in `partition`; None while it is not open here."""
        worker = self.workers.get(partition)
        return None if worker is None else worker.position

    async def handle(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> None:
        """Fold one record of an assigned partition (records of others are ignored)."""
        if await self._woke_up():
            return  # its partitions are suspended until the group gives them back
        worker = await self._worker(partition)
        if worker is None:
            return
        try:
            if offset > worker.position + 1:
                # The transport starts where the group last committed, which can be past the
                # state (a lost store): read the gap from the log first.
                try:
                    await recovery.catch_up(worker, until=offset)
                except KAFKA_FAILURES as exc:
                    # The gap could not be read (a new reader refused, a fetch failed): what was
                    # folded of it is dropped, and reopening (which waits, unready, while Kafka
                    # does not answer) catches up past this record.
                    log.warning("partition %d: reading the log before %d failed (%s)", partition, offset, exc)
                    worker.broken = f"{type(exc).__name__}: {exc}"
                    raise PartitionBroken(worker.broken) from exc
                if worker.position < offset - 1:
                    log.error(
                        "partition %d: offsets %d..%d are gone from the log; folding on at %d",
                        partition,
                        worker.position + 1,
                        offset - 1,
                        offset,
                    )
                    worker.position = offset - 1
            await worker.process(offset, key, value, headers)
        except PartitionBroken:
            await self._reopen(partition)  # catches up past this record, publishing what is missing
        except Stalled as exc:
            await self._stop(partition, worker, exc)

    async def tick(self) -> None:
        """Commit what is due (streams.pipeline.checkpoint.CHECKPOINT_INTERVAL_S): called on a timer."""
        if await self._woke_up():
            return
        await self._regained()
        for partition, worker in sorted(self.workers.items()):
            if not worker.commit_due():
                continue
            try:
                await worker.commit()
            except PartitionBroken:
                if self.workers.get(partition) is worker:
                    await self._reopen(partition)
            except Stalled as exc:
                await self._stop(partition, worker, exc)

    async def _stop(self, partition: int, worker: PartitionWorker, exc: Stalled) -> None:
        if self.workers.get(partition) is worker:
            del self.workers[partition]
        await self._discard(worker)
        self._stalled(exc)

    def _stalled(self, exc: Stalled) -> None:
        STALLS.inc()
        self._fatal(exc)

    async def close(self) -> None:
        for p in list(self.opening):
            await self.revoke([p])
        await self.revoke(list(self.workers))
        for p in sorted(self.suspended):
            await self._close(self.suspended.pop(p)[0])

    # ---- opening ---------------------------------------------------------------------------

    async def _worker(self, partition: int) -> PartitionWorker | None:
        worker = self.workers.get(partition)
        if worker is not None:
            return worker
        task = self.opening.get(partition)
        if task is None:
            return None
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                return None  # revoked while opening
            raise

    async def _resumed(self, partition: int, kept: tuple[PartitionWorker, tuple[int, ...]]) -> bool:
        """Is a revoked worker still right (nobody published for its partition since)? Closed if not."""
        worker, ends = kept
        try:
            now = await self._output_ends(partition)
            same_log = await recovery.same_log(worker)
        except KAFKA_FAILURES as exc:
            now, same_log, reason = (), False, f"its output ends are unknown ({exc})"
        else:
            reason = (
                f"its outputs moved since the revoke ({ends} -> {now})"
                if same_log
                else "cluster-events is another topic now (re-created)"
            )
        if now == ends and same_log:
            RESUMED.labels("memory").inc()
            log.info("partition %d: given back, nothing published since: continuing in memory", partition)
            return True
        RESUMED.labels("store").inc()
        log.warning("partition %d: given back, but %s: reopening from the store", partition, reason)
        await self._close(worker)
        return False

    async def _open(
        self, partition: int, kept: tuple[PartitionWorker, tuple[int, ...]] | None = None
    ) -> PartitionWorker | None:
        """The partition's worker, open and caught up; None when it could not be (the process stops)."""
        try:
            return await self._opened(partition, kept)
        finally:
            if self.opening.get(partition) is asyncio.current_task():
                del self.opening[partition]  # done, whichever way: nothing waits on it any more

    async def _opened(
        self, partition: int, kept: tuple[PartitionWorker, tuple[int, ...]] | None
    ) -> PartitionWorker | None:
        if kept is not None and await self._resumed(partition, kept):
            self.workers[partition] = kept[0]
            self.opening.pop(partition, None)
            self._update_ready()
            return kept[0]
        delay = REOPEN_BACKOFF_S
        attempt = 0
        while attempt < REOPEN_ATTEMPTS:
            worker = None
            try:
                worker = await recovery.open(partition=partition, setup=self.setup)
                await recovery.catch_up(worker)
            except (Fenced, TransactionsUnavailable) as exc:
                await self._discard(worker)
                self._fatal(exc)
                return None
            except Stalled as exc:
                await self._discard(worker)
                self.opening.pop(partition, None)
                self._stalled(exc)
                return None
            except Exception as exc:  # PartitionBroken, SendFailed, KafkaError, OSError, ...
                # Anything else too (a store that would not open): retried, then the process
                # exits. Raised instead, it would crash the agent on every record, forever.
                await self._discard(worker)
                if worker is not None and worker.fenced:
                    self._fatal(Fatal(str(worker.broken)))
                    return None
                # A store that cannot be opened is not Kafka's doing: its tries always count.
                away = None if isinstance(exc, StoreUnavailable) else await self._kafka_away()
                if away is None:
                    attempt += 1
                if attempt == REOPEN_ATTEMPTS:
                    if isinstance(exc, StoreUnavailable):
                        # Its own exit code (streams.pipeline.app.EXIT_STORE): a restart finds the
                        # same disk; the supervisor's alert says so instead of "the broker away".
                        STORE_UNAVAILABLE.inc()
                        self._fatal(exc)
                    else:
                        self._fatal(Fatal(f"partition {partition} could not be opened: {exc}"))
                    return None
                if away is not None:
                    log.warning(
                        "partition %d: opening failed, Kafka does not answer (%s); again in %.0fs",
                        partition,
                        away,
                        delay,
                    )
                else:
                    log.warning(
                        "partition %d: opening failed (%s); again in %.0fs (%d/%d)",
                        partition,
                        exc,
                        delay,
                        attempt,
                        REOPEN_ATTEMPTS,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, REOPEN_BACKOFF_MAX_S)
                continue
            except BaseException:
                await self._discard(worker)
                raise
            self.workers[partition] = worker
            self.opening.pop(partition, None)
            self._update_ready()
            return worker
        return None

    async def _kafka_away(self) -> str | None:
        """Why Kafka does not answer (None: it does, or the setup cannot tell)."""
        if self.setup.unreachable is None:
            return None
        try:
            return await self.setup.unreachable()
        except Exception as exc:  # the check itself must never end the partition's task
            return f"{type(exc).__name__}: {exc}"

    async def _reopen(self, partition: int) -> None:
        worker = self.workers.pop(partition, None)
        if worker is not None:
            if worker.fenced:
                await self._discard(worker)
                self._fatal(Fatal(str(worker.broken)))
                return
            await self._discard(worker)
        log.warning("partition %d: reopening from its store", partition)
        task = self.opening[partition] = asyncio.create_task(self._open(partition))
        self._update_ready()
        await asyncio.shield(task)

    async def _discard(self, worker: PartitionWorker | None) -> None:
        """Close without committing: what it folded since its last commit does not count."""
        if worker is not None:
            with contextlib.suppress(Exception):
                await worker.close(commit=False)

    async def _close(self, worker: PartitionWorker) -> None:
        try:
            await worker.close()
        except PartitionBroken:
            await self._discard(worker)
        except Stalled as exc:
            await self._discard(worker)
            self._stalled(exc)

    def _fatal(self, exc: BaseException) -> None:
        log.critical("worker stops: %s", exc)
        if self.health is not None:
            self.health.set_ready(False)
        if self.on_fatal is not None:
            self.on_fatal(exc)
        else:
            raise Fatal(str(exc)) from exc

    def _update_ready(self) -> None:
        if self.health is not None:
            self.health.set_ready(
                self.assigned and not self.opening and not self.unowned and self.kafka_away is None
            )

    def kafka_unanswered(self, reason: str | None) -> None:
        """What the last look at Kafka found: `reason` it did not answer, None it did."""
        if (reason is None) != (self.kafka_away is None):
            log.warning("Kafka does not answer (%s): not ready", reason) if reason else log.info(
                "Kafka answers again"
            )
        self.kafka_away = reason
        self._update_ready()

    def owners_seen(self, unowned: set[int] | None, *, now: float) -> None:
        """The partitions no member of the group owns (None: the group is rebalancing), seen at `now`.

        Not ready while there are any; past UNOWNED_GRACE_S, the process stops (Stalled) for
        its restart to subscribe again.
        """
        if unowned is None:
            return  # a rebalance under way: assignments are empty by design
        self.unowned = set(unowned)
        UNOWNED.set(len(self.unowned))
        if not self.unowned:
            self._unowned_since = None
        elif self._unowned_since is None:
            self._unowned_since = now
            log.error(
                "cluster-events partitions %s exist but no worker of the group owns them",
                sorted(self.unowned),
            )
        elif now - self._unowned_since >= self.unowned_grace_s:
            first = min(self.unowned)
            self._update_ready()
            self._stalled(
                Stalled(
                    first,
                    f"partitions {sorted(self.unowned)} have had no owner in the group for "
                    f"{now - self._unowned_since:.0f}s (was the topic re-created?): re-subscribing",
                )
            )
            return
        self._update_ready()
