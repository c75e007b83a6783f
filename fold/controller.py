"""The controller: folds a cluster's event log into state and turns it into decision records.

This is the deterministic heart of the worker, `replay` and the simulator: the
same events in the same order give byte-identical decision records, because
"now" is the event's `ts`, ties are broken by stable keys, and every piece of
state that influences a decision (objects, nominations, leaving victims, the
hash-chain head, the event sequence number) lives here and is persisted
together by the store, with the log position it reflects.

Folding one event is atomic: every change is noted in an undo log
(fold.undo) before it is made, and any exception while the event
is folded or decided (a malformed object, an engine error, a decision too large
to publish) rolls the controller back to exactly its state before the event and
raises BadEvent. A rejected event takes no sequence number, so a log with bad
events folds to the same state and decisions as the log without them, wherever
it is folded (worker, `replay`, the simulator).

`step` folds one event and hands everything it produced back in one value, a
`Ready` (as etcd raft's node hands its application a Ready): the decision
records, each with the bytes it is published as, and the store keys the event
changed with their new encoded objects. The controller keeps none of it: the
worker publishes the bytes and gathers the keys until its next store write;
`replay` and the simulator keep the records.

Decisions are made for the pending pods in scope (the schedulers the log's
last RESYNC names; every scheduler when it names none) when one is found
unschedulable (PodScheduled False/Unschedulable). A pod of another scheduler is
never decided for, even once nominated, but uses capacity like any other.

No answer is final while the pod is pending (liveness, modelled on
kube-scheduler's queueing hints and pod backoff): a decided pod stays in
`retry` and is decided again once its backoff has passed on log time
(RETRY_INITIAL_SECONDS doubling to RETRY_MAX_SECONDS per attempt) and either a
change that could alter its answer was folded since its last decision (a node
added, removed or changed; a pod that was bound or nominated deleted, finishing,
terminating or changed; any PDB, PriorityClass, ElasticQuota or Namespace change; a
toleration window closing on log time; a nomination ended) or its last answer
was `wait`. Such changes bump `gen`; a pod is "active" when its last decision
saw an older `gen`. A decision record is emitted when the answer for a
preemptor changes, so a pod re-reported as unschedulable while its preemption
is under way does not flood the log.

After a `preempt`, the controller applies the decision to its own view at once
(victims leaving, preemptor nominated): capacity is never promised twice and a
pod is a fresh victim of at most one live decision (docs/architecture.md §2). What the
actuator did comes back through the log as an OUTCOME event: victims it did not
act on (blocked by a PDB, an error, a refused decision) stop being "leaving",
every nomination on their nodes ends (its room depended on them), a refused
decision's nomination ends, and the preemptors concerned are decided again
once their backoff has passed.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from engine import ENGINE_VERSION, flows, objects, projection, timeutil, toleration
from engine import cluster as cluster_mod
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import PREEMPT, WAIT, Decision
from engine.default import Preemptor
from engine.index import Index
from engine.objects import Pod, Record
from fold.undo import Undo, record_key, table_record
from schemas import VERSION, chain, records
from schemas.records import DecisionRecord

# A nomination (and the "leaving" mark on its victims) that the cluster has not
# confirmed within this much log time is dropped, so a lost eviction cannot hold
# capacity forever (kube-scheduler clears stale nominations the same way).
NOMINATION_TTL_SECONDS = 300

# kube-scheduler's pod backoff (podInitialBackoffDuration 1 s, podMaxBackoffDuration 10 s):
# a pending preemptor is decided again no sooner than this after its last decision,
# doubling per attempt, so a cluster that changes all the time cannot make the worker
# re-decide every waiting pod on every event.
RETRY_INITIAL_SECONDS = 1
RETRY_MAX_SECONDS = 10
# kube-scheduler's podMaxInUnschedulablePodsDuration: a pending preemptor that no change
# has woken is decided again this long after its last decision anyway, so a change the
# wake-up rules do not cover (a new low-priority pod that could be a victim) is seen.
RETRY_FLUSH_SECONDS = 300

# What kube-scheduler calls itself: a pod without spec.schedulerName is its.
DEFAULT_SCHEDULER = "default-scheduler"

# Victim results of an OUTCOME event that leave the victim where it was: it is not leaving.
NOT_ACTED = frozenset({"blocked-by-pdb", "error"})
# Nomination results of an OUTCOME event that refuse the whole decision (no victim touched).
REFUSED = frozenset({"gone", "recreated", "bound", "out-of-scope"})


# A decision record is published as one Kafka record: larger than this and the broker
# would refuse it (records.VALUE_MAX_BYTES), so its explanation is replaced by a marker.
DECISION_MAX_BYTES = records.VALUE_MAX_BYTES

Decide = Callable[..., Decision]


def _table_key(kind: str, obj: Mapping[str, Any]) -> str:
    """engine.cluster.table_key, the common case first: an API object's uid (or a node's name).

    Any other case (a hand-written object without uid, a malformed one) goes to
    the engine's own rule; it runs for every event, hence the shortcut.
    """
    meta = obj.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("name"), str) and meta["name"]:
        if kind in ("Node", "PriorityClass"):
            return str(meta["name"])
        uid = meta.get("uid")
        if isinstance(uid, str) and uid and kind in ("Pod", "PodDisruptionBudget", "ElasticQuota"):
            return uid
    return cluster_mod.table_key(obj)


def _well_formed(event: Any) -> bool:
    """records.event_problem(event) is None, the common case checked inline: it runs for every event."""
    if not isinstance(event, dict):
        return False
    kind = event.get("type")
    ts = event.get("ts")
    if not isinstance(ts, str) or len(ts) > records.MAX_TS_CHARS:
        return False
    if kind in records.OBJECT_EVENTS:
        obj = event.get("object")
        return isinstance(obj, dict) and records.object_problem(obj) is None
    return kind in records.EVENT_TYPES


def _may_change_answers(before: Record | None, after: Record | None) -> bool:
    """Could this change of one object alter a pending preemptor's answer? (kube-scheduler's
    queueing hints, coarsely: a heartbeat or a pending pod's own status never does.)"""
    if not isinstance(before, Pod) and not isinstance(after, Pod):
        # A node, PDB, PriorityClass or quota added, removed, or changed beyond its version
        # (a node's heartbeat changes nothing the engine reads, so it compares equal).
        if before is None or after is None:
            return before is not None or after is not None
        return _differs(before, after, _VERSION)
    if not isinstance(after, Pod):
        return isinstance(before, Pod) and (before.node is not None or before.nominated is not None)
    if not isinstance(before, Pod):
        return False  # a new pod only takes capacity (kube-scheduler requeues on none either)
    if before.node is None and after.node is not None:
        return False  # bound: it takes capacity it had not taken
    if before.node is None and after.node is None and before.nominated is None and after.nominated is None:
        return False  # a pending pod claims nothing: its own changes are its own business
    # Only what the engine reads: an annotation it does not read (last-applied-configuration,
    # which even embeds the resourceVersion) must not wake anyone, or a whole object and its
    # projection (the source's, engine.projection) would be decided differently.
    if _differs(before, after, _VERSION_AND_ANNOTATIONS):
        return True
    return before.annotations != after.annotations and _read(before) != _read(after)


