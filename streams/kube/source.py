"""The source: list+watch one Kubernetes cluster and write what it sees to preemption.cluster-events.

This module owns the cluster's event log as the API server shows it:
- what is watched (`RESOURCES`, plus ElasticQuotas while their CRD is served)
  and in which scope (`Scope`: namespaces, a pod label selector, a scheduler name);
- the log's framing (docs/architecture.md §3): whenever the source (re)lists, one RESYNC (with
  the scope's schedulers, which the worker decides for), then
  ADDED for every listed object, then DELETED tombstones for objects that
  vanished while it was not watching; object events as the watches deliver them;
  TICKs so the log's clock advances while the cluster is quiet;
- who writes the log: one source per cluster, the Lease's holder.
The list+watch protocol itself (pages, resourceVersions, bookmarks, 410 Gone, a watch's
lines) is streams.kube.watching's; batching events into records keyed by cluster name
and writing them is streams.kube.publisher's (`Publisher`).

Kubernetes edge cases, each handled here and only here:
- Each stream's watch opens as soon as that stream is listed, from the list's
  resourceVersion, not after every kind is listed: on a big cluster listing all
  kinds takes long enough for an early list's version to leave the watch cache's
  window (or be compacted), and the watch would start with 410. Events those
  watches deliver while later kinds are still being listed are held (in a queue
  bounded by QUEUE_MAX_EVENTS) and written once the relist's ADDED run and its
  tombstones are, so RESYNC's framing holds.
- 410 Gone / Expired (watching.Expired): the history a watch needs is compacted,
  so every watch stops and everything is relisted.
  One cluster-wide relist keeps RESYNC's contract simple: objects not re-listed
  before the next non-ADDED event are gone. Nothing else (no TICK, no watch
  event) is written between a RESYNC and the end of its ADDED run.
- A list page that fails (an expired continue token included) restarts that
  list; ADDED events already written are harmless duplicates (folding is idempotent).
- Tombstones carry the relist's resourceVersion, newer than anything seen before,
  so an idempotent fold (engine.cluster) does not discard them as stale.
- ElasticQuotas are watched only while discovery serves their group version;
  a CRD installed later is noticed within CRD_RECHECK_S, one removed by a 404.
- What is written of each object is its projection (engine.projection): the
  fields a decision or an audit reads, nothing else. Env values, command lines,
  args, volumes, probes, images, status messages, managedFields and most
  annotations (last-applied-configuration among them) never reach Kafka, where
  they would stay for the audit horizon (docs/topics.md lists what is kept).
- One writer per cluster log: with a Lease (streams.kube.lease) only its holder
  lists, watches and writes. A source that loses the Lease stops following and
  drops what it has not written yet (the next holder's RESYNC restates the
  cluster); one that gains it relists. A record the Lease check refuses (a late
  renewal: too little validity left for a write) leaves a gap even if the Lease
  is then renewed, so it too stops following and relists (Publisher.fenced).
- An object whose projection is still too large for any record (MAX_EVENT_BYTES:
  labels by the thousand; the producer would refuse it for good and, retried, it
  would hold back the whole log): its deletion is written as its tombstone;
  anything else is left out, logged as an error and counted.
- Any other API error: exponential backoff (streams.common.backoff), then the same step again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import Counter

from engine import projection
from schemas import records
from schemas.records import CLUSTER_EVENTS
from streams.common import health
from streams.common.backoff import Backoff
from streams.kafka.sink import RecordSink
from streams.kube import api as kube
from streams.kube import lease, watching
from streams.kube.publisher import (
    MAX_EVENT_BYTES,
    MAX_RECORD_BYTES,
    QUEUE_MAX_EVENTS,
    EventTooLarge,
    Publisher,
)
from streams.kube.watching import Resource, Stream

log = logging.getLogger(__name__)

# What kube-scheduler calls itself; pods without spec.schedulerName get this name.
DEFAULT_SCHEDULER = "default-scheduler"

# Every TICK moves the log's clock while the cluster is quiet (toleration windows,
# DaemonSet start delays and the worker's re-decision backoff expire on it). 1 s is
# kube-scheduler's initial pod backoff, so a pending preemptor due again is decided
# again within a second of it; it costs ~86k tiny records a day per cluster.
DEFAULT_TICK_SECONDS = 1.0
# How often the source asks discovery whether the ElasticQuota CRD appeared.
CRD_RECHECK_S = 60.0
# A relist needed again within this long of the previous one waits a backoff first:
# an API server (or proxy) that keeps answering 410 must not get a full relist in a loop.
RESYNC_STABLE_S = 60.0
# On shutdown, how long queued events may take to reach Kafka before they are dropped
# (they are not lost: the next start relists, and RESYNC restates the cluster).
SHUTDOWN_FLUSH_TIMEOUT_S = 10.0

EVENTS = Counter("preemptctl_source_events_total", "Events written to the log.", ["kind", "type"])
RESYNCS = Counter("preemptctl_source_resyncs_total", "Relists of the whole cluster.", ["reason"])
TOMBSTONES = Counter("preemptctl_source_tombstones_total", "Objects found gone on a relist.", ["kind"])
OVERSIZED = Counter(
    "preemptctl_source_oversized_objects_total",
    "Objects too large for a record even projected, by kind and what was written instead "
    "(tombstone, dropped).",
    ["kind", "outcome"],
)
API_ERRORS = Counter(
    "preemptctl_source_api_errors_total", "Failed list/watch/discovery calls.", ["resource", "reason"]
)


# ---- what is watched --------------------------------------------------------------

PODS = Resource("Pod", "", "v1", "pods", namespaced=True)
NODES = Resource("Node", "", "v1", "nodes", namespaced=False)
PRIORITY_CLASSES = Resource("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
PDBS = Resource("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", namespaced=True)
# Cluster-scoped, so watched whatever the scope's namespaces: their labels are what a pod
# (anti-)affinity term's namespaceSelector matches.
NAMESPACES = Resource("Namespace", "", "v1", "namespaces", namespaced=False)
ELASTIC_QUOTAS = Resource(
    "ElasticQuota", "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", namespaced=True
)
# Watch events on their way from the watches to the log: (kind, event type, object).
Arrivals = asyncio.Queue[tuple[Resource, str, dict[str, Any]]]
# Nodes first: a relist restates capacity before pods.
RESOURCES = (NODES, PRIORITY_CLASSES, NAMESPACES, PDBS, PODS)

# What the source does with the API, for the chart's ClusterRole (a test keeps them equal):
# lists and watches only. No `get`: it never reads one object by name, and a token that can
# read any pod by name is more than the source needs.
REQUIRED_RBAC: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    (r.group, r.plural, ("list", "watch")) for r in (*RESOURCES, ELASTIC_QUOTAS)
)
# Namespaced to the release: the source's single-writer Lease.
REQUIRED_LEASE_RBAC: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
)


@dataclass(frozen=True)
class Scope:
    """Which part of the cluster one source writes, so it can run beside kube-scheduler.

    - `namespaces`: namespaced kinds are watched only there (nodes and
      PriorityClasses are cluster-wide and always watched: capacity is shared);
    - `label_selector`: a server-side selector on pods; pods outside it are
      invisible, so use it only where they do not share nodes with selected ones;
    - `scheduler_name`: pending pods of other schedulers are left out (they are
      not ours to preempt for), but every pod bound or nominated to a node is
      written whoever scheduled it, because it uses or claims capacity. Once an
      object is in the log, all its later events are too.
    """

    cluster: str = records.DEFAULT_CLUSTER
    namespaces: tuple[str, ...] = ()
    label_selector: str | None = None
    scheduler_name: str | None = None

    def admits(self, resource: Resource, obj: dict[str, Any]) -> bool:
        if self.scheduler_name is None or resource is not PODS:
            return True
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        if spec.get("nodeName") or status.get("nominatedNodeName"):
            return True
        return (spec.get("schedulerName") or DEFAULT_SCHEDULER) == self.scheduler_name

    def recorded(self) -> dict[str, Any] | None:
        """What every RESYNC records of the scope: the schedulers decided for (None: all of them).

        The worker reads it from the log, so the decisions (and `replay`) follow the
        scope the source ran with, not a flag of their own.
        """
        return None if self.scheduler_name is None else {"schedulerNames": [self.scheduler_name]}


@dataclass(frozen=True)
class _Held:
    """What the log holds of one object: enough to write its tombstone."""

    resource: Resource
    name: str
    namespace: str | None
    uid: str


Key = tuple[str, str]


def _identity(resource: Resource, obj: dict[str, Any]) -> Key:
    """The worker's table key (engine.cluster): uid for namespaced kinds, name for cluster-scoped ones.

    Keyed by uid, a pod recreated under the same name is a new object, and the
    old uid gets its tombstone.
    """
    meta = obj.get("metadata") or {}
    if resource.namespaced:
        return resource.kind, str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
    return resource.kind, str(meta.get("name"))


class Resync(Exception):
    """Raised by a watch that cannot continue: everything must be relisted.

    `reason` is one of RESYNC_REASONS (a metric label); the message says more.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# Why the source relists: the values of preemptctl_source_resyncs_total's `reason` label.
