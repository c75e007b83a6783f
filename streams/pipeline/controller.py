"""The controller: folds a cluster's event log into state and turns it into decision records.

This is the deterministic heart of the worker, `replay` and the simulator: the
same events in the same order give byte-identical decision records, because
"now" is the event's `ts`, ties are broken by stable keys, and every piece of
state that influences a decision (objects, nominations, leaving victims, the
hash-chain head, the event sequence number) lives here and is persisted
together by the store, with the log position it reflects.

Folding one event is atomic: every change is noted in an undo log
(streams.pipeline.undo) before it is made, and any exception while the event
is folded or decided (a malformed object, an engine error, a decision too large
to publish) rolls the controller back to exactly its state before the event and
raises BadEvent. A rejected event takes no sequence number, so a log with bad
events folds to the same state and decisions as the log without them, wherever
it is folded (worker, `replay`, the simulator).

Decisions are made when a pending pod is found unschedulable (PodScheduled
False/Unschedulable), and on TICK for pods whose last answer was `wait`. A
decision record is emitted when the answer for a preemptor changes, so a pod
re-reported as unschedulable while its preemption is under way does not flood
the log. After a `preempt`, the controller applies the decision to its own view
at once (victims leaving, preemptor nominated): capacity is never promised
twice and a pod is a fresh victim of at most one live decision (DESIGN §3.3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from engine import ENGINE_VERSION, flows, objects, timeutil
from engine import cluster as cluster_mod
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import PREEMPT, WAIT, Decision
from engine.index import Index
from engine.objects import Pod, Record
from schemas import VERSION, chain, records
from schemas.records import DecisionRecord
from streams.kafka import topics
from streams.pipeline.undo import Undo, record_key

# A nomination (and the "leaving" mark on its victims) that the cluster has not
# confirmed within this much log time is dropped, so a lost eviction cannot hold
# capacity forever (kube-scheduler clears stale nominations the same way).
NOMINATION_TTL_SECONDS = 300


# A decision record is published as one Kafka record: larger than this and the broker
# would refuse it (topics.VALUE_MAX_BYTES), so its explanation is replaced by a marker.
DECISION_MAX_BYTES = topics.VALUE_MAX_BYTES

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
    """records.event_problem(event) is None, checked inline: it runs for every event."""
    if not isinstance(event, dict):
        return False
    kind = event.get("type")
    if not isinstance(event.get("ts"), str):
        return False
    if kind in records.OBJECT_EVENTS:
        return isinstance(event.get("object"), dict)
    return kind in records.EVENT_TYPES


class BadEvent(ValueError):
    """One event that could not be folded or decided: rejected (dead-lettered), the controller unchanged.

    `error_class` names the original exception (AttributeError, InvalidObject, ...).
    """

    def __init__(self, reason: str, error_class: str = "BadEvent") -> None:
        super().__init__(reason)
        self.error_class = error_class


class DecisionTooLarge(ValueError):
    """A decision record exceeds DECISION_MAX_BYTES even without its explanation."""


@dataclass(slots=True)
class Nomination:
    node: str
    decision_id: str
    since: int
    expires: int


@dataclass(slots=True)
class Controller:
    cluster_name: str
    config: Config
    key: bytes | None = None
    # The decision function: engine.flows.decide; a test may put a failing one here.
    decide: Decide = flows.decide
    max_record_bytes: int = DECISION_MAX_BYTES
    cluster: Cluster = field(default_factory=Cluster)
    seq: int = 0  # events handled; the next event's sequence number
    prev_hash: str = chain.GENESIS
    decisions: int = 0
    last_seq: int = -1  # sequence number of the last decision record made
    last_id: str = ""
    nominations: dict[str, Nomination] = field(default_factory=dict)
    leaving: dict[str, int] = field(default_factory=dict)  # victim uid -> expiry of our "leaving" mark
    last: dict[str, str] = field(default_factory=dict)  # preemptor uid -> fingerprint of last record
    waiting: set[str] = field(default_factory=set)
    resync: set[str] | None = None  # keys re-listed since a RESYNC, until it completes
    dirty: dict[str, Mapping[str, Any] | None] = field(default_factory=dict)  # store key -> raw object / None
    _earliest: int | None = None  # no nomination or leaving mark expires before this
    index: Index = field(init=False)
    _config_hash: str = field(init=False, default="")
    # The published bytes of the decisions the last `handle` made (encoded once, for the
    # size limit): the worker sends these rather than encoding each record again.
    encoded: dict[str, bytes] = field(init=False, default_factory=dict)
    _undo: Undo = field(init=False)
    _deciding: bool = field(init=False, default=False)  # the index's caches may be mid-update

    def __post_init__(self) -> None:
        self.index = Index(self.cluster)
        self._config_hash = self.config.hash()
        self._undo = Undo(self.cluster)  # one log, emptied after every event

    # ---- folding -----------------------------------------------------------------------

    def handle(self, event: Mapping[str, Any]) -> list[DecisionRecord]:
        """Fold one event and return the decisions it leads to; BadEvent (nothing changed) if it cannot.

        Every change is noted in the undo log first; on any exception the log is
        rolled back, so a rejected event leaves no trace, not even a sequence number.
        """
        scalars = (self.seq, self.prev_hash, self.decisions, self.last_seq, self.last_id, self._earliest)
        resync = self.resync
        undo = self._undo
        undo.cluster = self.cluster  # restore() replaces the cluster after construction
        self._deciding = False
        self.encoded.clear()
        try:
            if not _well_formed(event):
                raise BadEvent(records.event_problem(event) or "malformed event")
            return self._handle(event)
        except Exception as exc:
            undo.rollback()
            self.seq, self.prev_hash, self.decisions, self.last_seq, self.last_id, self._earliest = scalars
            self.resync = resync
            if self._deciding:
                # The engine raised while deciding: its ranking caches may be half-updated.
                # A fresh index gives the same answers (it is exact), only slower at first.
                self.index = Index(self.cluster)
            if isinstance(exc, BadEvent):
                raise
            raise BadEvent(f"{type(exc).__name__}: {exc}", type(exc).__name__) from exc
        finally:
            undo.forget()

    def _handle(self, event: Mapping[str, Any]) -> list[DecisionRecord]:
        seq = self.seq
        now = timeutil.parse(event["ts"], field="ts")
        self.seq += 1
        kind = event["type"]
        if self.resync is not None and kind != "ADDED":
            self._finish_resync()
        out: list[DecisionRecord] = []
        self._expire(now)
        if kind == "RESYNC":
            self.resync = set()
            return out
        if kind == "TICK":
            for uid in sorted(self.waiting):
                pod = self.cluster.pods.get(uid)
                if pod is None or pod.node is not None:
                    self._discard(self.waiting, uid)
                    continue
                out.extend(self._decide(pod, seq, now))
            return out
        # Cluster.apply with its changes noted. It normalises the object before it
        # changes anything, so a malformed object raises with the index untouched.
        obj = event["object"]
        object_kind = str(obj.get("kind"))
        uid = _table_key(object_kind, obj)
        undo = self._undo
        undo.table(object_kind, uid)
        if kind == "DELETED" or f"{object_kind}/{uid}" in self.cluster.tombstones:
            undo.tombstone(f"{object_kind}/{uid}")  # only then does apply touch the tombstones
        key, changed = self.cluster.apply(kind, obj)
        if self.resync is not None:
            self._add(self.resync, key)
        if not changed:
            return out
        undo.key(self.dirty, key)
        self.dirty[key] = None if kind == "DELETED" else obj
        if object_kind == "Pod":
            out.extend(self._pod_changed(key.split("/", 1)[1], seq, now))
        return out

    def _pod_changed(self, uid: str, seq: int, now: int) -> list[DecisionRecord]:
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
        if pod.unschedulable and not pod.deleting:
            return self._decide(pod, seq, now)
        return []

    def _finish_resync(self) -> None:
        seen = self.resync or set()
        self.resync = None
        for kind, key in sorted(self.cluster.all_keys()):
            if f"{kind}/{key}" not in seen:
                self._remove(kind, key)
                self._set(self.dirty, f"{kind}/{key}", None)
                if kind == "Pod":
                    self._pop(self.nominations, key)
                    self._discard(self.waiting, key)
                    self._pop(self.leaving, key)

    def _expire(self, now: int) -> None:
        if self._earliest is None or self._earliest >= now:
            return  # nothing can have expired: the common case, kept O(1)
        for uid in sorted(u for u, n in self.nominations.items() if n.expires < now):
            self._pop(self.nominations, uid)
            pod = self.cluster.pods.get(uid)
            if pod is not None and pod.node is None:
                self._upsert(objects.pod(pod.raw))  # back to what the API says
        for uid in sorted(u for u, t in self.leaving.items() if t < now):
            self._pop(self.leaving, uid)
            pod = self.cluster.pods.get(uid)
            if pod is not None:
                self._upsert(objects.pod(pod.raw))
        self._earliest = min(
            [n.expires for n in self.nominations.values()] + list(self.leaving.values()), default=None
        )

    # ---- deciding ----------------------------------------------------------------------

    def _decide(self, pod: Pod, seq: int, now: int) -> list[DecisionRecord]:
        self._deciding = True
        d = self.decide(self.cluster, [pod], now=now, config=self.config, index=self.index)
        self._deciding = False
        if d.outcome == WAIT:
            self._add(self.waiting, pod.uid)
        else:
            self._discard(self.waiting, pod.uid)
        fingerprint = (
            f"{d.outcome}|{d.node}|{sorted((d.placements or {}).items())}|{[v.uid for v in d.victims]}"
        )
        if self.last.get(pod.uid) == fingerprint:
            return []
        self._set(self.last, pod.uid, fingerprint)
        record = self._record(d, seq, now, pod)
        if d.outcome == PREEMPT:
            self._apply(d, record["id"], now)
        return [record]

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

    def _record(self, d: Decision, seq: int, now: int, pod: Pod) -> DecisionRecord:
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
        elif d.node is not None:
            rec["node"] = d.node
        rec["victims"] = [v.to_json() for v in d.victims]
        rec["reason"] = d.reason
        rec["explanation"] = d.explanation
        rec["configHash"] = self._config_hash
        rec["engineVersion"] = ENGINE_VERSION
        chain.seal(rec, self.prev_hash, self.key)
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
            chain.seal(rec, self.prev_hash, self.key)
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
        self.encoded[decision_id] = encoded
        return rec  # type: ignore[return-value]

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

    def take_dirty(self) -> dict[str, Mapping[str, Any] | None]:
        out, self.dirty = self.dirty, {}
        return out

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
            # (streams.pipeline.undo), and nothing reads their order.
            "nominations": dict(sorted(self.nominations.items())),  # orjson writes the dataclasses
            "leaving": dict(sorted(self.leaving.items())),
            "last": dict(sorted(self.last.items())),
            "waiting": sorted(self.waiting),
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
    ) -> Controller:
        ctl = cls(str(state["cluster"]), config, key, decide)
        ctl.cluster = cluster_mod.build([objects.normalize(o) for o in objects_raw])
        ctl.index = Index(ctl.cluster)
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
        return ctl