_VERSION = frozenset({"resource_version"})
_VERSION_AND_ANNOTATIONS = frozenset({"resource_version", "annotations"})
_COMPARED: dict[type, tuple[str, ...]] = {}


def _differs(before: Record, after: Record, skip: frozenset[str]) -> bool:
    """`dataclasses.replace(before, **{f: getattr(after, f) for f in skip}) != after`, without
    building the copy (it ran for every object event: 4% of the fold): the records differ in a
    compared field outside `skip`, or are of different classes."""
    cls = type(before)
    if type(after) is not cls:
        return True
    names = _COMPARED.get(cls)
    if names is None:
        names = _COMPARED[cls] = tuple(f.name for f in dataclasses.fields(before) if f.compare)
    for name in names:
        if name not in skip:
            a, b = getattr(before, name), getattr(after, name)
            if a is not b and a != b:  # a tuple's comparison: identity first, as __eq__ does
                return True
    return False


def _read(pod: Pod) -> dict[str, str]:
    """The pod's annotations the engine reads."""
    return {k: v for k, v in pod.annotations.items() if projection.reads_pod_annotation(k)}


class BadEvent(ValueError):
    """One event that could not be folded or decided: rejected (dead-lettered), the controller unchanged.

    `error_class` names the original exception (AttributeError, InvalidObject, ...).
    """

    def __init__(self, reason: str, error_class: str = "BadEvent") -> None:
        super().__init__(reason)
        self.error_class = error_class


