"""The undo log that makes folding one event atomic: every change the controller makes, reversible.

The controller opens an `Undo` for each event and notes each change *before*
making it: a key of one of its own maps or sets, an object of the cluster index
(its record before, or its absence), a tombstone. If anything raises while the
event is folded or decided, `rollback` restores exactly the state before the
event, newest change first, and the event is rejected (dead-lettered) instead
of stalling the partition. Nothing here knows the engine's internals beyond its
public tables: objects are put back through `Cluster.upsert` and `Cluster.remove`,
which keep the derived indexes (node usage, nominations, PDBs) in step.

Costs are paid by changes, not by state size: a note is one tuple, except the
first *deletion* from an ordered map in an event, which copies that map so its
insertion order (part of the persisted state, DESIGN §3.1) comes back exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine import cluster as cluster_mod
from engine.cluster import Cluster
from engine.objects import ElasticQuota, Node, Pdb, Pod, PriorityClass, Record

_MISSING: Any = object()


def table_record(cluster: Cluster, kind: str, key: str) -> Record | None:
    """The record the index holds for (kind, table key), or None."""
    if kind == "Pod":
        return cluster.pods.get(key)
    if kind == "Node":
        state = cluster.nodes.get(key)
        return state.node if state is not None else None
    tables: dict[str, dict[str, Any]] = {
        "PriorityClass": cluster.priority_classes,
        "PodDisruptionBudget": cluster.pdbs,
        "ElasticQuota": cluster.quotas,
    }
    held = tables.get(kind, {}).get(key)
    return held if isinstance(held, (PriorityClass, Pdb, ElasticQuota)) else None


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
    return "ElasticQuota", record.uid


class Undo:
    """Changes made while folding one event, newest last."""

    __slots__ = ("_copied", "_steps", "cluster")

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._steps: list[Callable[[], None]] = []
        self._copied: set[int] = set()

    # ---- the controller's own maps and sets ----------------------------------------------

    def key(self, d: dict[Any, Any], k: Any) -> None:
        """Before `d[k] = ...`: a new key is popped again, an existing one gets its value back."""
        old = d.get(k, _MISSING)
        if old is _MISSING:

            def forget() -> None:
                d.pop(k, None)

            self._steps.append(forget)
        else:
            self._steps.append(lambda: d.__setitem__(k, old))

    def deletion(self, d: dict[Any, Any]) -> None:
        """Before deleting from `d`: its first deletion in this event copies it (order included)."""
        if id(d) in self._copied:
            return
        self._copied.add(id(d))
        copy = dict(d)

        def restore() -> None:
            d.clear()
            d.update(copy)

        self._steps.append(restore)

    def member(self, s: set[Any], x: Any) -> None:
        """Before adding `x` to or discarding it from `s`."""
        if x in s:
            self._steps.append(lambda: s.add(x))
        else:
            self._steps.append(lambda: s.discard(x))

    def attribute(self, obj: object, name: str) -> None:
        """Before rebinding `obj.name` (a scalar, or a whole set replaced)."""
        old = getattr(obj, name)
        self._steps.append(lambda: setattr(obj, name, old))

    # ---- the cluster index -----------------------------------------------------------------

    def table(self, kind: str, key: str) -> None:
        """Before an upsert or removal of (kind, key): put back the record held now, or remove it."""
        cluster = self.cluster
        old = table_record(cluster, kind, key)
        warning = cluster.warnings.get(f"{kind}/{key}", _MISSING)

        def restore() -> None:
            if old is None:
                cluster.remove(kind, key)
            else:
                cluster.upsert(old)
            # Cluster.remove leaves a class's warning behind; put back exactly what was there.
            if warning is _MISSING:
                cluster.warnings.pop(f"{kind}/{key}", None)
            else:
                cluster.warnings[f"{kind}/{key}"] = warning

        self._steps.append(restore)

    def tombstone(self, key: str) -> None:
        """Before Cluster.apply touches the tombstone of `key` (set, cleared, or the oldest evicted)."""
        tombs = self.cluster.tombstones
        if key in tombs:
            # Cleared or re-set in place: rare (a name re-created after deletion); copy it all.
            self.deletion(tombs)
            return

        def forget() -> None:
            tombs.pop(key, None)

        self._steps.append(forget)
        if len(tombs) >= cluster_mod.MAX_TOMBSTONES:
            # A new tombstone evicts the oldest one: it must come back first in line.
            first = next(iter(tombs))
            value = tombs[first]

            def restore_oldest() -> None:
                if first not in tombs:
                    rest = list(tombs.items())
                    tombs.clear()
                    tombs[first] = value
                    tombs.update(rest)

            self._steps.append(restore_oldest)

    # ---- applying it -----------------------------------------------------------------------

    def rollback(self) -> None:
        """Undo every noted change, newest first."""
        for step in reversed(self._steps):
            step()
        self._steps.clear()
        self._copied.clear()
