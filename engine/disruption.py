"""PodDisruptionBudgets: which bound pods each budget covers, and which victims exceed a budget.

Membership (pod ↔ PDB) is computed when a pod or a PDB changes, never while a
node is evaluated: a pod is matched against the PDBs of its namespace found
through a label index (every PDB is filed under one of its matchLabels pairs;
the rare selector without matchLabels is checked against every pod of its
namespace), and a PDB against the pods of its namespace when it is created or its
selector changes. A PDB update that changes only its status touches nothing here;
`Cluster` decides from `affected_nodes` which nodes' evaluations it changes.

`violating` is the one implementation of the budget walk both uses share: the
reprieve order (upstream's filterPodsWithPDBViolation over all potential victims)
and the violation count a node is ranked by (over its final victims).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.objects import Pdb, Pod

NO_PDBS: tuple[Pdb, ...] = ()


def _covers(pdb: Pdb, pod: Pod) -> bool:
    """Does `pdb` count `pod` against its budget? Upstream preemption's reading: a nil or
    empty selector matches nothing, and a pod without labels is covered by no budget
    (filterPodsWithPDBViolation skips it, as the eviction API's PDB lookup does), even
    under a `NotIn` or `DoesNotExist` selector that its empty label set would match."""
    sel = pdb.selector
    return (
        sel is not None
        and not sel.empty
        and bool(pod.labels)
        and pod.namespace == pdb.namespace
        and sel.matches(pod.labels)
    )


def _anchor(pdb: Pdb) -> tuple[str, str] | None:
    sel = pdb.selector
    if sel is None or not sel.match_labels:
        return None
    return sel.match_labels[0]


class Budgets:
    """The PDBs of one cluster and the bound pods each one covers, kept current incrementally."""

    def __init__(self) -> None:
        self.pdbs: dict[str, Pdb] = {}
        self._of_pod: dict[str, tuple[Pdb, ...]] = {}  # pod uid -> covering PDBs, by uid
        self._pods_of: dict[str, set[str]] = {}  # pdb uid -> covered pod uids
        self._by_label: dict[tuple[str, str, str], set[str]] = {}  # (ns, key, value) -> pdb uids
        self._unanchored: dict[str, set[str]] = {}  # ns -> pdb uids without matchLabels

    # ---- queries -------------------------------------------------------------------

    def of(self, pod_uid: str) -> tuple[Pdb, ...]:
        return self._of_pod.get(pod_uid, NO_PDBS)

    def covered(self, pdb_uid: str) -> set[str]:
        return self._pods_of.get(pdb_uid, set())

    # ---- pods ----------------------------------------------------------------------

    def add_pod(self, pod: Pod) -> None:
        if not self.pdbs:
            return  # most pod events in a cluster without PDBs: nothing to match
        ns = pod.namespace
        candidates: set[str] = set(self._unanchored.get(ns, ()))
        for k, v in pod.labels.items():
            filed = self._by_label.get((ns, k, v))
            if filed:
                candidates |= filed
        if not candidates:
            return
        found = sorted(uid for uid in candidates if _covers(self.pdbs[uid], pod))
        if found:
            self._of_pod[pod.uid] = tuple(self.pdbs[uid] for uid in found)
            for uid in found:
                self._pods_of.setdefault(uid, set()).add(pod.uid)

    def remove_pod(self, uid: str) -> None:
        for pdb in self._of_pod.pop(uid, NO_PDBS):
            covered = self._pods_of.get(pdb.uid)
            if covered is not None:
                covered.discard(uid)

    # ---- budgets -------------------------------------------------------------------

    def upsert(self, pdb: Pdb, namespace_pods: Iterable[Pod]) -> tuple[set[str], bool]:
        """Add or replace a PDB; (pods whose budgets may have changed, whether membership changed)."""
        old = self.pdbs.get(pdb.uid)
        if old is not None and old.selector == pdb.selector and old.namespace == pdb.namespace:
            # Status only (disruptionsAllowed, disruptedPods move as pods come and go):
            # same members, new budget. The record is swapped in place for every member.
            self.pdbs[pdb.uid] = pdb
            members = self._pods_of.get(pdb.uid, set())
            for uid in members:
                self._of_pod[uid] = tuple(pdb if p.uid == pdb.uid else p for p in self._of_pod[uid])
            return set(members), False
        before = set(self._pods_of.get(pdb.uid, set()))
        if old is not None:
            self._drop(old)
        self.pdbs[pdb.uid] = pdb
        anchor = _anchor(pdb)
        if anchor is None:
            self._unanchored.setdefault(pdb.namespace, set()).add(pdb.uid)
        else:
            self._by_label.setdefault((pdb.namespace, *anchor), set()).add(pdb.uid)
        after: set[str] = set()
        for pod in namespace_pods:
            if _covers(pdb, pod):
                after.add(pod.uid)
                self._of_pod[pod.uid] = tuple(
                    sorted((*self._of_pod.get(pod.uid, NO_PDBS), pdb), key=lambda p: p.uid)
                )
        if after:
            self._pods_of[pdb.uid] = after
        return before | after, True

    def remove(self, uid: str) -> set[str]:
        """Forget a PDB; the pods it covered."""
        old = self.pdbs.get(uid)
        if old is None:
            return set()
        members = set(self._pods_of.get(uid, set()))
        self._drop(old)
        del self.pdbs[uid]
        return members

    def _drop(self, pdb: Pdb) -> None:
        for pod_uid in self._pods_of.pop(pdb.uid, set()):
            left = tuple(p for p in self._of_pod.get(pod_uid, NO_PDBS) if p.uid != pdb.uid)
            if left:
                self._of_pod[pod_uid] = left
            else:
                self._of_pod.pop(pod_uid, None)
        anchor = _anchor(pdb)
        if anchor is None:
            self._unanchored.get(pdb.namespace, set()).discard(pdb.uid)
        else:
            self._by_label.get((pdb.namespace, *anchor), set()).discard(pdb.uid)


def status_matters(old: Pdb, new: Pdb, members_on_node: int) -> bool:
    """Can a status change of one budget change an evaluation of a node hosting `members_on_node` of its pods?

    A node's evaluation reads a budget only through which of its pods exceed it.
    With the same disruptedPods, a node whose covered pods all fit within both the
    old and the new `disruptionsAllowed` has none beyond either, so nothing changes.
    """
    if old.disrupted != new.disrupted:
        return True
    return members_on_node > min(old.disruptions_allowed, new.disruptions_allowed)


def violating(budgets: Budgets, pods: Sequence[Pod]) -> list[bool]:
    """Which of `pods` (most important first) exceed a budget if all of them are evicted.

    Each pod a PDB covers, and that its disruptedPods does not already list, uses one
    of its allowed disruptions; once a budget is spent, every further pod it covers
    violates it (upstream filterPodsWithPDBViolation).
    """
    allowed: dict[str, int] = {}
    out = []
    for pod in pods:
        violated = False
        for pdb in budgets.of(pod.uid):
            if pod.name in pdb.disrupted:
                continue
            left = allowed.get(pdb.uid, pdb.disruptions_allowed) - 1
            allowed[pdb.uid] = left
            if left < 0:
                violated = True
        out.append(violated)
    return out