class DecisionTooLarge(ValueError):
    """A decision record exceeds DECISION_MAX_BYTES even without its explanation."""


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision record and the bytes it is published as (encoded once, for the size limit)."""

    record: DecisionRecord
    encoded: bytes


@dataclass(frozen=True, slots=True)
class Ready:
    """Everything one folded event produced, handed back at once (`Controller.step`)."""

    decisions: list[Decided]
    # Store key ("Kind/key") -> the object's encoded raw JSON, None when it was deleted: what
    # the store must write for this event (the worker gathers them until it writes).
    dirty: dict[str, bytes | None]

    @property
    def records(self) -> list[DecisionRecord]:
        return [d.record for d in self.decisions]


@dataclass(slots=True)
class Nomination:
    node: str
    decision_id: str
    since: int
    expires: int


@dataclass(frozen=True, slots=True)
class Retry:
    """A pending preemptor's place in the re-decision queue (all times are log time, ns)."""

    attempts: int  # decisions made for it so far
    due: int  # not decided again before this
    since: int  # its first decision: how long it has been waiting
    gen: int  # the controller's change generation its last decision saw
    at: int  # its last decision

    @property
    def flush(self) -> int:
        return self.at + RETRY_FLUSH_SECONDS * timeutil.SECOND


def backoff(attempts: int) -> int:
    """kube-scheduler's backoff after `attempts` tries: 1 s, 2 s, 4 s, 8 s, then 10 s (ns)."""
    seconds: int = min(RETRY_INITIAL_SECONDS * 2 ** max(0, min(attempts - 1, 16)), RETRY_MAX_SECONDS)
    return seconds * timeutil.SECOND


def scheduler_of(pod: Pod) -> str:
    spec = pod.raw.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else DEFAULT_SCHEDULER


