"""PodDisruptionBudgets: which bound pods each budget covers, and which victims exceed a budget.

Membership (pod ↔ PDB) is computed when a pod or a PDB changes, never while a
node is evaluated: a pod is matched against the PDBs of its namespace found
through a label index (every PDB is filed under one of its matchLabels pairs;
the rare selector without matchLabels is checked against every pod of its
namespace), and a PDB against the pods of its namespace when it is created or its
selector changes. A PDB update that changes only its status touches nothing here
(pods name their budgets by uid); `Cluster` logs it with `status_threshold`, and a
cache looks at just the nodes it evaluated with that budget (`engine.index`).

`violating` is the one implementation of the budget walk both uses share: the
reprieve order (upstream's filterPodsWithPDBViolation over all potential victims)
and the violation count a node is ranked by (over its final victims).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from engine.objects import Pdb, Pod

NO_PDBS: tuple[Pdb, ...] = ()
NO_UIDS: tuple[str, ...] = ()
NO_NODES: Mapping[str, int] = MappingProxyType({})


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
    """The PDBs of one cluster and the bound pods each one covers, kept current incrementally.

    Pods hold the uids of the budgets covering them, never the records, so a status
    update (the budget moving as pods come and go: by far the commonest PDB event)
    replaces one record and costs nothing per covered pod however wide the workload.
    How many covered pods each node hosts is kept as data too (`on_nodes`): what
    decides which nodes' evaluations a status change can alter (`status_threshold`).
    """

    def __init__(self) -> None:
        self.pdbs: dict[str, Pdb] = {}
        self._of_pod: dict[str, tuple[str, ...]] = {}  # pod uid -> covering PDB uids, sorted
        self._pods_of: dict[str, set[str]] = {}  # pdb uid -> covered pod uids
        self._node_of: dict[str, str] = {}  # covered pod uid -> its node
        self._on_nodes: dict[str, dict[str, int]] = {}  # pdb uid -> node -> covered pods there
        self._by_label: dict[tuple[str, str, str], set[str]] = {}  # (ns, key, value) -> pdb uids
        self._unanchored: dict[str, set[str]] = {}  # ns -> pdb uids without matchLabels

    # ---- queries -------------------------------------------------------------------

    def of(self, pod_uid: str) -> tuple[Pdb, ...]:
        uids = self._of_pod.get(pod_uid)
        if uids is None:
            return NO_PDBS
        pdbs = self.pdbs
        return tuple(pdbs[u] for u in uids)

    def uids_of(self, pod_uid: str) -> tuple[str, ...]:
        """The uids of the PDBs covering a pod, sorted (what an evaluation reads)."""
        return self._of_pod.get(pod_uid, NO_UIDS)

    def covered(self, pdb_uid: str) -> set[str]:
        return self._pods_of.get(pdb_uid, set())

    def on_nodes(self, pdb_uid: str) -> Mapping[str, int]:
        """How many bound pods the PDB covers on each node hosting any."""
        return self._on_nodes.get(pdb_uid, NO_NODES)

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
            self._of_pod[pod.uid] = tuple(found)
            for uid in found:
                self._pods_of.setdefault(uid, set()).add(pod.uid)
                self._count(uid, pod.node, 1)
            if pod.node is not None:
                self._node_of[pod.uid] = pod.node

    def remove_pod(self, uid: str) -> None:
        node = self._node_of.pop(uid, None)
        for pdb_uid in self._of_pod.pop(uid, NO_UIDS):
            covered = self._pods_of.get(pdb_uid)
            if covered is not None:
                covered.discard(uid)
            self._count(pdb_uid, node, -1)

    def _count(self, pdb_uid: str, node: str | None, step: int) -> None:
        if node is None:
            return
        counts = self._on_nodes.setdefault(pdb_uid, {})
        left = counts.get(node, 0) + step
        if left > 0:
            counts[node] = left
        else:
            counts.pop(node, None)
            if not counts:
                del self._on_nodes[pdb_uid]

    # ---- budgets -------------------------------------------------------------------

    def upsert(self, pdb: Pdb, namespace_pods: Iterable[Pod]) -> tuple[set[str], bool]:
        """Add or replace a PDB; (pods whose membership changed, whether membership changed).

        A status-only update (same selector and namespace) changes no membership: it
        returns (empty set, False) in O(1), however many pods the budget covers.
        """
        old = self.pdbs.get(pdb.uid)
        if old is not None and old.selector == pdb.selector and old.namespace == pdb.namespace:
            # Status only (disruptionsAllowed, disruptedPods move as pods come and go):
            # same members, new budget; members name it by uid, so nothing else changes.
            self.pdbs[pdb.uid] = pdb
            return set(), False
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
                self._of_pod[pod.uid] = tuple(sorted((*self._of_pod.get(pod.uid, NO_UIDS), pdb.uid)))
                self._count(pdb.uid, pod.node, 1)
                if pod.node is not None:
                    self._node_of[pod.uid] = pod.node
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
            left = tuple(u for u in self._of_pod.get(pod_uid, NO_UIDS) if u != pdb.uid)
            if left:
                self._of_pod[pod_uid] = left
            else:
                self._of_pod.pop(pod_uid, None)
                self._node_of.pop(pod_uid, None)
        self._on_nodes.pop(pdb.uid, None)
        anchor = _anchor(pdb)
        if anchor is None:
            self._unanchored.get(pdb.namespace, set()).discard(pdb.uid)
        else:
            self._by_label.get((pdb.namespace, *anchor), set()).discard(pdb.uid)


# A membership change: every evaluation on the node may read budgets it did not before.
ALWAYS = -1


def status_threshold(old: Pdb, new: Pdb) -> int:
    """Nodes hosting more than this many of a budget's pods can evaluate differently after a status change.

    A node's evaluation reads a budget only through which of its pods exceed it. A
    node whose covered pods all fit within both the old and the new
    `disruptionsAllowed` has none beyond either, whatever disruptedPods says (a
    listed pod spends nothing, and the others spend at most what is allowed), so
    its evaluations stand.
    """
    return min(old.disruptions_allowed, new.disruptions_allowed)


def violating(budgets: Budgets, pods: Sequence[Pod]) -> list[bool]:
    """Which of `pods` (most important first) exceed a budget if all of them are evicted.

    Each pod a PDB covers, and that its disruptedPods does not already list, uses one
    of its allowed disruptions; once a budget is spent, every further pod it covers
    violates it (upstream filterPodsWithPDBViolation).
    """
    allowed: dict[str, int] = {}
    out = []
    of_pod = budgets._of_pod
    pdbs = budgets.pdbs
    for pod in pods:
        violated = False
        for uid in of_pod.get(pod.uid, NO_UIDS):
            pdb = pdbs[uid]
            if pod.name in pdb.disrupted:
                continue
            left = allowed.get(uid, pdb.disruptions_allowed) - 1
            allowed[uid] = left
            if left < 0:
                violated = True
        out.append(violated)
    return out
