"""Per-preemptor node rankings kept incrementally: how a decision finds the best nodes cheaply.

For each preemptor signature (mode, victim kind, priority, requests, tolerations,
selectors, affinity) a `Ranking` holds every node's standing in one sorted list:
fitting nodes first (by name), then candidates by their ranking key, exact where
the node has been evaluated and a lower bound (`summary.bound`) where it has not,
then rejected nodes. A decision reads the top: while the first entries include a
bound, that node is evaluated and its exact key takes the bound's place (keys are
never below their bounds); once the first K entries are all exact, they are the
K best nodes, because every entry after them is at least as large as its true key
is low. Nodes that cannot win are never evaluated.

Changes stay local: `Cluster.touched` names nodes whose pods, nominations or
node object changed (their bound is recomputed, their evaluation dropped);
`Cluster.pdb_touched` names nodes where only a PDB budget changed for pods they
host (their evaluation is dropped, their bound still holds). A ranking catches
up on both logs when it is next used, so a shape that returns after many
decisions pays for what changed, not for the cluster's size. Toleration windows
are the one dependence on time: an entry is looked at again when one closes.

The answers are exactly those of evaluating every node afresh (`full_scan`, the
specification; property-tested against it and against `engine.reference`).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from engine import default, interpod, minimal, placement, resources, summary
from engine.cluster import Cluster, NodeState
from engine.default import CANDIDATE, FITS, REJECTED, NodeEval, Preemptor
from engine.objects import Node, Pod

if TYPE_CHECKING:
    from engine.nodetable import NodeTable

# Live rankings kept at once (one per distinct preemptor signature); the least
# recently used is dropped past this, bounding memory with many pod shapes.
MAX_RANKINGS = 64
# Touch-log entries kept before the logs are trimmed to what every ranking has read.
TOUCH_LOG_TRIM = 50_000
# A ranking's heap is rebuilt once stale entries make it this many times its live ones.
HEAP_SLACK = 4
# `settle` heapifies when the new entries exceed 1/BULK_FRACTION of the heap, else pushes each.
BULK_FRACTION = 8
# A node with at most this many pods is evaluated in full when it is checked instead of
# summarised and bounded later: on small nodes an evaluation costs about what those do,
# and it is exact, so it is never evaluated again while the node stays as it is.
# Not in minimal mode, whose evaluation (a branch and bound) costs several bounds.
EVALUATE_MAX_PODS = 8
EXPLAIN_CANDIDATES = default.EXPLAIN_CANDIDATES
EXPLAIN_REJECTED = default.EXPLAIN_REJECTED

# A fitting preemptor's explanation: where it fits is the whole answer (the decision's
# node), so no node is ranked or counted for it.
FITS_EXPLANATION: dict[str, Any] = {"flow": "default"}
# No Kubernetes uid is empty, so this pod excludes no nomination.
ANONYMOUS = ""
# Victim kinds: every lower-priority pod (default flow), or only preemptible ones (job flow).
ALL = "all"

NodeEvaluator = Callable[..., NodeEval]
Keep = Callable[[Pod], bool] | None


def signature(pre: Preemptor, mode: str, kind: str = ALL) -> Hashable:
    pod = pre.pod
    return (
        mode,
        kind,
        pre.priority,
        tuple(sorted(pre.requests.items())),
        pod.tolerations,
        pod.node_selector,
        pod.required_affinity,
    )


def filter_signature(pre: Preemptor) -> Hashable:
    """What `placement.unresolvable` reads of a preemptor: equal signatures, equal verdicts on every node."""
    pod = pre.pod
    return (
        pod.tolerations,
        pod.node_selector,
        pod.required_affinity,
        # The amounts too: a node whose allocatable is below a request is unresolvable.
        tuple(sorted((r, v) for r, v in pod.requests.items() if v > 0)),
    )


def evaluator(mode: str) -> NodeEvaluator:
    return minimal.evaluate_node if mode == "minimal" else default.evaluate_node


# A settle of at least this many nodes reads the node table (numpy: ~0.1 ms whatever the
# count); fewer are bounded one by one (~5-8 µs each).
VECTOR_MIN = 24
# A lasting index keeps a node table from its this-many-th ranking on (any index from `warm`).
TABLE_AT_RANKING = 2

# A node known not to fit whose bound has not been computed yet: fitting is all a
# decision needs when some node fits, so bounds wait until a decision needs candidates.
PENDING = 3


@dataclass(slots=True)
class Entry:
    tier: int  # FITS, CANDIDATE, REJECTED (exact, from the bound) or PENDING
    bound: tuple[int, ...]
    reason: str
    expires: int | None
    stamp: int  # the heap entry (value, name, stamp) that is this node's current one
    exact: NodeEval | None = None  # a fresh full evaluation (candidates only)
    # Rejected by a node filter, against this node object: only a new one can change that.
    filtered: Node | None = None
    refined: bool = False  # the bound has been tightened by `summary.refine`

    @property
    def value(self) -> tuple[int, ...]:
        return self.exact.key if self.exact is not None else self.bound


class Ranking:
    """Every node's standing for one preemptor signature.

    Candidates live in a heap of (value, name, stamp) with lazy deletion: a node's
    entry is current while its stamp is the node's, so a change pushes one entry
    and leaves the old one to be skipped, in O(log n) C-level work; fitting and
    rejected nodes, which change far less, are kept by name. A changed node is
    first only checked for fitting (PENDING); its bound is computed when a
    decision next needs candidates (`settle`). A small node (EVALUATE_MAX_PODS)
    is evaluated in full when it is checked instead.
    """

    def __init__(
        self,
        cluster: Cluster,
        summaries: summary.Summaries,
        pre: Preemptor,
        mode: str,
        kind: str,
        keep: Keep,
        now: int,
        filtered: dict[str, tuple[Node, str | None]] | None = None,
        table: NodeTable | None = None,
    ) -> None:
        self.cluster = cluster
        self.summaries = summaries
        self.pre = pre
        self.mode = mode
        self.kind = kind
        self.keep = keep
        self.evaluate = evaluator(mode)
        self.minimal = mode == "minimal"
        self._requests = tuple(pre.requests.items())
        # Filter verdicts by node, shared by every ranking whose preemptors the node
        # filters read alike (`filter_signature`): a new shape checks no node twice.
        self._filtered = filtered if filtered is not None else {}
        self.now = now
        self.position = cluster.touched_end
        self.pdb_position = cluster.pdb_touched_end
        self.state: dict[str, Entry] = {}
        self.fits: SortedList[str] = SortedList()
        self.rejected: SortedList[str] = SortedList()
        self.reasons: dict[str, int] = {}
        self.candidate_count = 0
        self.pending: set[str] = set()
        self.exacts: set[str] = set()  # nodes whose entry holds a full evaluation
        # PDB uid -> nodes whose full evaluation read it, filed when the evaluation is
        # kept and pruned lazily (an entry whose node no longer holds such an evaluation
        # is dropped when a change of that PDB visits it): a PDB status change costs the
        # evaluations it can make stale, not the width of the budget's workload.
        self.reads: dict[str, set[str]] = {}
        self.heap: list[tuple[tuple[int, ...], str, int]] = []
        self.expiring: list[tuple[int, str, int]] = []
        # The index's node table (`engine.nodetable`) once it keeps one, shared by every ranking.
        self.table: NodeTable | None = table
        self._stamp = 0
        if table is not None and keep is None and len(cluster.nodes) >= VECTOR_MIN and self._check_all(table):
            return
        fits: list[str] = []
        rejected: list[str] = []
        for name, node in cluster.nodes.items():
            e = self._check(node)
            self.state[name] = e
            if e.tier == FITS:
                fits.append(name)
            elif e.tier == PENDING:
                self.pending.add(name)
            else:
                self._file(name, e, self.heap.append, self.expiring.append, rejected.append)
        self.fits.update(fits)
        self.rejected.update(rejected)
        heapq.heapify(self.heap)
        heapq.heapify(self.expiring)

    def _check_all(self, table: NodeTable) -> bool:
        """`_check` of every node at once from the node table: filters once per filter group of
        nodes, fitting from the free-capacity columns; False (nothing done) where the table
        cannot vouch for the answer, and `_check` runs node by node.

        Nodes with nominated pods, small nodes (evaluated outright) and nodes whose column
        is not plain still go through `_check`; the entries are those `_check` makes."""
        from engine import nodetable

        pod = self.pre.pod
        requests = self.pre.requests
        if pod.required_affinity is not None or any(k in nodetable.OWN_LABELS for k, _ in pod.node_selector):
            return False
        limit = nodetable.LIMIT
        if any(r not in table.free or not -limit < v < limit for r, v in requests.items()):
            return False
        if not table.catch_up(lambda st: self.summaries.get(ALL, st, None)):
            return False
        cluster = self.cluster
        nodes = cluster.nodes
        names = list(nodes)
        verdicts = [placement.unresolvable(node, pod) for node in table.group_nodes]
        sl = table.slot_array(names)
        group, fit, slow = table.checks(sl, requests, None if self.minimal else EVALUATE_MAX_PODS)
        nominated = cluster.nominated_nodes
        state_of, check = self.state, self._check
        fitting: list[str] = []
        rejected: list[str] = []
        pending = self.pending
        reasons = self.reasons
        stamp = 0
        for i, name in enumerate(names):
            why = verdicts[group[i]]
            if why is not None:
                stamp += 1
                state_of[name] = Entry(REJECTED, (), why, None, stamp, None, nodes[name].node)
                rejected.append(name)
                reasons[why] = reasons.get(why, 0) + 1
            elif slow[i] or name in nominated:
                self._stamp = stamp
                e = check(nodes[name])
                stamp = self._stamp
                state_of[name] = e
                if e.tier == FITS:
                    fitting.append(name)
                elif e.tier == PENDING:
                    pending.add(name)
                else:
                    self._file(name, e, self.heap.append, self.expiring.append, rejected.append)
            elif fit[i]:
                stamp += 1
                state_of[name] = Entry(FITS, (), "fits without preemption", None, stamp)
                fitting.append(name)
            else:
                stamp += 1
                state_of[name] = Entry(PENDING, (), "", None, stamp)
                pending.add(name)
        self._stamp = stamp
        self.fits.update(fitting)
        self.rejected.update(rejected)
        heapq.heapify(self.heap)
        heapq.heapify(self.expiring)
        return True

    # ---- one node's entry ------------------------------------------------------------

    def _check(self, state: NodeState) -> Entry:
        """What a node costs nothing to know: rejected by a filter, fitting, or PENDING."""
        self._stamp += 1
        node = state.node
        held = self._filtered.get(node.name)
        if held is None or held[0] is not node:
            # Filters read only the node object, which changes far less often than its pods.
            held = (node, placement.unresolvable(node, self.pre.pod))
            self._filtered[node.name] = held
        if held[1] is not None:
            return Entry(REJECTED, (), held[1], None, self._stamp, filtered=node)
        if not self.minimal and len(state.pods) <= EVALUATE_MAX_PODS:
            return self._evaluated(state)
        if node.name in self.cluster.nominated_nodes:
            fits = resources.fits(self.pre.requests, self._free(state))
        else:
            # Allocatable minus what bound pods request (`Summaries.free`), read in place:
            # most nodes are checked once per change, a dict built for it costs more.
            allocatable, used = node.allocatable, state.used
            fits = True
            for r, v in self._requests:
                if v > allocatable.get(r, 0) - used.get(r, 0):
                    fits = False
                    break
        if fits:
            return Entry(FITS, (), "fits without preemption", None, self._stamp)
        return Entry(PENDING, (), "", None, self._stamp)

    def _evaluated(self, state: NodeState) -> Entry:
        """A small node evaluated outright: about the cost of checking, summarising and bounding it."""
        pods = state.pods.values() if self.keep is None else [p for p in state.pods.values() if self.keep(p)]
        ev = self.evaluate(self.cluster, state, self.pre, self.now, sorted(pods, key=summary.importance))
        if ev.status == FITS:
            return Entry(FITS, (), "fits without preemption", None, self._stamp)
        # No bound that outlives the evaluation: a PDB change can lower the key (`demote`),
        # and then the node is evaluated again, not refined (there is no bound to refine).
        e = Entry(ev.status, (), ev.reason, ev.expires, self._stamp, refined=True)
        if ev.status == CANDIDATE:
            e.exact = ev
        return e

    def _free(self, state: NodeState) -> Mapping[str, int]:
        # From the node's totals, not its summary (a node that fits or that a filter
        # rejects never needs one built), computed once per node state and priority
        # for every ranking (`default.free_for` of the anonymous preemptor).
        return self.summaries.free_at(state, self.pre.priority)

    def settle(self) -> None:
        """Compute the bound of every PENDING node: a decision is about to rank candidates."""
        if not self.pending:
            return
        pre, now, minimal_mode = self.pre, self.now, self.minimal
        requests, priority = pre.requests, pre.priority
        # Many new entries: append and heapify once; a few: push each (heapify is O(n)).
        bulk = len(self.pending) * BULK_FRACTION > len(self.heap)
        heap, expiring = self.heap, self.expiring
        push = heap.append if bulk else lambda item: heapq.heappush(heap, item)
        push_expiry = expiring.append if bulk else lambda item: heapq.heappush(expiring, item)
        nodes, entries, reasons = self.cluster.nodes, self.state, self.reasons
        get, kind, keep = self.summaries.get, self.kind, self.keep
        free_at, bound = self.summaries.free_at, summary.bound
        rejected: list[str] = []
        candidates = 0
        names = list(self.pending)
        table = self.table
        if table is not None and keep is None and len(names) >= VECTOR_MIN:
            # Most candidates' bounds in a few array operations; the nodes the table cannot
            # vouch for (rejected, a lone victim, nominations, tolerating pods) below.
            states = [nodes[name] for name in names]
            exact, refused, others = table.bounds(
                names,
                states,
                lambda st: get(kind, st, None),
                requests,
                priority,
                now,
                minimal=minimal_mode,
                free_of=lambda st: free_at(st, priority),
            )
            for name, value in exact:
                e = entries[name]
                e.tier, e.bound, e.reason, e.expires = CANDIDATE, value, "", None
                push((value, name, e.stamp))
            candidates += len(exact)
            for name, why in refused:
                e = entries[name]
                e.tier, e.bound, e.reason, e.expires = REJECTED, (), why, None
                rejected.append(name)
                reasons[why] = reasons.get(why, 0) + 1
            names = [names[i] for i in others]
        for name in names:
            state = nodes[name]
            e = entries[name]
            b = bound(
                get(kind, state, keep),
                free_at(state, priority),
                requests,
                priority,
                now,
                minimal=minimal_mode,
            )
            tier, e.bound, e.reason, expires = b
            e.tier, e.expires = tier, expires
            if tier == REJECTED:
                rejected.append(name)
                reasons[e.reason] = reasons.get(e.reason, 0) + 1
            else:
                candidates += 1
                push((e.bound, name, e.stamp))
            if expires is not None:
                push_expiry((expires, name, e.stamp))
        self.candidate_count += candidates
        self.rejected.update(rejected)
        self.pending.clear()
        if bulk:
            heapq.heapify(heap)
            heapq.heapify(expiring)

    def drop(self, name: str) -> None:
        e = self.state.pop(name, None)
        if e is None:
            return
        self.exacts.discard(name)
        if e.tier == FITS:
            self.fits.remove(name)
        elif e.tier == REJECTED:
            self.rejected.remove(name)
            left = self.reasons[e.reason] - 1
            if left:
                self.reasons[e.reason] = left
            else:
                del self.reasons[e.reason]
        elif e.tier == PENDING:
            self.pending.discard(name)
        else:
            self.candidate_count -= 1  # its heap entry is stale from now on

    def refresh(self, name: str) -> None:
        state = self.cluster.nodes.get(name)
        old = self.state.get(name)
        if old is not None and state is not None and old.filtered is state.node:
            return  # its pods changed, but this preemptor can never run there anyway
        if state is None:
            self.drop(name)
            # The node is gone: nothing of it is kept (node names come and go with machines).
            self._filtered.pop(name, None)
            self.summaries.forget(name)
            if self.table is not None:
                self.table.forget(name)
            return
        e = self._check(state)
        if old is not None and old.tier == e.tier and e.tier in (FITS, PENDING):
            # Fitting still, or waiting for its bound still: only the entry is new (a
            # fitting node is filed by name, a pending one in `pending`; neither moves).
            self.state[name] = e
            return
        self.drop(name)
        self.state[name] = e
        if e.tier == FITS:
            self.fits.add(name)
        elif e.tier == PENDING:
            self.pending.add(name)
        else:
            self._file(
                name,
                e,
                lambda item: heapq.heappush(self.heap, item),
                lambda item: heapq.heappush(self.expiring, item),
                self.rejected.add,
            )

    def _file(
        self,
        name: str,
        e: Entry,
        push: Callable[[tuple[tuple[int, ...], str, int]], None],
        push_expiry: Callable[[tuple[int, str, int]], None],
        reject: Callable[[str], None],
    ) -> None:
        """File a rejected or evaluated entry (a small node's, or a filter's verdict)."""
        if e.tier == REJECTED:
            reject(name)
            self.reasons[e.reason] = self.reasons.get(e.reason, 0) + 1
        else:
            self._keep_exact(name, e.exact)
            self.candidate_count += 1
            push((e.value, name, e.stamp))
        if e.expires is not None:
            push_expiry((e.expires, name, e.stamp))

    def _push(self, e: Entry, name: str) -> None:
        heapq.heappush(self.heap, (e.value, name, e.stamp))

    def _compact(self) -> None:
        """Rebuild the heap from the live entries once stale ones far outnumber them."""
        if len(self.heap) > HEAP_SLACK * (self.candidate_count + 1):
            self.heap = [(x.value, n, x.stamp) for n, x in self.state.items() if x.tier == CANDIDATE]
            heapq.heapify(self.heap)

    def demote(self, name: str, pdb: str) -> None:
        """A PDB changed for pods on this node: an evaluation that read it is stale, its bound is not.

        `pdb` is the budget whose status changed, or "" when membership changed (any
        evaluation of the node may then read a budget it did not before).
        """
        e = self.state.get(name)
        if e is None or e.exact is None or (pdb and pdb not in e.exact.pdbs):
            return
        e.exact = None
        self.exacts.discard(name)
        self._stamp += 1
        e.stamp = self._stamp
        self._push(e, name)

    def _refine(self, name: str, e: Entry) -> None:
        state = self.cluster.nodes[name]
        s = self.summaries.get(self.kind, state, self.keep)
        pre = self.pre
        e.refined = True
        e.bound = summary.refine(
            s, self._free(state), pre.requests, pre.priority, self.now, e.bound, minimal=self.minimal
        )
        self._stamp += 1
        e.stamp = self._stamp
        self._push(e, name)

    def exact(self, name: str) -> NodeEval:
        """The node's full evaluation, computed now if the entry holds only a bound."""
        e = self.state[name]
        if e.exact is not None:
            return e.exact
        state = self.cluster.nodes[name]
        ordered = self.summaries.get(self.kind, state, self.keep).pods
        ev = self.evaluate(self.cluster, state, self.pre, self.now, ordered)
        if ev.status != CANDIDATE or ev.key < e.bound:
            # The bound is exact about FITS and REJECTED and below every key: a
            # disagreement is a bug in `summary.bound`, never a close call.
            raise AssertionError(f"bound {e.tier}/{e.bound} does not hold for {name}: {ev.status}/{ev.key}")
        e.exact = ev
        self._keep_exact(name, ev)
        self._stamp += 1
        e.stamp = self._stamp
        self._push(e, name)
        return ev

    def _keep_exact(self, name: str, ev: NodeEval | None) -> None:
        self.exacts.add(name)
        if ev is not None:
            reads = self.reads
            for uid in ev.pdbs:
                held = reads.get(uid)
                if held is None:
                    reads[uid] = {name}
                else:
                    held.add(name)

    # ---- catching up -----------------------------------------------------------------

    def catch_up(self, now: int) -> bool:
        """Replay what changed since this ranking was last used; False when it must be rebuilt."""
        cluster = self.cluster
        if now < self.now:
            return False  # time went backwards (a replay from the start): start over
        changed = cluster.touched_since(self.position)
        pdb_changed = cluster.pdb_touched_since(self.pdb_position)
        if changed is None or pdb_changed is None:
            return False
        self.now = now
        for name in dict.fromkeys(changed):  # each touched node once, in first-touch order
            self.refresh(name)
        exact = self.exacts
        budgets = cluster.budgets
        for name, pdb, threshold in pdb_changed:
            if name:  # membership changed for pods on this node: any evaluation there may read it
                if name in exact:
                    self.demote(name, "")
                continue
            readers = self.reads.get(pdb)
            if not readers:
                continue  # most PDB changes reach no node this ranking evaluated
            counts = budgets.on_nodes(pdb)
            for node in list(readers):
                e = self.state.get(node)
                if e is None or e.exact is None or pdb not in e.exact.pdbs:
                    readers.discard(node)  # the evaluation that read it is gone
                elif counts.get(node, 0) > threshold:
                    # Counts are current, and so as at the change: a node whose pods
                    # changed since was refreshed above and holds no older evaluation.
                    readers.discard(node)
                    self.demote(node, pdb)
            if not readers:
                del self.reads[pdb]
        while self.expiring and self.expiring[0][0] < now:
            _, name, _ = heapq.heappop(self.expiring)
            e = self.state.get(name)
            if e is not None and e.expires is not None and e.expires < now:
                self.refresh(name)
        self.position = cluster.touched_end
        self.pdb_position = cluster.pdb_touched_end
        self._compact()
        return True

    # ---- reading ---------------------------------------------------------------------

    def fitting(self, skip: Iterable[str] = ()) -> str | None:
        """The first node by name where the preemptor fits without eviction."""
        skipped = set(skip)
        return next((name for name in self.fits if name not in skipped), None)

    def top(self, k: int, skip: Iterable[str] = ()) -> list[NodeEval]:
        """The k best candidates by (key, name), evaluating only nodes whose bound could still win.

        Entries come off the heap smallest first; a bound is replaced by its node's
        exact key (never smaller) and pushed back, so when k exact entries have come
        off, no entry left can be smaller than the k-th.
        """
        self.settle()
        skipped = set(skip)
        out: list[NodeEval] = []
        kept: list[tuple[tuple[int, ...], str, int]] = []
        heap = self.heap  # not rebuilt while reading: `_compact` runs only in `catch_up`
        while len(out) < k and heap:
            item = heapq.heappop(heap)
            _, name, stamp = item
            e = self.state.get(name)
            if e is None or e.stamp != stamp or e.tier != CANDIDATE:
                continue  # stale: superseded by a later entry for this node
            if name in skipped:
                kept.append(item)
                continue
            if e.exact is None:
                if not e.refined:
                    self._refine(name, e)  # pushes the tighter bound; this entry is gone
                else:
                    self.exact(name)  # pushes the exact entry; this bound entry is gone
                continue
            kept.append(item)
            out.append(e.exact)
        for item in kept:
            heapq.heappush(heap, item)
        return out

    def reason(self, name: str) -> str:
        return self.state[name].reason