RESYNC_REASONS = ("start", "expired", "crd-installed", "crd-removed", "leader")


class _Clock:
    """Event timestamps: wall-clock time, never going backwards (docs/architecture.md §3)."""

    def __init__(self, now: Callable[[], datetime] = kube.now) -> None:
        self._now = now
        self._last: datetime | None = None

    def stamp(self) -> str:
        moment = self._now()
        if self._last is not None and moment < self._last:
            moment = self._last  # a clock stepped back (NTP) must not move the log's "now" back
        self._last = moment
        return kube.rfc3339(moment)


# ---- the source -------------------------------------------------------------------


class Source:
    """Lists and watches one cluster and writes its events through a Publisher.

    `run()` runs until `stop()`; `ready` is set once the initial list is in the log.
    """

    def __init__(
        self,
        api: client.ApiClient,
        sink: RecordSink,
        *,
        scope: Scope = Scope(),
        tick_seconds: float = DEFAULT_TICK_SECONDS,
        health_state: health.Health | None = None,
        backoff: Callable[[], Backoff] = Backoff,
        watch_timeout_s: int = watching.WATCH_TIMEOUT_S,
        page_size: int = watching.LIST_PAGE_SIZE,
        crd_recheck_s: float = CRD_RECHECK_S,
        max_record_bytes: int = MAX_RECORD_BYTES,
        max_event_bytes: int = MAX_EVENT_BYTES,
        clock: Callable[[], datetime] = kube.now,
        topic: str = CLUSTER_EVENTS,
        elector: lease.LeaseElector | None = None,
    ) -> None:
        self._api = api
        self.scope = scope
        self._elector = elector
        self.publisher = Publisher(
            sink,
            cluster=scope.cluster,
            topic=topic,
            max_record_bytes=max_record_bytes,
            max_event_bytes=max_event_bytes,
            backoff=backoff,
            guard=elector.check if elector is not None else lambda: None,
        )
        self._tick_s = tick_seconds
        self._health = health_state
        self._backoff = backoff
        self._watch_timeout_s = watch_timeout_s
        self._page_size = page_size
        self._crd_recheck_s = crd_recheck_s
        self._clock = _Clock(clock)
        self._held: dict[Key, _Held] = {}
        self._streams: list[Stream] = []
        self._quotas_served = False
        self._stopping = asyncio.Event()
        self.ready = asyncio.Event()  # the first initial list is in the log
        self._listed = False  # this leadership's initial list is in the log

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        publisher = asyncio.create_task(self.publisher.run(), name="source-publisher")
        main = asyncio.create_task(self._main(), name="source-main")
        stopping = asyncio.create_task(self._stopping.wait(), name="source-stopping")
        tasks = {publisher, main, stopping}
        electing = None
        if self._elector is not None:
            electing = asyncio.create_task(self._elector.run(), name="source-lease")
            tasks.add(electing)
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopping:
                    task.result()  # a crash of the publisher or the main loop ends the source
        finally:
            for task in (main, stopping):
                task.cancel()
            await asyncio.gather(main, stopping, return_exceptions=True)
            if not publisher.done():
                try:
                    await asyncio.wait_for(self.publisher.flush(), SHUTDOWN_FLUSH_TIMEOUT_S)
                except TimeoutError:
                    log.warning("shutting down with unwritten events; the next start relists")
                publisher.cancel()
                await asyncio.gather(publisher, return_exceptions=True)
            if electing is not None:  # after the last write: then the Lease is released
                electing.cancel()
                await asyncio.gather(electing, return_exceptions=True)
            if self._health is not None:
                self._health.set_ready(False)

    # ---- leadership: one writer per cluster log ---------------------------------------

    async def _main(self) -> None:
        """Lead (relist and follow) while holding the Lease; without one, always."""
        if self._elector is None:
            await self._lead("start")
            return
        reason = "start"
        while True:
            standing_by = asyncio.create_task(self._stand_by(), name="source-standby")
            try:
                # Long enough to write: a holder whose renewal is late would only be refused again.
                await self._elector.wait_leader(needed_s=kube.WRITE_TIMEOUT_S)
            finally:
                standing_by.cancel()
                await asyncio.gather(standing_by, return_exceptions=True)
            self._listed = False
            self._set_ready(False)  # until this leadership's initial list is in the log
            log.info("holding Lease %s/%s: listing the cluster", self._elector.namespace, self._elector.name)
            leading = asyncio.create_task(self._lead(reason), name="source-leading")
            deposed = asyncio.create_task(self._deposed(), name="source-deposed")
            done, _ = await asyncio.wait({leading, deposed}, return_when=asyncio.FIRST_COMPLETED)
            for task in (leading, deposed):
                task.cancel()
            await asyncio.gather(leading, deposed, return_exceptions=True)
            if leading in done:
                leading.result()  # it only ends by raising
            dropped = self.publisher.discard()
            why = "a write was refused" if self._elector.is_leader() else "lost the Lease"
            log.warning("%s: stopped following, %d unwritten events dropped", why, dropped)
            reason = "leader"

    def _set_ready(self, ready: bool) -> None:
        if self._health is not None:
            self._health.set_ready(ready)

    async def _stand_by(self) -> None:
        """Ready while another process holds the Lease: a healthy standby (a Deployment's rollout,
        `helm --wait`, wait for every replica to be ready; a standby never would be otherwise)."""
        assert self._elector is not None
        while True:
            holder = self._elector.holder
            if holder and holder != self._elector.identity:
                self._set_ready(True)
            await asyncio.sleep(self._elector.retry_period_s / 4)

    async def _deposed(self) -> None:
        """Return once the Lease is lost (checked four times a retry period) or the publisher refused
        a record (at once): either way the log now has a gap, and only a relist closes it. A holder
        whose renewal is merely late and that had nothing to write keeps following."""
        assert self._elector is not None
        while self._elector.is_leader():
            try:
                await asyncio.wait_for(self.publisher.fenced.wait(), self._elector.retry_period_s / 4)
                return
            except TimeoutError:
                continue

    async def _lead(self, reason: str) -> None:
        """Relist and follow, relisting whenever the watches need it, until cancelled."""
        loop = asyncio.get_running_loop()
        backoff = self._backoff()
        while True:
            followed_at = loop.time()
            reason = await self._cycle(reason)
            if loop.time() - followed_at < RESYNC_STABLE_S:
                await asyncio.sleep(backoff.delay())
            else:
                backoff.reset()

    # ---- emitting -----------------------------------------------------------------

    async def _emit(
        self, event_type: str, obj: dict[str, Any] | None = None, *, scope: dict[str, Any] | None = None
    ) -> None:
        event: dict[str, Any] = {"ts": self._clock.stamp(), "type": event_type}
        if obj is not None:
            event["object"] = projection.project(obj)  # what decisions read, never the object whole
        if scope is not None:
            event["scope"] = scope
        EVENTS.labels(str(obj.get("kind", "")) if obj else "", event_type).inc()
        try:
            await self.publisher.put(event)
        except EventTooLarge as exc:
            assert obj is not None  # RESYNC and TICK are a few bytes
            await self._emit_oversized(event, obj, exc)

    async def _emit_oversized(self, event: dict[str, Any], obj: dict[str, Any], exc: EventTooLarge) -> None:
        """A DELETED object too large for a record even projected as its tombstone; else leave it
        out, saying so."""
        kind = str(obj.get("kind", ""))
        meta = obj.get("metadata") or {}
        where = f"{kind} {meta.get('namespace', '')}/{meta.get('name')}".replace(" /", " ")
        if event["type"] == "DELETED":
            resource = next((r for r in (*RESOURCES, ELASTIC_QUOTAS) if r.kind == kind), PODS)
            held = _Held(resource, str(meta.get("name")), meta.get("namespace"), str(meta.get("uid", "")))
            event["object"] = self._tombstone(held, str(meta.get("resourceVersion") or ""))
            await self.publisher.put(event)
            OVERSIZED.labels(kind, "tombstone").inc()
            log.warning("%s is too large for a record even projected (%s): its deletion is a tombstone",
                        where, exc)  # fmt: skip
            return
        OVERSIZED.labels(kind, "dropped").inc()
        log.error("%s is too large for a record even projected (%s): its %s event is left out of the log",
                  where, exc, event["type"])  # fmt: skip

    def _hold(self, resource: Resource, key: Key, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self._held[key] = _Held(
            resource, str(meta.get("name")), meta.get("namespace"), str(meta.get("uid", ""))
        )

    async def _observe(self, resource: Resource, event_type: str, obj: dict[str, Any]) -> None:
        """One watch event into the log, through the scope's gate."""
        key = _identity(resource, obj)
        if event_type == "DELETED":
            if self._held.pop(key, None) is not None:  # never written, nothing to delete
                await self._emit("DELETED", obj)
            return
        if key not in self._held:
            if not self.scope.admits(resource, obj):
                return
            event_type = "ADDED"  # the first time the log holds it
        self._hold(resource, key, obj)
        await self._emit(event_type, obj)

    # ---- listing ------------------------------------------------------------------

    def _plan(self) -> list[Stream]:
        kinds: list[Resource] = list(RESOURCES)
        if self._quotas_served:
            kinds.insert(len(kinds) - 1, ELASTIC_QUOTAS)
        streams = []
        for resource in kinds:
            selector = self.scope.label_selector if resource is PODS else None
            if resource.namespaced and self.scope.namespaces:
                streams += [Stream(resource, ns, selector) for ns in self.scope.namespaces]
            else:
                streams.append(Stream(resource, None, selector))
        return streams

    async def _quotas_available(self) -> bool:
        """Does discovery serve elasticquotas?"""
        return await watching.served(self._api, ELASTIC_QUOTAS)

    async def _cycle(self, reason: str) -> str:
        """RESYNC, ADDED for every object listed, DELETED for every object held but not listed; then follow.

        Each stream's watch starts right after its list (see the module docstring);
        what the watches deliver is written only after the relist. Returns why the
        next relist is needed.
        """
        RESYNCS.labels(reason).inc()
        backoff = self._backoff()
        while True:
            try:
                self._quotas_served = await self._quotas_available()
                break
            except watching.ERRORS as exc:
                await self._failed("discovery", exc, backoff)
        self._streams = self._plan()
        arrived: Arrivals = asyncio.Queue(QUEUE_MAX_EVENTS)
        found: list[Resync] = []
        try:
            async with asyncio.TaskGroup() as group:
                await self._emit("RESYNC", scope=self.scope.recorded())
                listed: set[Key] = set()
                versions: dict[tuple[str, str | None], str] = {}
                for stream in self._streams:
                    backoff.reset()
                    while True:
                        try:
                            listed |= await self._list(stream)
                            versions[stream.resource.kind, stream.namespace] = stream.version
                            break
                        except watching.ERRORS as exc:
                            await self._failed(stream.name, exc, backoff)
                    # The next list waits until this watch is open (or failed once), so no
                    # stream's version ages while the others are listed.
                    opened = asyncio.Event()
                    group.create_task(self._watch(stream, arrived, opened), name=f"watch-{stream.name}")
                    await opened.wait()
                for key in sorted(set(self._held) - listed):
                    held = self._held.pop(key)
                    version = versions.get((held.resource.kind, held.namespace)) or versions.get(
                        (held.resource.kind, None), ""
                    )
                    TOMBSTONES.labels(held.resource.kind).inc()
                    await self._emit("DELETED", self._tombstone(held, version))
                if not self._listed:
                    # Ready means the initial state is durable in the log, not merely listed.
                    await self.publisher.flush()
                    self._listed = True
                    self._set_ready(True)
                    log.info("initial list written: %d objects", len(self._held))
                    self.ready.set()
                group.create_task(self._deliver(arrived), name="deliver")
                group.create_task(self._tick(), name="tick")
                if not self._quotas_served:
                    group.create_task(self._await_quota_crd(), name="crd-recheck")
        except* Resync as resyncs:
            found = sorted((e for e in resyncs.exceptions if isinstance(e, Resync)), key=lambda e: e.reason)
        if not found:
            raise AssertionError("unreachable: watches and ticks end only by raising")
        log.info("relisting the cluster: %s", "; ".join(sorted({str(e) for e in found})))
        return found[0].reason

    async def _deliver(self, arrived: Arrivals) -> None:
        """Write the watches' events in the order they arrived (started once the relist is written)."""
        while True:
            resource, event_type, obj = await arrived.get()
            await self._observe(resource, event_type, obj)

    @staticmethod
    def _tombstone(held: _Held, version: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": held.name, "uid": held.uid, "resourceVersion": version}
        if held.namespace:
            meta["namespace"] = held.namespace
        return {"apiVersion": held.resource.api_version, "kind": held.resource.kind, "metadata": meta}

    async def _list(self, stream: Stream) -> set[Key]:
        """List one stream page by page, writing ADDED as pages arrive; set its version."""
        listed: set[Key] = set()
        objects = watching.list_objects(self._api, stream, page_size=self._page_size)
        async with contextlib.aclosing(objects):
            async for obj in objects:
                key = _identity(stream.resource, obj)
                if key in self._held or self.scope.admits(stream.resource, obj):
                    self._hold(stream.resource, key, obj)
                    listed.add(key)
                    await self._emit("ADDED", obj)
        return listed

    async def _failed(self, what: str, exc: BaseException, backoff: Backoff) -> None:
        API_ERRORS.labels(what.split("@")[0], kube.reason_of(exc)).inc()
        delay = backoff.delay()
        log.warning("%s failed (%s); retrying in %.1fs", what, str(exc).strip() or type(exc).__name__, delay)
        await asyncio.sleep(delay)

    # ---- following ----------------------------------------------------------------

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s)
            await self._emit("TICK")

    async def _await_quota_crd(self) -> None:
        while True:
            await asyncio.sleep(self._crd_recheck_s)
            try:
                if await self._quotas_available():
                    raise Resync("crd-installed", "ElasticQuota CRD installed")
            except watching.ERRORS as exc:
                API_ERRORS.labels("discovery", kube.reason_of(exc)).inc()

    async def _watch(self, stream: Stream, arrived: Arrivals, opened: asyncio.Event) -> None:
        """Follow one stream, resuming after each watch ends; `opened` is set once it first answers."""

        async def deliver(event_type: str, obj: dict[str, Any]) -> None:
            # A full queue pauses this watch (backpressure) rather than growing memory.
            await arrived.put((stream.resource, event_type, obj))

        try:
            await watching.follow(
                self._api,
                stream,
                deliver,
                opened=opened,
                backoff=self._backoff(),
                failed=self._watch_failed,
                timeout_s=self._watch_timeout_s,
            )
        except watching.Expired as exc:
            raise Resync("expired", str(exc)) from exc

    async def _watch_failed(self, stream: Stream, exc: BaseException, backoff: Backoff) -> None:
        """A failed watch waits its backoff, unless the ElasticQuota CRD is gone (404): then relist."""
        if kube.status_of(exc) == 404 and stream.resource is ELASTIC_QUOTAS:
            raise Resync("crd-removed", "ElasticQuota CRD removed") from exc
        await self._failed(stream.name, exc, backoff)
