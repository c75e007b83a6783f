"""The cluster index: the materialised state every decision reads.

Pods, nodes, PriorityClasses, PDBs and ElasticQuotas by identity, plus the
derived indexes decisions need on every call: pods bound to each node with the
node's used resources, pending pods nominated to each node, PDBs by namespace.
Updating one object is O(1) in the number of objects (dict operations plus the
pods of one node), so the streaming worker folds events straight into it.

Folding is idempotent (DESIGN §3.2): an object event whose resourceVersion is
not newer than what the index holds is ignored, and a deleted object leaves a
tombstone so a re-delivered older event cannot resurrect it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine import objects, resources, toleration
from engine.errors import InvalidObject
from engine.objects import PREEMPT_LOWER, ElasticQuota, Node, Pdb, Pod, PriorityClass, Record
from engine.resources import Resources

# Deleted objects remembered (oldest forgotten first) so a re-delivered older event
# cannot resurrect them; re-delivery reaches back minutes, not millions of deletions.
MAX_TOMBSTONES = 100_000


@dataclass(slots=True)
class NodeState:
    node: Node
    pods: dict[str, Pod] = field(default_factory=dict)  # bound, non-terminal pods by uid
    used: Resources = field(default_factory=dict)
    version: int = 0


def _newer(incoming: str, held: str) -> bool:
    """Is resourceVersion `incoming` newer than `held`? Opaque strings compare as integers when both are."""
    if not incoming or not held:
        return True
    if incoming.isdigit() and held.isdigit():
        return int(incoming) > int(held)
    return incoming != held


class Cluster:
    """Mutable, pure index of one cluster's objects."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, Pod] = {}
        self.priority_classes: dict[str, PriorityClass] = {}
        self.pdbs: dict[str, Pdb] = {}
        self.quotas: dict[str, ElasticQuota] = {}
        self._nominated: dict[str, dict[str, Pod]] = {}
        # Bound pods whose node is not (yet) known: watch order is per kind.
        self._orphans: dict[str, dict[str, Pod]] = {}
        self._pdbs_by_ns: dict[str, list[Pdb]] = {}
        self._policies: dict[str, toleration.Policy | None] = {}
        self.tombstones: dict[str, str] = {}
        # Bumped when cluster-wide inputs (classes, PDBs, quotas) change: every cached
        # per-node evaluation is then stale. Node-local changes bump NodeState.version.
        self.epoch = 0
        # Warnings for the operator (unparsable annotations); the runtime logs each once.
        self.warnings: dict[str, str] = {}
        # Names of nodes whose state changed, in order; caches replay it to stay current.
        # `touched_base` is the absolute position of touched[0] (the log is trimmed).
        self.touched: list[str] = []
        self.touched_base = 0

    # ---- queries -------------------------------------------------------------------

    def priority(self, pod: Pod) -> int:
        if pod.priority is not None:
            return pod.priority
        pc = self.priority_classes.get(pod.priority_class)
        if pc is not None:
            return pc.value
        return self._default_class_value()

    def _default_class_value(self) -> int:
        defaults = sorted(
            (pc for pc in self.priority_classes.values() if pc.global_default), key=lambda pc: pc.name
        )
        return defaults[0].value if defaults else 0

    def preemption_policy(self, pod: Pod) -> str:
        if pod.preemption_policy:
            return pod.preemption_policy
        pc = self.priority_classes.get(pod.priority_class)
        return pc.preemption_policy if pc is not None else PREEMPT_LOWER

    def policy(self, class_name: str) -> toleration.Policy | None:
        return self._policies.get(class_name)

    def tolerates(self, victim: Pod, *, preemptor_priority: int, now: int) -> bool:
        policy = self._policies.get(victim.priority_class) if victim.priority_class else None
        if policy is None:
            return False
        return toleration.tolerates(
            policy,
            victim_priority=self.priority(victim),
            preemptor_priority=preemptor_priority,
            scheduled_at=victim.scheduled_at,
            now=now,
        )

    def nominated_on(self, node: str) -> Mapping[str, Pod]:
        return self._nominated.get(node, {})

    def pdbs_in(self, namespace: str) -> list[Pdb]:
        return self._pdbs_by_ns.get(namespace, [])

    def pending(self) -> Iterator[Pod]:
        for pod in self.pods.values():
            if pod.node is None and not pod.terminal:
                yield pod

    def free(self, state: NodeState) -> Resources:
        out = dict(state.node.allocatable)
        resources.sub(out, state.used)
        return out

    # ---- updates -------------------------------------------------------------------

    def upsert(self, record: Record) -> None:
        if isinstance(record, Pod):
            self._upsert_pod(record)
        elif isinstance(record, Node):
            self._upsert_node(record)
        elif isinstance(record, PriorityClass):
            self.priority_classes[record.name] = record
            try:
                self._policies[record.name] = toleration.parse_policy(record.value, record.annotations)
                self.warnings.pop(f"PriorityClass/{record.name}", None)
            except toleration.PolicyError as exc:
                self._policies[record.name] = None
                self.warnings[f"PriorityClass/{record.name}"] = f"{exc}; toleration disabled for this class"
            self.epoch += 1
        elif isinstance(record, Pdb):
            self.pdbs[record.uid] = record
            self._reindex_pdbs()
        else:
            self.quotas[record.uid] = record
            self.epoch += 1

    def remove(self, kind: str, uid: str) -> None:
        if kind == "Pod":
            self._remove_pod(uid)
        elif kind == "Node":
            state = self.nodes.pop(uid, None)
            if state is not None:
                if state.pods:
                    self._orphans[uid] = state.pods
                self.touched.append(uid)
        elif kind == "PriorityClass":
            if self.priority_classes.pop(uid, None) is not None:
                self._policies.pop(uid, None)
                self.epoch += 1
        elif kind == "PodDisruptionBudget":
            if self.pdbs.pop(uid, None) is not None:
                self._reindex_pdbs()
        elif kind == "ElasticQuota" and self.quotas.pop(uid, None) is not None:
            self.epoch += 1

    def _reindex_pdbs(self) -> None:
        by_ns: dict[str, list[Pdb]] = {}
        for p in sorted(self.pdbs.values(), key=lambda p: (p.namespace, p.name, p.uid)):
            by_ns.setdefault(p.namespace, []).append(p)
        self._pdbs_by_ns = by_ns
        self.epoch += 1

    def _touch(self, name: str | None) -> None:
        if name is None:
            return
        state = self.nodes.get(name)
        if state is not None:
            state.version += 1
        self.touched.append(name)

    def _upsert_node(self, node: Node) -> None:
        state = self.nodes.get(node.name)
        if state is None:
            state = NodeState(node)
            self.nodes[node.name] = state
            for pod in self._orphans.pop(node.name, {}).values():
                state.pods[pod.uid] = pod
                resources.add(state.used, pod.requests)
        else:
            state.node = node
        self._touch(node.name)

    def _upsert_pod(self, pod: Pod) -> None:
        if pod.priority is None:
            # Admission stamps spec.priority from the class; do the same for hand-written objects.
            pod = dataclasses.replace(pod, priority=self.priority(pod))
        self._remove_pod(pod.uid)
        self.pods[pod.uid] = pod
        if pod.node is not None:
            if not pod.terminal:
                state = self.nodes.get(pod.node)
                if state is not None:
                    state.pods[pod.uid] = pod
                    resources.add(state.used, pod.requests)
                else:
                    self._orphans.setdefault(pod.node, {})[pod.uid] = pod
                self._touch(pod.node)
        elif pod.nominated is not None and not pod.terminal:
            self._nominated.setdefault(pod.nominated, {})[pod.uid] = pod
            self._touch(pod.nominated)

    def _remove_pod(self, uid: str) -> None:
        old = self.pods.pop(uid, None)
        if old is None:
            return
        if old.node is not None:
            state = self.nodes.get(old.node)
            if state is not None and state.pods.pop(uid, None) is not None:
                resources.sub(state.used, old.requests)
            elif old.node in self._orphans:
                self._orphans[old.node].pop(uid, None)
                if not self._orphans[old.node]:
                    del self._orphans[old.node]
            self._touch(old.node)
        elif old.nominated is not None:
            noms = self._nominated.get(old.nominated)
            if noms is not None:
                noms.pop(uid, None)
                if not noms:
                    del self._nominated[old.nominated]
            self._touch(old.nominated)

    def touched_since(self, position: int) -> list[str] | None:
        """Nodes touched since absolute log `position`; None when that part of the log is trimmed."""
        if position < self.touched_base:
            return None
        return self.touched[position - self.touched_base :]

    @property
    def touched_end(self) -> int:
        return self.touched_base + len(self.touched)

    def trim_touched(self, position: int) -> None:
        """Forget the log before `position` (every reader has passed it)."""
        drop = position - self.touched_base
        if drop > 0:
            del self.touched[:drop]
            self.touched_base = position

    # ---- event folding ---------------------------------------------------------------

    def held_version(self, kind: str, uid: str) -> str | None:
        if kind == "Pod":
            pod = self.pods.get(uid)
            return pod.resource_version if pod else self.tombstones.get(f"Pod/{uid}")
        tables: dict[str, Mapping[str, Any]] = {
            "Node": self.nodes,
            "PriorityClass": self.priority_classes,
            "PodDisruptionBudget": self.pdbs,
            "ElasticQuota": self.quotas,
        }
        held = tables.get(kind, {}).get(uid)
        if held is None:
            return self.tombstones.get(f"{kind}/{uid}")
        record = held.node if isinstance(held, NodeState) else held
        return str(record.resource_version)

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> tuple[str, bool]:
        """Fold one watch event: its "Kind/key", and False when it was stale (already reflected)."""
        kind = obj.get("kind")
        if kind not in objects.KINDS:
            raise InvalidObject(f"unsupported kind {kind!r}")
        record_uid = _table_key(obj)
        incoming = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        held = self.held_version(str(kind), record_uid)
        key = f"{kind}/{record_uid}"
        if held is not None and incoming and not _newer(incoming, held):
            return key, False
        if event_type == "DELETED":
            self.remove(str(kind), record_uid)
            if incoming:
                self.tombstones[key] = incoming
                if len(self.tombstones) > MAX_TOMBSTONES:
                    del self.tombstones[next(iter(self.tombstones))]
            return key, True
        record = objects.normalize(obj)
        self.tombstones.pop(key, None)
        self.upsert(record)
        return key, True

    def all_keys(self) -> set[tuple[str, str]]:
        """Every (kind, table key) held: what a RESYNC compares the relist against."""
        keys = {("Pod", uid) for uid in self.pods}
        keys |= {("Node", n) for n in self.nodes}
        keys |= {("PriorityClass", n) for n in self.priority_classes}
        keys |= {("PodDisruptionBudget", u) for u in self.pdbs}
        keys |= {("ElasticQuota", u) for u in self.quotas}
        return keys


def _table_key(obj: Mapping[str, Any]) -> str:
    """Pods, PDBs and quotas are keyed by uid; nodes and classes by name (cluster-scoped, unique)."""
    kind = obj.get("kind")
    if kind in ("Node", "PriorityClass"):
        meta = obj.get("metadata") or {}
        name = meta.get("name") if isinstance(meta, dict) else None
        if not name:
            raise InvalidObject(f"{kind} without metadata.name")
        return str(name)
    return objects.object_uid(obj)


def table_key(obj: Mapping[str, Any]) -> str:
    return _table_key(obj)


def build(records: list[Record]) -> Cluster:
    """A cluster from a set of records, in an order that does not depend on the input order."""
    cluster = Cluster()
    rank = {PriorityClass: 0, Node: 1, Pdb: 2, ElasticQuota: 3, Pod: 4}
    for record in sorted(records, key=lambda r: (rank[type(r)], _sort_id(r))):
        cluster.upsert(record)
    return cluster


def _sort_id(record: Record) -> str:
    return record.name if isinstance(record, (Node, PriorityClass)) else record.uid