@dataclass(frozen=True, slots=True)
class Scan:
    """What a default-flow decision needs from evaluating every node."""

    fitting: str | None  # a node where the preemptor fits now (its nominated node first)
    best: NodeEval | None  # the best-ranked candidate
    explanation: dict[str, Any]


class Index:
    """Rankings over one Cluster; call `scan` for each decision."""

    def __init__(self, cluster: Cluster, *, lasting: bool = False) -> None:
        """`lasting`: the index outlives one decision (the worker's controller, the simulator,
        the bench), so it may keep a node table; a one-shot `decide` leaves it False."""
        self.cluster = cluster
        self.summaries = summary.Summaries(cluster)
        self._rankings: dict[Hashable, Ranking] = {}
        self._filters: dict[Hashable, dict[str, tuple[Node, str | None]]] = {}
        # Every node's summary as arrays (numpy), made by a long-lived index only: when the
        # worker warms it, or at its second ranking when `lasting`. A one-shot decision never
        # imports numpy (~0.1 s), which would cost it more than the arrays save: a job whose
        # members differ in shape ranks twice in one `decide`.
        self.lasting = lasting
        self.table: NodeTable | None = None
        self._created = 0
        if lasting:
            # Every node's column now, kept in place from here on (`NodeTable.catch_up`): the
            # first ranking of every shape, the first decision's included, bounds every node in
            # array operations instead of building 5,000 summaries inside a decision.
            self.keep_table()
            assert self.table is not None
            self.table.catch_up(lambda st: self.summaries.get(ALL, st, None))

    def ranking(self, pre: Preemptor, now: int, mode: str, kind: str = ALL, keep: Keep = None) -> Ranking:
        cluster = self.cluster
        sig = signature(pre, mode, kind)
        r = self._rankings.pop(sig, None)
        if r is None or not r.catch_up(now):
            # Rankings are shared by every pod of a signature, so they are computed for
            # an anonymous pod: no real pod's own nomination is excluded from its node.
            # Any pod of the signature serves: evaluations read nothing else of it.
            anonymous = Preemptor(dataclasses.replace(pre.pod, uid=ANONYMOUS), pre.priority, pre.requests)
            filtered = self._filters.setdefault(filter_signature(pre), {})
            self._created += 1
            if self.lasting and self._created >= TABLE_AT_RANKING:
                self.keep_table()
            r = Ranking(cluster, self.summaries, anonymous, mode, kind, keep, now, filtered, self.table)
        self._rankings[sig] = r  # most recently used last
        while len(self._rankings) > MAX_RANKINGS:
            del self._rankings[next(iter(self._rankings))]
        if len(self._filters) > MAX_RANKINGS:
            # Verdicts no live ranking shares are dropped with the rankings that used them.
            live = {id(x._filtered) for x in self._rankings.values()}
            self._filters = {k: v for k, v in self._filters.items() if id(v) in live}
        if len(cluster.touched) > TOUCH_LOG_TRIM:
            readers = [x.position for x in self._rankings.values()]
            if self.table is not None:
                readers.append(self.table.position)
            cluster.trim_touched(min(readers))
        if len(cluster.pdb_touched) > TOUCH_LOG_TRIM:
            cluster.trim_pdb_touched(min(x.pdb_position for x in self._rankings.values()))
        return r

    def keep_table(self) -> None:
        """Keep every node's summary as arrays from now on (`engine.nodetable`)."""
        if self.table is None:
            # Imported here: numpy costs a one-shot `decide` ~0.1 s, more than the table saves it.
            from engine.nodetable import NodeTable

            self.table = NodeTable(self.cluster)
            for r in self._rankings.values():
                r.table = self.table

    def warm(self, pending: Iterable[Preemptor], now: int, mode: str) -> None:
        """Do now what the first decisions would: every node's summary, and the rankings of `pending`.

        A worker restoring its state calls this, so its first decision after a
        start is as fast as any other (5,000 summaries cost a quarter of a second).
        `now` may be earlier than the next decision's: a ranking catches up on
        time as on any other change (toleration windows that closed since).
        """
        self.keep_table()
        table = self.table
        for name, state in self.cluster.nodes.items():
            s = self.summaries.get(ALL, state, None)
            if table is not None:
                table.sync(name, s)
        for pre in pending:
            self.ranking(pre, now, mode).settle()

    def scan(self, pre: Preemptor, now: int, mode: str) -> Scan:
        if pre.filters is not None:
            return self._scan_filtered(pre, pre.filters, now, mode)
        r = self.ranking(pre, now, mode)
        cluster = self.cluster
        own: NodeEval | None = None
        nominated = pre.pod.nominated
        if nominated is not None and nominated in cluster.nodes:
            # The preemptor's own nomination is excluded from its node's promised
            # capacity, which the shared ranking (keyed by signature) cannot know.
            own = evaluator(mode)(cluster, cluster.nodes[nominated], pre, now)
        skip = (own.node,) if own is not None else ()
        if own is not None and own.status == FITS:
            fitting: str | None = own.node
        else:
            fitting = r.fitting(skip)
        if fitting is not None:
            # Nobody is evicted: no node needs ranking, and none is ranked (FITS_EXPLANATION).
            return Scan(fitting, None, dict(FITS_EXPLANATION))
        top = r.top(EXPLAIN_CANDIDATES, skip)
        if own is not None and own.status == CANDIDATE:
            top = sorted([*top, own], key=lambda e: (e.key, e.node))[:EXPLAIN_CANDIDATES]
        return Scan(None, top[0] if top else None, explain(r, {own.node: own} if own else {}, top, cluster))

    def _scan_filtered(self, pre: Preemptor, filters: interpod.Filters, now: int, mode: str) -> Scan:
        """`scan` for a preemptor with inter-pod filters (engine.interpod).

        Those read other nodes' pods (topology domains), so a node's evaluation is no longer
        its own alone, which rankings are built on. But on most nodes they pass whatever is
        evicted (`Filters.touched`): there the ranking of the same pod without them is exact.
        The touched nodes, and the preemptor's nominated node, are evaluated in full.
        """
        cluster = self.cluster
        r = self.ranking(pre, now, mode)  # ranks for the pod's shape, without its filters
        touched = filters.touched()
        nominated = pre.pod.nominated
        if nominated is not None and nominated in cluster.nodes:
            touched.add(nominated)
        evaluate = evaluator(mode)
        evals = {name: evaluate(cluster, cluster.nodes[name], pre, now) for name in sorted(touched)}
        own = evals.get(nominated) if nominated is not None else None
        if own is not None and own.status == FITS:
            fitting: str | None = own.node
        else:
            fits = [name for name, e in evals.items() if e.status == FITS]
            shared = r.fitting(touched)
            fitting = min([*fits, *([shared] if shared is not None else [])], default=None)
        if fitting is not None:
            return Scan(fitting, None, dict(FITS_EXPLANATION))
        top = r.top(EXPLAIN_CANDIDATES, touched)
        top = sorted(
            [*top, *(e for e in evals.values() if e.status == CANDIDATE)], key=lambda e: (e.key, e.node)
        )
        top = top[:EXPLAIN_CANDIDATES]
        return Scan(None, top[0] if top else None, explain(r, evals, top, cluster))


