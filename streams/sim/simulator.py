"""The simulated cluster: a discrete-event simulation of what a cluster does with decisions.

A trace is what the cluster did on its own. The simulator merges it with the
cluster's reactions, on the log's clock (docs/architecture.md §5):
- the actuator's effects: fresh victims get a deletionTimestamp and the
  DisruptionTarget condition at the decision's time (or the soft-eviction label),
  the preemptor its nominatedNodeName; victims are DELETED after their grace period;
  an OUTCOME event says what was done (a decision for a preemptor already bound or
  gone is refused, as the actuator refuses it);
- kube-scheduler's binding role: whenever capacity may have freed up, pending pods
  that fit now are bound in priority order (a nominated pod to its nominated node
  first, never into capacity promised to a higher-priority nominated pod), and a
  pending pod it cannot bind is marked PodScheduled=False/Unschedulable, which is
  what asks the controller for a decision;
- periodic TICK events while time passes, so waits can expire.

Events are ordered by (ts, origin, n): immediate reactions first (they happen
as the decision is made), then trace events, then delayed reactions (deletions);
n is creation order. Reactions get resourceVersions above every one in the
trace. The result is the same full log, and so the same decisions, every run.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from engine import cluster as cluster_mod
from engine import default, objects, timeutil
from engine.cluster import Cluster
from engine.config import Config
from engine.errors import EngineError
from engine.index import Index
from engine.objects import Pod
from fold.controller import BadEvent
from fold.fleet import Fleet, Result
from schemas import records
from schemas.records import ClusterEvent

IMMEDIATE, TRACE, DELAYED = -1, 0, 1
# Log time between TICK events the simulator writes while the cluster is quiet.
TICK_SECONDS = 10
# Ticks written into one quiet gap at most; a longer gap gets its last tick at
# the gap's end, which is all a wait needs to expire.
MAX_TICKS_PER_GAP = 30
SOFT_EVICTION = "scheduling.koordinator.sh/soft-eviction"


# Digits of a resourceVersion the simulator counts on (etcd's revisions are int64: 19 digits);
# a longer one is garbage, and converting a huge digit string costs time.
RV_MAX_DIGITS = 20


def _rv(obj: Any) -> int:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    value = meta.get("resourceVersion") if isinstance(meta, dict) else None
    value = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else "0"
    return int(value) if value.isdigit() and len(value) <= RV_MAX_DIGITS else 0


def _garbage(event: Mapping[str, Any]) -> bool:
    """An event the controller rejects (records.event_problem, a bad cluster name): never observed."""
    return bool(
        records.event_problem(event) or records.cluster_problem(event.get("cluster", records.DEFAULT_CLUSTER))
    )


class Simulator:
    def __init__(self, trace: Sequence[Mapping[str, Any]]) -> None:
        names = {e.get("cluster", records.DEFAULT_CLUSTER) for e in trace if not _garbage(e)}
        if len(names) > 1:
            raise ValueError(f"a simulated trace holds one cluster, this one has {len(names)}")
        self.cluster = names.pop() if names else records.DEFAULT_CLUSTER
        self._queue: list[tuple[int, int, int, dict[str, Any]]] = []
        self._applied: set[int] = set()  # queue entries the view must not take (again)
        self._n = 0
        self._rv = max((_rv(e.get("object") or {}) for e in trace), default=0)
        at = 0
        for event in trace:
            try:
                if _garbage(event):
                    raise EngineError("rejected by the controller")
                at = timeutil.parse(event["ts"])
            except EngineError:
                # Garbage in the trace: it keeps its place in the log, the controller rejects
                # it (as the worker dead-letters it), and the cluster never sees it.
                self._push(at, TRACE, dict(event), applied=True)
                continue
            self._push(at, TRACE, dict(event))
        self.view = Cluster()  # the cluster as the API server has it
        self._index = Index(self.view, lasting=True)
        self.raw: dict[str, dict[str, Any]] = {}  # pod uid -> the API's current raw pod
        self._unnominated: set[str] = set()  # pending pods without a nomination
        self._arrived: set[str] = set()  # pods that became or stayed pending since the last pass
        self._freed: set[str] = set()  # nodes whose free capacity may have grown
        self._now = self._queue[0][0] if self._queue else 0
        self._last_tick = self._now

    # ---- the event stream --------------------------------------------------------------

    def _push(self, ts: int, origin: int, event: dict[str, Any], *, applied: bool = False) -> None:
        self._n += 1
        if applied:
            self._applied.add(self._n)
        heapq.heappush(self._queue, (ts, origin, self._n, event))

    def __iter__(self) -> Iterator[ClusterEvent]:
        while self._queue:
            ts, origin, n, event = self._queue[0]
            tick_at = self._last_tick + TICK_SECONDS * timeutil.SECOND
            if tick_at < ts:
                gap_ticks = (ts - self._last_tick) // (TICK_SECONDS * timeutil.SECOND)
                if gap_ticks > MAX_TICKS_PER_GAP:
                    tick_at = self._last_tick + (gap_ticks - 1) * TICK_SECONDS * timeutil.SECOND
                self._last_tick = tick_at
                self._now = tick_at
                yield {"ts": timeutil.render(tick_at), "type": "TICK", "cluster": self.cluster}
                continue
            heapq.heappop(self._queue)
            self._now = ts
            if event["type"] == "TICK":
                self._last_tick = ts
            if origin != TRACE and "object" in event:
                self._rv += 1
                event["object"].setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            if n not in self._applied:
                self._observe(event)
            self._applied.discard(n)
            yield event  # type: ignore[misc]
            if self._freed or self._arrived:
                self._schedule()

    def _observe(self, event: Mapping[str, Any]) -> None:
        """Apply an event to the view and note what the scheduler must look at next.

        Only capacity that grew (a pod gone or finished, a node added or changed) can
        let a waiting pod bind, and only a pod that just became pending needs a first
        look; tracking both keeps each pass to the pods that could change.
        """
        if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
            return
        obj = event["object"]
        kind = obj.get("kind")
        try:
            raw = orjson.loads(records.encode_object(obj))  # the API's copy; ObjectTooDeep as the controller
            key = cluster_mod.table_key(obj)
            old = self.view.pods.get(key) if kind == "Pod" else None
            if event["type"] == "DELETED":
                self.view.remove(str(kind), key)
                if kind == "Pod":
                    self.raw.pop(key, None)
                    self._unnominated.discard(key)
                    if old is not None and old.node is not None:
                        self._freed.add(old.node)
                return
            record = objects.normalize(obj)
        except Exception:  # malformed input is the controller's to dead-letter, not the cluster's
            return
        self.view.upsert(record)
        if isinstance(record, Pod):
            self.raw[record.uid] = raw
            if record.node is None and not record.terminal:
                if record.nominated is None:
                    self._unnominated.add(record.uid)
                else:
                    self._unnominated.discard(record.uid)
                self._arrived.add(record.uid)
            else:
                self._unnominated.discard(record.uid)
                if record.node is not None and record.terminal and not (old is not None and old.terminal):
                    self._freed.add(record.node)
        elif kind == "Node":
            self._freed.add(str(obj["metadata"]["name"]))

    def _emit(self, kind: str, obj: dict[str, Any], *, at: int, origin: int) -> None:
        event = {"ts": timeutil.render(at), "type": kind, "object": obj, "cluster": self.cluster}
        if origin == IMMEDIATE:
            self._observe(event)
            self._push(at, origin, event, applied=True)
        else:
            self._push(at, origin, event)

    # ---- reactions -----------------------------------------------------------------------

    def react(self, decisions: Sequence[Mapping[str, Any]]) -> None:
        """The actuator's effects of each preempt decision, as the cluster would show them,
        and its OUTCOME event, as streams.kube.actuator writes it.

        As the actuator does, a single-pod decision whose preemptor is gone or already
        bound is refused: no victim is touched.
        """
        for d in decisions:
            if d.get("outcome") != "preempt":
                continue
            at = timeutil.parse(d["ts"])
            results: dict[str, str] = {}
            refusal = self._refusal(d)
            for v in d.get("victims", []):
                results[v["uid"]] = self._act(v, at) if refusal is None else "error"
            nomination = refusal or "none"
            targets = d.get("placements") or {d["preemptorUid"]: d.get("node")}
            for member, node in sorted(targets.items()):
                uid = member if member in self.raw else self._uid_of(member)
                raw = self.raw.get(uid or "")
                if (
                    refusal is not None
                    or raw is None
                    or node is None
                    or (raw.get("spec") or {}).get("nodeName")
                ):
                    continue
                pod = copy.deepcopy(raw)
                pod.setdefault("status", {})["nominatedNodeName"] = node
                self._emit("MODIFIED", pod, at=at, origin=IMMEDIATE)
                nomination = "done"
            outcome: dict[str, Any] = {
                "decisionId": d["id"],
                "preemptorUid": d.get("preemptorUid", ""),
                "nomination": nomination,
                "victims": results,
            }
            if refusal is not None:
                outcome["message"] = f"preemptor {d['preemptor']} is {refusal}: no victim was touched"
            event = {
                "ts": timeutil.render(at),
                "type": "OUTCOME",
                "outcome": outcome,
                "cluster": self.cluster,
            }
            self._push(at, IMMEDIATE, event, applied=True)

    def _refusal(self, d: Mapping[str, Any]) -> str | None:
        """Why the actuator would refuse a single-pod decision (gone, bound), or None."""
        if d.get("placements"):
            return None
        raw = self.raw.get(str(d.get("preemptorUid") or ""))
        if raw is None:
            return "gone"
        if (raw.get("spec") or {}).get("nodeName"):
            return "bound"
        return None

    def _act(self, v: Mapping[str, Any], at: int) -> str:
        """One victim's eviction as the cluster shows it; its result."""
        raw = self.raw.get(v["uid"])
        if raw is None:
            return "already-gone"
        if v.get("terminating") or (raw.get("metadata") or {}).get("deletionTimestamp"):
            return "already-terminating"
        pod = copy.deepcopy(raw)
        meta = pod.setdefault("metadata", {})
        if v["action"] == "label":
            meta.setdefault("labels", {})[SOFT_EVICTION] = "true"
        else:
            meta["deletionTimestamp"] = timeutil.render(at)
            grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            meta["deletionGracePeriodSeconds"] = grace
            conds = pod.setdefault("status", {}).setdefault("conditions", [])
            conds.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "lastTransitionTime": timeutil.render(at),
                }
            )
        self._emit("MODIFIED", pod, at=at, origin=IMMEDIATE)
        grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        self._emit("DELETED", copy.deepcopy(pod), at=at + grace * timeutil.SECOND, origin=DELAYED)
        return "done"

    def _uid_of(self, key: str) -> str | None:
        namespace, _, name = key.partition("/")
        for uid, raw in self.raw.items():
            meta = raw.get("metadata") or {}
            if meta.get("name") == name and (meta.get("namespace") or "default") == namespace:
                return uid
        return None

    def _leaving(self, pod: Pod) -> bool:
        state = self.view.nodes.get(pod.nominated or "")
        prio = self.view.priority(pod)
        return state is not None and any(
            p.deleting and self.view.priority(p) < prio for p in state.pods.values()
        )

    def _schedule(self) -> None:
        """kube-scheduler's part: bind what fits now, mark the rest Unschedulable (once)."""
        look = set(self._arrived)
        if self._freed:
            look |= self._unnominated
            for node in self._freed:
                look |= set(self.view.nominated_on(node))
        self._arrived.clear()
        self._freed.clear()
        pods = [self.view.pods[u] for u in look if u in self.view.pods]
        pending = sorted(
            (p for p in pods if p.node is None and not p.terminal and not p.deleting),
            key=lambda p: (-self.view.priority(p), p.created or 0, p.uid),
        )
        for pod in pending:
            # With the inter-pod filters (default.preemptor): a pod whose host port, pod
            # (anti-)affinity or spread kube-scheduler would refuse stays unbound here too.
            scan = self._index.scan(default.preemptor(self.view, pod), self._now, "kubernetes")
            raw = copy.deepcopy(self.raw[pod.uid])
            status = raw.setdefault("status", {})
            if scan.fitting is not None:
                raw.setdefault("spec", {})["nodeName"] = scan.fitting
                status.pop("nominatedNodeName", None)
                status["phase"] = "Running"
                status["startTime"] = timeutil.render(self._now)
                status["conditions"] = [
                    c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"
                ] + [
                    {
                        "type": "PodScheduled",
                        "status": "True",
                        "lastTransitionTime": timeutil.render(self._now),
                    }
                ]
                self._emit("MODIFIED", raw, at=self._now, origin=IMMEDIATE)
            elif not pod.unschedulable or (pod.nominated and not self._leaving(pod)):
                # Not bindable: ask for preemption, and drop a nomination whose victims are gone
                # (someone else took the room), as kube-scheduler does when it retries the pod.
                status.pop("nominatedNodeName", None)
                status["conditions"] = [
                    c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"
                ] + [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "lastTransitionTime": timeutil.render(self._now),
                    }
                ]
                self._emit("MODIFIED", raw, at=self._now, origin=IMMEDIATE)


def simulate(trace: Sequence[Mapping[str, Any]], config: Config, *, key: bytes | None = None) -> Result:
    fleet = Fleet(config, key)
    sim = Simulator(trace)
    result = Result()
    for n, event in enumerate(sim):
        event = dict(event, cluster=event.get("cluster", records.DEFAULT_CLUSTER))  # type: ignore[assignment]
        result.log.append(event)  # type: ignore[arg-type]
        result.events += 1
        try:
            decisions = fleet.step(event).records
        except BadEvent as exc:
            result.bad.append((n, str(exc)))
            continue
        result.decisions.extend(decisions)
        sim.react(decisions)
    return result
