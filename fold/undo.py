"""The undo log that makes folding one event atomic: every change the controller makes, reversible.

The controller opens an `Undo` for each event and notes each change *before*
making it: a key of one of its own maps or sets, an object of the cluster index
(its record before, or its absence), a tombstone. If anything raises while the
event is folded or decided, `rollback` restores exactly the state before the
event, newest change first, and the event is rejected (dead-lettered) instead
of stalling the partition. Nothing here knows the engine's internals beyond its
public tables: objects are put back through `Cluster.upsert` and `Cluster.remove`,
which keep the derived indexes (node usage, nominations, PDBs) in step.

What comes back is every key and value; the insertion order of a map comes back
only where it matters: the tombstones (the oldest is evicted first). The
controller's own maps are persisted sorted, and the engine orders what it
iterates by stable keys (docs/architecture.md §2), so their order carries no meaning.
A note is one tuple; nothing is copied on the common path.
"""

from __future__ import annotations

from typing import Any

from engine import cluster as cluster_mod
from engine.cluster import Cluster
from engine.objects import ElasticQuota, Namespace, Node, Pdb, Pod, PriorityClass, Record

_MISSING: Any = object()
# What a note restores (the first item of its tuple).
_KEY, _MEMBER, _TABLE, _TOMBSTONES = range(4)


def table_record(cluster: Cluster, kind: str, key: str) -> Record | None:
    """The record the index holds for (kind, table key), or None."""
    if kind == "Pod":
        return cluster.pods.get(key)
    if kind == "Node":
        state = cluster.nodes.get(key)
        return state.node if state is not None else None
    if kind == "PriorityClass":
        return cluster.priority_classes.get(key)
    if kind == "PodDisruptionBudget":
        return cluster.pdbs.get(key)
    if kind == "ElasticQuota":
        return cluster.quotas.get(key)
    if kind == "Namespace":
        return cluster.namespaces.get(key)
    return None


def record_key(record: Record) -> tuple[str, str]:
    """(kind, table key) of a normalised record, as Cluster.apply keys it."""
    if isinstance(record, Pod):
        return "Pod", record.uid
    if isinstance(record, Node):
        return "Node", record.name
    if isinstance(record, PriorityClass):
        return "PriorityClass", record.name
    if isinstance(record, Pdb):
        return "PodDisruptionBudget", record.uid
    if isinstance(record, Namespace):
        return "Namespace", record.name
    assert isinstance(record, ElasticQuota)
    return "ElasticQuota", record.uid


class Undo:
    """Changes made while folding one event, newest last."""

    __slots__ = ("_notes", "cluster")

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._notes: list[tuple[Any, ...]] = []

    def key(self, d: dict[Any, Any], k: Any) -> None:
        """Before `d[k] = ...` or `del d[k]`: the value it has now, or that it has none."""
        self._notes.append((_KEY, d, k, d.get(k, _MISSING)))

    def member(self, s: set[Any], x: Any) -> None:
        """Before adding `x` to or discarding it from `s`."""
        self._notes.append((_MEMBER, s, x, x in s))

    def table(self, kind: str, key: str) -> None:
        """Before an upsert or removal of (kind, key): the record held now, or that there is none."""
        cluster = self.cluster
        if kind == "Pod":  # nearly every event: straight to the table
            self._notes.append((_TABLE, kind, key, cluster.pods.get(key), _MISSING))
            return
        # Only a PriorityClass carries a warning (an unparsable toleration annotation).
        warning = cluster.warnings.get(f"{kind}/{key}", _MISSING) if kind == "PriorityClass" else _MISSING
        self._notes.append((_TABLE, kind, key, table_record(cluster, kind, key), warning))

    def tombstone(self, key: str) -> None:
        """Before Cluster.apply touches the tombstone of `key` (set, cleared, or the oldest evicted)."""
        tombs = self.cluster.tombstones
        if key in tombs or len(tombs) >= cluster_mod.MAX_TOMBSTONES:
            # Cleared and set again, or the oldest evicted: the order changes, and it decides
            # which tombstone goes next. Rare (a name re-created, a full table): copy it all.
            self._notes.append((_TOMBSTONES, dict(tombs)))
        else:
            self._notes.append((_KEY, tombs, key, _MISSING))

    def forget(self) -> None:
        """The event is done (folded, or rolled back): its notes are no longer needed."""
        self._notes.clear()

    def rollback(self) -> None:
        """Undo every noted change, newest first."""
        cluster = self.cluster
        for note in reversed(self._notes):
            what = note[0]
            if what == _KEY:
                _, d, k, old = note
                if old is _MISSING:
                    d.pop(k, None)
                else:
                    d[k] = old
            elif what == _MEMBER:
                _, s, x, was = note
                if was:
                    s.add(x)
                else:
                    s.discard(x)
            elif what == _TABLE:
                _, kind, key, old, warning = note
                if old is None:
                    cluster.remove(kind, key)
                else:
                    cluster.upsert(old)
                if kind == "PriorityClass":
                    # Cluster.remove leaves a class's warning behind: put back exactly what was.
                    if warning is _MISSING:
                        cluster.warnings.pop(f"{kind}/{key}", None)
                    else:
                        cluster.warnings[f"{kind}/{key}"] = warning
            else:
                _, copy = note
                cluster.tombstones.clear()
                cluster.tombstones.update(copy)
        self._notes.clear()