def explain(
    r: Ranking, overrides: Mapping[str, NodeEval], top: Sequence[NodeEval], cluster: Cluster
) -> dict[str, Any]:
    """The default flow's explanation: the best candidates with their criteria, and the counts.

    Every figure is a function of the cluster and the preemptor alone (never of
    which nodes a cache happened to evaluate), so replays reproduce it.
    """
    reasons = dict(r.reasons)
    rejected_count = len(r.rejected)
    candidate_count = r.candidate_count
    # The first rejected nodes by name: enough of the shared ones that those swapped out
    # below cannot leave the list short.
    rejected_names = set(r.rejected.islice(0, EXPLAIN_REJECTED + 1 + len(overrides)))
    for name, own in overrides.items():
        # Swap the shared view of the node (the preemptor's nominated node, a node its
        # inter-pod filters touch) for its own evaluation.
        shared = r.state.get(name)
        if shared is not None:
            if shared.tier == REJECTED:
                rejected_count -= 1
                reasons[shared.reason] -= 1
                rejected_names.discard(name)
            elif shared.tier == CANDIDATE:
                candidate_count -= 1
        if own.status == REJECTED:
            rejected_count += 1
            reasons[own.reason] = reasons.get(own.reason, 0) + 1
            rejected_names.add(name)
        elif own.status == CANDIDATE:
            candidate_count += 1
    rows = []
    for name in sorted(rejected_names)[:EXPLAIN_REJECTED]:
        held = overrides.get(name)
        rows.append({"node": name, "reason": held.reason if held is not None else r.reason(name)})
    return {
        "flow": "default",
        "candidates": [default.criteria(e, cluster) for e in top],
        "candidateCount": candidate_count,
        "rejected": rows,
        "rejectedCount": rejected_count,
        "rejectedReasons": {k: v for k, v in sorted(reasons.items()) if v > 0},
    }