def scope_of(event: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The schedulers a RESYNC names (sorted), None when it names none; BadEvent when malformed."""
    scope = event.get("scope")
    if scope is None:
        return None
    problem = records.scope_problem(scope)
    if problem:
        raise BadEvent(problem)
    return tuple(sorted(set(scope["schedulerNames"])))


# The controller's own values an event may replace (its objects go through the undo log): a
# rejected event sets each back, so it leaves no trace, not even a sequence number.
_ROLLED_BACK = (
    "seq",
    "prev_hash",
    "decisions",
    "last_seq",
    "last_id",
    "_earliest",
    "gen",
    "clock",
    "scope",
    "toleration_checked",
    "resync",
)


@dataclass(slots=True)
class Controller:
    cluster_name: str
    config: Config
    key: bytes | None = None
    # The decision function: engine.flows.decide; a test may put a failing one here.
    decide: Decide = flows.decide
    max_record_bytes: int = DECISION_MAX_BYTES
    # The install `key`'s signatures bind (schemas.chain: the topic prefix or --install-id), so
    # only that install's actuators accept them; None: the legacy unbound HMAC (replay of old logs).
    install: str | None = chain.DEFAULT_INSTALL
    cluster: Cluster = field(default_factory=Cluster)
    seq: int = 0  # events handled; the next event's sequence number
    prev_hash: str = chain.GENESIS
    decisions: int = 0
    last_seq: int = -1  # sequence number of the last decision record made
    last_id: str = ""
    nominations: dict[str, Nomination] = field(default_factory=dict)
    leaving: dict[str, int] = field(default_factory=dict)  # victim uid -> expiry of our "leaving" mark
    last: dict[str, str] = field(default_factory=dict)  # preemptor uid -> fingerprint of last record
    waiting: set[str] = field(default_factory=set)  # pods whose last answer was `wait`
    retry: dict[str, Retry] = field(default_factory=dict)  # pending preemptor uid -> re-decision
    gen: int = 0  # bumped by every change that could alter a pending preemptor's answer
    clock: int = 0  # the log's time: the latest event ts folded (a late writer's ts never goes back)
    scope: tuple[str, ...] | None = None  # the schedulers decided for (None: all), from RESYNC
    toleration_checked: int = 0  # toleration windows closing up to here have bumped `gen`
    resync: set[str] | None = None  # keys re-listed since a RESYNC, until it completes
    _earliest: int | None = None  # no nomination or leaving mark expires before this
    index: Index = field(init=False)
    _config_hash: str = field(init=False, default="")
    # The store keys the event being folded changed (Ready.dirty): a fresh map per event,
    # dropped with the event when it is rejected.
    _dirty: dict[str, bytes | None] = field(init=False, default_factory=dict)
    _undo: Undo = field(init=False)
    _deciding: bool = field(init=False, default=False)  # the index's caches may be mid-update
    # Derived from `retry`, rebuilt after a rollback or a restore: when each entry falls due
    # (a heap of (due, uid); stale entries are skipped), the entries already due, and the
    # `gen` those were last looked at with. They keep a quiet event O(1).
    _timers: list[tuple[int, str]] = field(init=False, default_factory=list)
    _due: set[str] = field(init=False, default_factory=set)
    _due_gen: int = field(init=False, default=-1)

    def __post_init__(self) -> None:
        self.index = Index(self.cluster, lasting=True)
        self._config_hash = self.config.hash()
        self._undo = Undo(self.cluster)  # one log, emptied after every event

    # ---- folding -----------------------------------------------------------------------

    def step(self, event: Mapping[str, Any], *, project: bool = False) -> Ready:
        """Fold one event and return what it led to; BadEvent (nothing changed) if it cannot.

        `project`: the event's object may be whole (its record does not declare it projected,
        engine.projection.declared): what is folded, held and stored is its projection. The
        decisions are the same either way (tests/test_projection.py), and so is what is
        rejected: an object too deep to store is refused on the whole object, as before.

        Every change is noted in the undo log first; on any exception the log is
        rolled back, so a rejected event leaves no trace, not even a sequence number.
        """
        scalars = [getattr(self, name) for name in _ROLLED_BACK]
        undo = self._undo
        undo.cluster = self.cluster  # restore() replaces the cluster after construction
        self._deciding = False
        self._dirty = {}
        try:
            if not _well_formed(event):
                raise BadEvent(records.event_problem(event) or "malformed event")
            return Ready(self._handle(event, project), self._dirty)
        except Exception as exc:
            undo.rollback()
            for name, value in zip(_ROLLED_BACK, scalars, strict=True):
                setattr(self, name, value)
            self._rebuild_timers()
            if self._deciding:
                # The engine raised while deciding: its ranking caches may be half-updated.
                # A fresh index gives the same answers (it is exact), only slower at first.
                self.index = Index(self.cluster, lasting=True)
            if isinstance(exc, BadEvent):
                raise
            raise BadEvent(f"{type(exc).__name__}: {exc}", type(exc).__name__) from exc
        finally:
            undo.forget()

    def _handle(self, event: Mapping[str, Any], project: bool = False) -> list[Decided]:
        seq = self.seq
        now = max(self.clock, timeutil.parse(event["ts"], field="ts"))
        self.clock = now
        self.seq += 1
        kind = event["type"]
        if self.resync is not None and kind not in ("ADDED", "OUTCOME"):
            # An OUTCOME is the actuator's, written whenever it acts: it does not end a relist.
            self._finish_resync()
        out: list[Decided] = []
        self._expire(now)
        if kind == "RESYNC":
            self.resync = set()
            scope = scope_of(event)
            if scope != self.scope:
                self.scope = scope
                self.gen += 1  # pods now in scope are decided at their next due time
            return out
        if kind == "OUTCOME":
            self._outcome(event.get("outcome"), now)
            out.extend(self._retry_due(seq, now))
            return out
        if kind == "TICK":
            self._tolerations_closed(now)
            out.extend(self._retry_due(seq, now))
            return out
        # Cluster.apply with its changes noted. It normalises the object before it
        # changes anything, so a malformed object raises with the index untouched.
        whole = event["object"]
        obj = projection.project(whole) if project else whole
        object_kind = str(obj.get("kind"))
        uid = _table_key(object_kind, obj)
        undo = self._undo
        undo.table(object_kind, uid)
        if kind == "DELETED" or f"{object_kind}/{uid}" in self.cluster.tombstones:
            undo.tombstone(f"{object_kind}/{uid}")  # only then does apply touch the tombstones
        before = table_record(self.cluster, object_kind, uid)
        key, changed = self.cluster.apply(kind, obj)
        if self.resync is not None:
            self._add(self.resync, key)
        if not changed:
            return out
        # Encoded now, not when the store is written: an object the store could never write
        # (records.MAX_OBJECT_DEPTH) is rejected with its event, the same in `replay`, which
        # folds whole objects as they are: so the whole one is checked, even when only its
        # projection is stored.
        if project and kind != "DELETED":
            records.encode_object(whole)
        self._dirty[key] = None if kind == "DELETED" else records.encode_object(obj)
        if self.retry and _may_change_answers(before, table_record(self.cluster, object_kind, uid)):
            self.gen += 1
        if object_kind == "Pod":
            out.extend(self._pod_changed(key.split("/", 1)[1], seq, now))
        out.extend(self._retry_due(seq, now))
        return out

    def _pod_changed(self, uid: str, seq: int, now: int) -> list[Decided]:
        pod = self.cluster.pods.get(uid)
        if uid in self.leaving:
            if pod is None or pod.deleting or pod.terminal:
                self._pop(self.leaving, uid)  # the cluster confirms it is going
            else:
                # Our eviction has not shown up yet: it stays leaving, not a fresh victim again.
                self._upsert(dataclasses.replace(pod, deleting=True, disruption_target=True, preempted=True))
        if pod is None or pod.node is not None:
            self._pop(self.last, uid)  # bound or gone: its last answer is history
        if pod is None or pod.node is not None or pod.terminal:
            self._pop(self.nominations, uid)
            self._discard(self.waiting, uid)
            self._pop(self.retry, uid)
            return []
        if not self._in_scope(pod):
            # Another scheduler's pod (kube-scheduler's own, say, once it nominated it): it
            # uses capacity, but it is not ours to decide for.
            self._discard(self.waiting, uid)
            self._pop(self.retry, uid)
            return []
        nom = self.nominations.get(uid)
        if nom is not None and pod.unschedulable_since is not None and pod.unschedulable_since > nom.since:
            # The scheduler tried the pod again after our decision: that nomination is over.
            self._pop(self.nominations, uid)
            nom = None
        if nom is not None:
            if pod.nominated != nom.node:
                # The API has not caught up with our nomination yet: keep promising the capacity.
                pod = dataclasses.replace(pod, nominated=nom.node)
                self._upsert(pod)
            return []  # its preemption is under way; the scheduler has not retried it since
        if pod.deleting:
            self._discard(self.waiting, uid)
            self._pop(self.retry, uid)
            return []
        if pod.unschedulable:
            return self._decide(pod, seq, now)
        return []

    def _in_scope(self, pod: Pod) -> bool:
        return self.scope is None or scheduler_of(pod) in self.scope

    # ---- liveness ----------------------------------------------------------------------

    def _retry_due(self, seq: int, now: int) -> list[Decided]:
        """Decide again every pending preemptor that is due and active (see the module docstring).

        Higher priority first, as kube-scheduler's active queue orders pods, then by uid.
        """
        fresh = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, uid = heapq.heappop(timers)
            entry = self.retry.get(uid)
            if entry is None or at not in (entry.due, entry.flush):
                continue  # stale: decided again (or forgotten) since it was queued
            if uid not in fresh:  # its due time and its flush time may both have passed
                fresh.append(uid)
            self._due.add(uid)
        if self.gen != self._due_gen:
            candidates = list(self._due)
            self._due_gen = self.gen
        elif fresh:
            candidates = fresh
        else:
            return []
        ready = []
        for uid in candidates:
            entry = self.retry.get(uid)
            if entry is None:
                self._due.discard(uid)
                continue
            if entry.gen >= self.gen and uid not in self.waiting and now < entry.flush:
                continue  # nothing changed since its last decision: it stays due, idle
            pod = self.cluster.pods.get(uid)
            if pod is None or pod.node is not None or pod.terminal or pod.deleting or not self._in_scope(pod):
                self._pop(self.retry, uid)
                self._discard(self.waiting, uid)
                self._due.discard(uid)
                continue
            ready.append((-self.cluster.priority(pod), uid, pod))
        out: list[Decided] = []
        for _, uid, _pod in sorted(ready, key=lambda r: (r[0], r[1])):
            pod = self.cluster.pods.get(uid)  # an earlier decision of this pass may have changed it
            if pod is not None and uid in self.retry:
                out.extend(self._decide(pod, seq, now))
        return out

    def _rebuild_timers(self) -> None:
        """The derived queues, from `retry` (after a rollback or a restore)."""
        self._due = {uid for uid, r in self.retry.items() if r.due <= self.clock}
        self._timers = sorted(
            [(r.due, uid) for uid, r in self.retry.items() if r.due > self.clock]
            + [(r.flush, uid) for uid, r in self.retry.items() if r.flush > self.clock]
        )
        self._due_gen = -1

    def _queue(self, uid: str, now: int) -> None:
        """After a decision for `uid`: its next attempt, after the backoff."""
        entry = self.retry.get(uid)
        attempts = 1 if entry is None else entry.attempts + 1
        due = now + backoff(attempts)
        queued = Retry(attempts, due, now if entry is None else entry.since, self.gen, now)
        self._set(self.retry, uid, queued)
        self._due.discard(uid)
        heapq.heappush(self._timers, (due, uid))
        heapq.heappush(self._timers, (queued.flush, uid))

    def _activate(self, uid: str) -> None:
        """Decide `uid` again once its backoff has passed, whatever else changes (its nomination
        ended). The backoff still holds: a victim a PDB keeps blocking must not make its
        preemptor loop without pause."""
        entry = self.retry.get(uid)
        if entry is not None and entry.gen >= self.gen:
            self._set(self.retry, uid, dataclasses.replace(entry, gen=self.gen - 1))

    def _tolerations_closed(self, now: int) -> None:
        """A toleration window that closed since the last TICK can let a waiting preemptor preempt.

        A window's end `until` is its last protected instant (the boundary is inclusive,
        `toleration.tolerates`), so it has closed at `now` when `until < now`; a TICK exactly
        at `until` would decide the same answer and spend the wake-up.
        """
        since, self.toleration_checked = self.toleration_checked, now
        if not self.retry or not any(
            (p := self.cluster.policy(name)) is not None and p.toleration_seconds >= 0
            for name in self.cluster.priority_classes
        ):
            return
        for pod in self.cluster.pods.values():
            if pod.node is None or not pod.priority_class:
                continue
            until = toleration.expires_at(
                self.cluster.policy(pod.priority_class), scheduled_at=pod.scheduled_at
            )
            if until is not None and since <= until < now:
                self.gen += 1
                return

    def waiting_summary(self) -> tuple[int, int | None]:
        """Pending preemptors being decided again, and the log time the oldest was first decided."""
        return len(self.retry), min((r.since for r in self.retry.values()), default=None)

    # ---- outcomes ----------------------------------------------------------------------

    def _outcome(self, outcome: Any, now: int) -> None:
        """Fold what the actuator did with one decision (an OUTCOME event; idempotent)."""
        problem = records.outcome_problem(outcome)
        if problem:
            raise BadEvent(problem)
        refused = outcome["nomination"] in REFUSED
        nodes = set()
        for uid, result in sorted(outcome["victims"].items()):
            if (refused or result in NOT_ACTED) and uid in self.leaving:
                self._pop(self.leaving, uid)  # not acted on: it stays where it is
                pod = self.cluster.pods.get(uid)
                if pod is not None:
                    self._upsert(objects.pod(pod.raw))
                    if pod.node is not None:
                        nodes.add(pod.node)
        # Only a node given back or a refusal ends nominations: the common outcome (every victim
        # acted on) does not look at them, so an OUTCOME costs O(its victims), not O(nominations).
        ended = (
            sorted(
                uid
                for uid, nom in self.nominations.items()
                if nom.node in nodes or (refused and nom.decision_id == outcome["decisionId"])
            )
            if nodes or refused
            else []
        )
        for uid in ended:
            # Its room depended on victims that are not leaving, or it was refused: it ends,
            # and the preemptor is decided again, with a record even if the answer is the
            # one it had (that answer was never carried out).
            self._pop(self.nominations, uid)
            pod = self.cluster.pods.get(uid)
            if pod is not None and pod.node is None:
                self._upsert(objects.pod(pod.raw))
            if outcome["nomination"] != "out-of-scope" or uid != outcome.get("preemptorUid"):
                self._pop(self.last, uid)
        if nodes or ended:
            self.gen += 1
            for uid in ended:
                self._activate(uid)

    def _finish_resync(self) -> None:
        seen = self.resync or set()
        self.resync = None
        for kind, key in sorted(self.cluster.all_keys()):
            if f"{kind}/{key}" not in seen:
                self._remove(kind, key)
                self._dirty[f"{kind}/{key}"] = None
                if kind == "Pod":
                    self._pop(self.nominations, key)
                    self._discard(self.waiting, key)
                    self._pop(self.leaving, key)
                    self._pop(self.retry, key)
                self.gen += 1

    def _expire(self, now: int) -> None:
        if self._earliest is None or self._earliest >= now:
            return  # nothing can have expired: the common case, kept O(1)
        for uid in sorted(u for u, n in self.nominations.items() if n.expires < now):
            self._pop(self.nominations, uid)
            self.gen += 1  # the capacity it promised is free again
            pod = self.cluster.pods.get(uid)
            if pod is not None and pod.node is None:
                self._upsert(objects.pod(pod.raw))  # back to what the API says
        for uid in sorted(u for u, t in self.leaving.items() if t < now):
            self._pop(self.leaving, uid)
            self.gen += 1
            pod = self.cluster.pods.get(uid)
            if pod is not None:
                self._upsert(objects.pod(pod.raw))
        self._earliest = min(
            [n.expires for n in self.nominations.values()] + list(self.leaving.values()), default=None
        )

    # ---- deciding ----------------------------------------------------------------------

    def _decide(self, pod: Pod, seq: int, now: int) -> list[Decided]:
        self._deciding = True
        d = self.decide(self.cluster, [pod], now=now, config=self.config, index=self.index)
        self._deciding = False
        if d.outcome == WAIT:
            self._add(self.waiting, pod.uid)
        else:
            self._discard(self.waiting, pod.uid)
        self._queue(pod.uid, now)
        if d.outcome == WAIT and pod.uid in self.nominations:
            # Its own preemption is under way (victims still terminating on the node it was
            # nominated to): the answer it has stands, nothing to record.
            return []
        fingerprint = (
            f"{d.outcome}|{d.node}|{sorted((d.placements or {}).items())}|{[v.uid for v in d.victims]}"
        )
        if self.last.get(pod.uid) == fingerprint:
            return []
        self._set(self.last, pod.uid, fingerprint)
        decided = self._record(d, seq, now, pod)
        if d.outcome == PREEMPT:
            self._apply(d, decided.record["id"], now)
        return [decided]

    def _apply(self, d: Decision, decision_id: str, now: int) -> None:
        expires = now + NOMINATION_TTL_SECONDS * timeutil.SECOND
        for v in d.victims:
            pod = self.cluster.pods.get(v.uid)
            if pod is not None and not pod.deleting:
                self._upsert(dataclasses.replace(pod, deleting=True, disruption_target=True, preempted=True))
                self._set(self.leaving, v.uid, expires)
                self._earliest = expires if self._earliest is None else min(self._earliest, expires)
        targets = d.placements or ({d.preemptor_uid: d.node} if d.node else {})
        for member, node in sorted(targets.items()):
            uid = member if member in self.cluster.pods else self._uid_of(member)
            pod = self.cluster.pods.get(uid) if uid else None
            if pod is None or node is None:
                continue
            self._set(self.nominations, pod.uid, Nomination(node, decision_id, now, expires))
            self._earliest = expires if self._earliest is None else min(self._earliest, expires)
            self._upsert(dataclasses.replace(pod, nominated=node))

    def _uid_of(self, key: str) -> str | None:
        namespace, _, name = key.partition("/")
        for pod in self.cluster.pods.values():
            if pod.namespace == namespace and pod.name == name:
                return pod.uid
        return None

    def _record(self, d: Decision, seq: int, now: int, pod: Pod) -> Decided:
        decision_id = f"{self.cluster_name}/{seq}/{pod.uid}"
        rec: dict[str, Any] = {
            "v": VERSION,
            "id": decision_id,
            "cluster": self.cluster_name,
            "seq": seq,
            "ts": timeutil.render(now),
            "flow": d.flow,
            "preemptor": d.preemptor,
            "preemptorUid": d.preemptor_uid,
            "outcome": d.outcome,
        }
        if d.placements is not None:
            rec["placements"] = dict(sorted(d.placements.items()))
            # Every member's uid: the actuator checks each live member against it before it
            # evicts for the gang (a member re-created or invented is refused).
            uids = dict(zip(d.members, d.member_uids, strict=True))
            rec["memberUids"] = {key: uids[key] for key in rec["placements"] if key in uids}
        elif d.node is not None:
            rec["node"] = d.node
        rec["victims"] = [v.to_json() for v in d.victims]
        rec["reason"] = d.reason
        rec["explanation"] = d.explanation
        rec["configHash"] = self._config_hash
        rec["engineVersion"] = ENGINE_VERSION
        chain.seal(rec, self.prev_hash, self.key, self.install)
        encoded = orjson.dumps(rec)
        size = len(encoded)
        if size > self.max_record_bytes:
            # The victims are what the actuator needs; the explanation is what can give way.
            # Replaced here, before the hash, so `replay` re-derives the same bytes.
            explained = len(orjson.dumps(rec["explanation"]))
            rec["explanation"] = {
                "truncated": True,
                "bytes": explained,
                "reason": f"the explanation ({explained} bytes) would make the record exceed "
                f"{self.max_record_bytes} bytes",
            }
            chain.seal(rec, self.prev_hash, self.key, self.install)
            encoded = orjson.dumps(rec)
            size = len(encoded)
            if size > self.max_record_bytes:
                raise DecisionTooLarge(
                    f"decision {decision_id} is {size} bytes without its explanation "
                    f"({len(d.victims)} victims); the limit is {self.max_record_bytes}"
                )
        self.decisions += 1
        self.last_seq = seq
        self.last_id = decision_id
        self.prev_hash = rec["hash"]
        return Decided(rec, encoded)  # type: ignore[arg-type]

    # ---- changes, each noted in the undo log before it is made -----------------------------

    def _upsert(self, record: Record) -> None:
        self._undo.table(*record_key(record))
        self.cluster.upsert(record)

    def _remove(self, kind: str, key: str) -> None:
        self._undo.table(kind, key)
        self.cluster.remove(kind, key)

    def _set(self, d: dict[str, Any], k: str, v: Any) -> None:
        self._undo.key(d, k)
        d[k] = v

    def _pop(self, d: dict[str, Any], k: str) -> None:
        if k in d:
            self._undo.key(d, k)
            del d[k]

    def _add(self, s: set[str], x: str) -> None:
        if x not in s:
            self._undo.member(s, x)
            s.add(x)

    def _discard(self, s: set[str], x: str) -> None:
        if x in s:
            self._undo.member(s, x)
            s.discard(x)

    # ---- persistence -------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything besides the objects themselves that a restart must restore."""
        return {
            "cluster": self.cluster_name,
            "seq": self.seq,
            "prevHash": self.prev_hash,
            "decisions": self.decisions,
            "lastDecisionSeq": self.last_seq,
            "lastDecisionId": self.last_id,
            # Sorted: a rolled-back event restores these maps' contents, not their order
            # (fold.undo), and nothing reads their order.
            "nominations": dict(sorted(self.nominations.items())),  # orjson writes the dataclasses
            "leaving": dict(sorted(self.leaving.items())),
            "last": dict(sorted(self.last.items())),
            "waiting": sorted(self.waiting),
            # The fields in order, as dataclasses.astuple would give them (it deep-copies each
            # value, and this runs for every pending preemptor at every store write).
            "retry": {u: (r.attempts, r.due, r.since, r.gen, r.at) for u, r in sorted(self.retry.items())},
            "gen": self.gen,
            "clock": self.clock,
            "scope": None if self.scope is None else list(self.scope),
            "tolerationChecked": self.toleration_checked,
            "resync": None if self.resync is None else sorted(self.resync),
            "tombstones": self.cluster.tombstones,
        }

    @classmethod
    def restore(
        cls,
        *,
        config: Config,
        key: bytes | None,
        state: Mapping[str, Any],
        objects_raw: Iterable[Mapping[str, Any]],
        decide: Decide = flows.decide,
        install: str | None = chain.DEFAULT_INSTALL,
    ) -> Controller:
        ctl = cls(str(state["cluster"]), config, key, decide, install=install)
        ctl.cluster = cluster_mod.build([objects.normalize(o) for o in objects_raw])
        ctl.index = Index(ctl.cluster, lasting=True)
        ctl.seq = int(state["seq"])
        ctl.prev_hash = str(state["prevHash"])
        ctl.decisions = int(state.get("decisions", 0))
        ctl.last_seq = int(state.get("lastDecisionSeq", -1))
        ctl.last_id = str(state.get("lastDecisionId", ""))
        # From a store the nominations are JSON objects; from `state()` in-process, records.
        ctl.nominations = {
            u: n if isinstance(n, Nomination) else Nomination(**n) for u, n in state["nominations"].items()
        }
        ctl.leaving = {u: int(t) for u, t in state["leaving"].items()}
        ctl.last = dict(state["last"])
        ctl.waiting = set(state["waiting"])
        # Absent from a store written before re-decisions existed: nothing queued then.
        ctl.retry = {u: Retry(*(int(x) for x in r)) for u, r in (state.get("retry") or {}).items()}
        ctl.gen = int(state.get("gen", 0))
        ctl.clock = int(state.get("clock", 0))
        ctl.scope = None if state.get("scope") is None else tuple(state["scope"])
        ctl.toleration_checked = int(state.get("tolerationChecked", 0))
        ctl._rebuild_timers()
        ctl.resync = None if state.get("resync") is None else set(state["resync"])
        ctl.cluster.tombstones.update(state.get("tombstones", {}))
        ctl._earliest = min(
            [n.expires for n in ctl.nominations.values()] + list(ctl.leaving.values()), default=None
        )
        # Re-apply the overlays that are this controller's own knowledge.
        for uid in sorted(ctl.leaving):
            pod = ctl.cluster.pods.get(uid)
            if pod is not None and not pod.deleting:
                ctl.cluster.upsert(
                    dataclasses.replace(pod, deleting=True, disruption_target=True, preempted=True)
                )
        for uid, nom in sorted(ctl.nominations.items()):
            pod = ctl.cluster.pods.get(uid)
            if pod is not None and pod.node is None and pod.nominated != nom.node:
                ctl.cluster.upsert(dataclasses.replace(pod, nominated=nom.node))
        ctl.warm()
        return ctl

    def warm(self) -> None:
        """Build the index's summaries and the rankings of the pods waiting for a decision, now.

        At restore, not at the first decision after it (which would pay for every
        node's summary). The instant is the latest this state records (a nomination's);
        rankings built for an earlier one catch up exactly when first used.
        """
        cluster = self.cluster
        now = max((n.since for n in self.nominations.values()), default=0)
        pending = []
        for uid in sorted(self.waiting):
            pod = cluster.pods.get(uid)
            if pod is not None and pod.node is None and flows.select_flow(cluster, [pod]) == "default":
                pending.append(Preemptor(pod, cluster.priority(pod), pod.requests))
        self.index.warm(pending, now, self.config.victim_selection)
