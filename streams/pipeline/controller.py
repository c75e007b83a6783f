"""The controller: folds a cluster's event log into state and turns it into decision records.

This is the deterministic heart of the worker, `replay` and the simulator: the
same events in the same order give byte-identical decision records, because
"now" is the event's `ts`, ties are broken by stable keys, and every piece of
state that influences a decision (objects, nominations, leaving victims, the
hash-chain head, the event sequence number) lives here and is persisted
together by the store, with the log position it reflects.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine import ENGINE_VERSION, flows, objects, timeutil
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import PREEMPT, WAIT, Decision
from engine.errors import EngineError
from engine.index import Index
from engine.objects import Pod
from schemas import VERSION, chain
from schemas.records import DecisionRecord

# A nomination (and the "leaving" mark on its victims) that the cluster has not
# confirmed within this much log time is dropped, so a lost eviction cannot hold
# capacity forever (kube-scheduler clears stale nominations the same way).
NOMINATION_TTL_SECONDS = 300


class BadEvent(ValueError):
    """One event that cannot be folded (malformed object, unknown kind): dead-lettered, flow continues."""


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

    def __post_init__(self) -> None:
        self.index = Index(self.cluster)
        self._config_hash = self.config.hash()

    # ---- folding -----------------------------------------------------------------------

    def handle(self, event: Mapping[str, Any]) -> list[DecisionRecord]:
        """Fold one event (already shape-checked) and return the decisions it leads to."""
        seq = self.seq
        self.seq += 1
        try:
            now = timeutil.parse(event["ts"], field="ts")
        except EngineError as exc:
            raise BadEvent(str(exc)) from exc
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
                    self.waiting.discard(uid)
                    continue
                out.extend(self._decide(pod, seq, now))
            return out
        obj = event["object"]
        try:
            key, changed = self.cluster.apply(kind, obj)
        except EngineError as exc:
            raise BadEvent(str(exc)) from exc
        if self.resync is not None:
            self.resync.add(key)
        if not changed:
            return out
        self.dirty[key] = None if kind == "DELETED" else obj
        if obj.get("kind") == "Pod":
            out.extend(self._pod_changed(key.split("/", 1)[1], seq, now))
        return out

    def _pod_changed(self, uid: str, seq: int, now: int) -> list[DecisionRecord]:
        pod = self.cluster.pods.get(uid)
        if uid in self.leaving:
            if pod is None or pod.deleting or pod.terminal:
                del self.leaving[uid]  # the cluster confirms it is going
            else:
                # Our eviction has not shown up yet: it stays leaving, not a fresh victim again.
                self.cluster.upsert(dataclasses.replace(pod, deleting=True, disruption_target=True))
        if pod is None or pod.node is not None:
            self.last.pop(uid, None)  # bound or gone: its last answer is history
        if pod is None or pod.node is not None or pod.terminal:
            self.nominations.pop(uid, None)
            self.waiting.discard(uid)
            return []
        nom = self.nominations.get(uid)
        if nom is not None and pod.unschedulable_since is not None and pod.unschedulable_since > nom.since:
            # The scheduler tried the pod again after our decision: that nomination is over.
            del self.nominations[uid]
            nom = None
        if nom is not None:
            if pod.nominated != nom.node:
                # The API has not caught up with our nomination yet: keep promising the capacity.
                pod = dataclasses.replace(pod, nominated=nom.node)
                self.cluster.upsert(pod)
            return []  # its preemption is under way; the scheduler has not retried it since
        if pod.unschedulable and not pod.deleting:
            return self._decide(pod, seq, now)
        return []

    def _finish_resync(self) -> None:
        seen = self.resync or set()
        self.resync = None
        for kind, key in sorted(self.cluster.all_keys()):
            if f"{kind}/{key}" not in seen:
                self.cluster.remove(kind, key)
                self.dirty[f"{kind}/{key}"] = None
                if kind == "Pod":
                    self.nominations.pop(key, None)
                    self.waiting.discard(key)
                    self.leaving.pop(key, None)

    def _expire(self, now: int) -> None:
        if self._earliest is None or self._earliest >= now:
            return  # nothing can have expired: the common case, kept O(1)
        for uid in sorted(u for u, n in self.nominations.items() if n.expires < now):
            del self.nominations[uid]
            pod = self.cluster.pods.get(uid)
            if pod is not None and pod.node is None:
                self.cluster.upsert(objects.pod(pod.raw))  # back to what the API says
        for uid in sorted(u for u, t in self.leaving.items() if t < now):
            del self.leaving[uid]
            pod = self.cluster.pods.get(uid)
            if pod is not None:
                self.cluster.upsert(objects.pod(pod.raw))
        self._earliest = min(
            [n.expires for n in self.nominations.values()] + list(self.leaving.values()), default=None
        )

    # ---- deciding ----------------------------------------------------------------------

    def _decide(self, pod: Pod, seq: int, now: int) -> list[DecisionRecord]:
        d = flows.decide(self.cluster, [pod], now=now, config=self.config, index=self.index)
        if d.outcome == WAIT:
            self.waiting.add(pod.uid)
        else:
            self.waiting.discard(pod.uid)
        fingerprint = (
            f"{d.outcome}|{d.node}|{sorted((d.placements or {}).items())}|{[v.uid for v in d.victims]}"
        )
        if self.last.get(pod.uid) == fingerprint:
            return []
        self.last[pod.uid] = fingerprint
        record = self._record(d, seq, now, pod)
        if d.outcome == PREEMPT:
            self._apply(d, record["id"], now)
        return [record]

    def _apply(self, d: Decision, decision_id: str, now: int) -> None:
        expires = now + NOMINATION_TTL_SECONDS * timeutil.SECOND
        for v in d.victims:
            pod = self.cluster.pods.get(v.uid)
            if pod is not None and not pod.deleting:
                self.cluster.upsert(dataclasses.replace(pod, deleting=True, disruption_target=True))
                self.leaving[v.uid] = expires
                self._earliest = expires if self._earliest is None else min(self._earliest, expires)
        targets = d.placements or ({d.preemptor_uid: d.node} if d.node else {})
        for member, node in sorted(targets.items()):
            uid = member if member in self.cluster.pods else self._uid_of(member)
            pod = self.cluster.pods.get(uid) if uid else None
            if pod is None or node is None:
                continue
            self.nominations[pod.uid] = Nomination(node, decision_id, now, expires)
            self._earliest = expires if self._earliest is None else min(self._earliest, expires)
            self.cluster.upsert(dataclasses.replace(pod, nominated=node))

    def _uid_of(self, key: str) -> str | None:
        namespace, _, name = key.partition("/")
        for pod in self.cluster.pods.values():
            if pod.namespace == namespace and pod.name == name:
                return pod.uid
        return None

    def _record(self, d: Decision, seq: int, now: int, pod: Pod) -> DecisionRecord:
        self.decisions += 1
        self.last_seq = seq
        self.last_id = f"{self.cluster_name}/{seq}/{pod.uid}"
        rec: dict[str, Any] = {
            "v": VERSION,
            "id": self.last_id,
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
        self.prev_hash = rec["hash"]
        return rec  # type: ignore[return-value]

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
            # Insertion order is itself a function of the log, so no sorting is needed here.
            "nominations": self.nominations,  # orjson writes the dataclasses as objects
            "leaving": self.leaving,
            "last": self.last,
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
    ) -> Controller:
        ctl = cls(str(state["cluster"]), config, key)
        from engine import cluster as cluster_mod

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
                ctl.cluster.upsert(dataclasses.replace(pod, deleting=True, disruption_target=True))
        for uid, nom in sorted(ctl.nominations.items()):
            pod = ctl.cluster.pods.get(uid)
            if pod is not None and pod.node is None and pod.nominated != nom.node:
                ctl.cluster.upsert(dataclasses.replace(pod, nominated=nom.node))
        return ctl