def full_scan(cluster: Cluster, pre: Preemptor, now: int, mode: str) -> Scan:
    """The specification `Index.scan` must equal: every node evaluated in full, no bounds, no cache."""
    evaluate = evaluator(mode)
    evals = [evaluate(cluster, cluster.nodes[name], pre, now) for name in sorted(cluster.nodes)]
    by_node = {e.node: e for e in evals}
    nominated = pre.pod.nominated
    fitting = None
    if nominated is not None and nominated in by_node and by_node[nominated].status == FITS:
        fitting = nominated
    else:
        fitting = next((e.node for e in evals if e.status == FITS), None)
    if fitting is not None:
        return Scan(fitting, None, dict(FITS_EXPLANATION))
    candidates = sorted((e for e in evals if e.status == CANDIDATE), key=lambda e: (e.key, e.node))
    top = candidates[:EXPLAIN_CANDIDATES]
    rejected = [e for e in evals if e.status == REJECTED]
    reasons: dict[str, int] = {}
    for e in rejected:
        reasons[e.reason] = reasons.get(e.reason, 0) + 1
    explanation = {
        "flow": "default",
        "candidates": [default.criteria(e, cluster) for e in top],
        "candidateCount": len(candidates),
        "rejected": [{"node": e.node, "reason": e.reason} for e in rejected[:EXPLAIN_REJECTED]],
        "rejectedCount": len(rejected),
        "rejectedReasons": dict(sorted(reasons.items())),
    }
    return Scan(None, top[0] if top else None, explanation)
