"""Every node's summary as arrays: the bounds of many nodes for one preemptor in a few array operations.

A ranking bounds each node that changed since its shape was last decided, and a
new ranking bounds every node (`Ranking.settle`). In Python that is ~5-8 µs a
node, and with many preemptor shapes it is most of a decision's time: (nodes
touched per decision) x (live shapes) bounds. This table holds what
`summary.bound` reads of each node (kind "all"), one column per node, one row per
priority level of the whole cluster, so that one preemptor's bounds for hundreds
or thousands of nodes cost a few numpy operations.

It computes exactly `summary.bound`'s value, for the nodes where that value is a
plain function of the arrays (with a nominated node's free capacity for this
preemptor put in place of its own) and no pod there may tolerate the preemptor
at `now`; rejected nodes' reasons likewise; where one victim could do, the pods
at that level are read for `summary.bound`'s "alone", in Python.
Every other node is handed back to `summary.bound`, so the table never guesses:
`tests/test_bound_properties.py` checks its values against `summary.bound` node
by node, and the index properties run it through churn.

Levels are the cluster's priorities (the PriorityClasses' values, and any other
a pod carries); a summary's level maps to the row of the same priority, a row
with no pods of its own repeating the row below (cumulative sums do not move
there, and the bound's first level is always one where the node has pods).
A new level or resource re-lays the table. A lasting index fills every column
when it is made and keeps them in place (`catch_up`): it follows the cluster's
touch log and rewrites only the columns of the nodes that changed since.

The table also files each node in a filter group (cordon, taints, allocatable,
labels but the hostname): a new preemptor shape's ranking runs the node filters
once per group and reads fitting from the free-capacity columns
(`Ranking._check_all`), instead of checking 5,000 nodes one by one.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from engine import quantity
from engine.cluster import Cluster, NodeState
from engine.objects import Node
from engine.summary import PLAIN_LIMIT, PLAIN_PRIORITY, PLAIN_START, PRIORITY_SHIFT, Summary

# More levels than this (a cluster whose pods carry many distinct priorities) and the
# table is not used: each row is one level, and every node's column holds them all.
MAX_LEVELS = 64
# Values beyond these are left to `summary.bound` (Python integers do not overflow; int64 does).
LIMIT = PLAIN_LIMIT
# A stale version: rows written before the table was re-laid.
STALE = -1
NO_TOLERANCE = -(2**63)
# Labels whose value is each node's own: left out of a node's filter group (`NodeTable.group`),
# so that nodes alike but for their name share one; a pod that selects by one of them is
# filtered node by node.
OWN_LABELS = frozenset({"kubernetes.io/hostname"})


class NodeTable:
    """The arrays, and `bounds` for one preemptor over many nodes."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.slots: dict[str, int] = {}
        self.free_slots: list[int] = []
        self.versions: list[int] = []
        self.levels: list[int] = sorted({pc.value for pc in cluster.priority_classes.values()})
        self.resources: list[str] = ["cpu", "memory", "pods"]
        self.capacity = 0
        # Filter groups: nodes whose node objects every node filter reads alike (cordon, taints,
        # labels but OWN_LABELS, allocatable), so a new preemptor shape runs the filters once
        # per group, not once per node (`placement.unresolvable` on the group's first node).
        self.group_keys: dict[tuple[object, ...], int] = {}
        self.group_nodes: list[Node] = []
        self.node_objs: list[Node | None] = []
        # The cluster's touch log as far as the columns follow it (`catch_up`).
        self.position = cluster.touched_end
        self._relaid = False
        self.overfull = False  # a node's levels did not fit (MAX_LEVELS): `catch_up` is off
        # `slot_array`'s last answer, and the layout it was made under (slots move only when
        # nodes come, go or the table is re-laid: `_layout` counts those).
        self._order: tuple[list[str], Any, int] | None = None
        self._layout = 0
        self._lay(max(16, len(cluster.nodes)))

    # ---- layout --------------------------------------------------------------------

    def _lay(self, capacity: int) -> None:
        """(Re)allocate every array; every row is stale until a bound rewrites it."""
        g, n = max(1, len(self.levels)), capacity
        self.capacity = capacity
        self.level_array = np.array(self.levels or [0], dtype=np.int64)
        self.free = {r: np.zeros(n, dtype=np.int64) for r in self.resources}
        self.cum = {r: np.zeros((g, n), dtype=np.int64) for r in self.resources}
        self.maxby = {r: np.zeros((g, n), dtype=np.int64) for r in self.resources}
        self.latest = np.zeros((g, n), dtype=np.int64)
        self.count = np.zeros((g, n), dtype=np.int64)
        self.lowest = np.zeros(n, dtype=np.int64)
        self.tolerant_until = np.full(n, NO_TOLERANCE, dtype=np.int64)
        self.tolerant_below = np.zeros(n, dtype=np.int64)
        self.plain = np.zeros(n, dtype=bool)
        self._layout += 1
        self.group = np.zeros(n, dtype=np.intp)
        self.versions = [STALE] * n
        self.node_objs = [None] * n
        self._relaid = True  # every column is stale: `catch_up` rewrites them all

    def _slot(self, name: str) -> int:
        slot = self.slots.get(name)
        if slot is not None:
            return slot
        if self.free_slots:
            slot = self.free_slots.pop()
        else:
            slot = len(self.slots)
            if slot >= self.capacity:
                self._grow(2 * self.capacity)
        self.slots[name] = slot
        self.versions[slot] = STALE
        self._layout += 1
        return slot

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        self.free = {r: _widen(a, extra, 0) for r, a in self.free.items()}
        self.cum = {r: _widen(a, extra, 0) for r, a in self.cum.items()}
        self.maxby = {r: _widen(a, extra, 0) for r, a in self.maxby.items()}
        self.latest = _widen(self.latest, extra, 0)
        self.count = _widen(self.count, extra, 0)
        self.lowest = _widen(self.lowest, extra, 0)
        self.tolerant_until = _widen(self.tolerant_until, extra, NO_TOLERANCE)
        self.tolerant_below = _widen(self.tolerant_below, extra, 0)
        self.plain = _widen(self.plain, extra, False)
        self.group = _widen(self.group, extra, 0)
        self.versions.extend([STALE] * extra)
        self.node_objs.extend([None] * extra)
        self.capacity = capacity

    def forget(self, name: str) -> None:
        """A node is gone: its column is free for another."""
        slot = self.slots.pop(name, None)
        if slot is not None:
            self._layout += 1
            self.versions[slot] = STALE
            self.node_objs[slot] = None
            self.free_slots.append(slot)

    # ---- kept in place -------------------------------------------------------------

    def catch_up(self, summary_of: Callable[[NodeState], Summary]) -> bool:
        """Bring every node's column to its node's current state, in place: the nodes the
        cluster touched since the last call (every node after a re-lay or when the log was
        trimmed past this table). False when the table cannot hold a node (too many levels)."""
        if self.overfull:
            return False
        cluster = self.cluster
        changed = None if self._relaid else cluster.touched_since(self.position)
        names: Iterable[str] = cluster.nodes if changed is None else dict.fromkeys(changed)
        if changed is None:
            for gone in [name for name in self.slots if name not in cluster.nodes]:
                self.forget(gone)  # deleted where the log no longer says so
        self._relaid = False
        while True:
            for name in names:
                state = cluster.nodes.get(name)
                if state is None:
                    self.forget(name)
                    continue
                slot = self.slots.get(name)
                if slot is not None and self.versions[slot] == state.version:
                    if self.node_objs[slot] is not state.node:
                        self._regroup(slot, state.node)
                    continue
                s = summary_of(state)
                if s.plain and not all(self._has_level(lv) for lv in s.levels):
                    if not self.usable(s.levels, {}):
                        # Levels are never dropped: the table cannot hold every node from now
                        # on, and callers read it node by node (`_columns`) as before.
                        self.overfull = True
                        return False
                    break  # re-laid: every column is stale
                slot = self._slot(name)
                self._write(slot, s)
                if self.node_objs[slot] is not state.node:
                    self._regroup(slot, state.node)
            else:
                self._relaid = False
                self.position = cluster.touched_end
                if len(self.group_nodes) > 2 * len(self.slots) + 64:
                    self._regroup_all()  # groups of node objects long replaced
                return True
            names = cluster.nodes
            self._relaid = False

    def _regroup_all(self) -> None:
        self.group_keys.clear()
        self.group_nodes.clear()
        nodes = self.cluster.nodes
        for name, slot in self.slots.items():
            state = nodes.get(name)
            if state is not None:
                self._regroup(slot, state.node)

    def _regroup(self, slot: int, node: Node) -> None:
        labels = node.labels
        key = (
            node.unschedulable,
            node.taints,
            tuple(sorted((k, v) for k, v in labels.items() if k not in OWN_LABELS)),
            tuple(sorted(node.allocatable.items())),
        )
        g = self.group_keys.get(key)
        if g is None:
            g = self.group_keys[key] = len(self.group_nodes)
            self.group_nodes.append(node)
        self.group[slot] = g
        self.node_objs[slot] = node

    def slot_array(self, names: list[str]) -> Any:
        """The columns of `names` (every one held) as an array; the cluster's own node order is
        kept from call to call, so a new shape's ranking does not look up 5,000 names again."""
        held = self._order
        if held is not None and held[0] == names and held[2] == self._layout:
            return held[1]
        slots = self.slots
        array = np.fromiter((slots[name] for name in names), dtype=np.intp, count=len(names))
        self._order = (names, array, self._layout)
        return array

    def checks(
        self, sl: Any, requests: Mapping[str, int], small: int | None
    ) -> tuple[list[int], list[bool], list[bool]]:
        """For the columns `sl`: each node's filter group, whether the requests fit its free
        capacity (allocatable less its bound pods' requests), and whether the table cannot
        say (a column that is not plain, or a node of at most `small` pods)."""
        fits = np.ones(len(sl), dtype=bool)
        for r, v in requests.items():
            fits &= self.free[r][sl] >= v
        slow = ~self.plain[sl]
        if small is not None:
            slow |= self.count[-1, sl] <= small
        return self.group[sl].tolist(), fits.tolist(), slow.tolist()

    def usable(self, levels: Iterable[int], requests: Mapping[str, int]) -> bool:
        """Can the table hold these levels and resources (re-laying it if need be)?"""
        new_levels = [lv for lv in levels if not self._has_level(lv)]
        new_resources = [r for r in requests if r not in self.free]
        if not new_levels and not new_resources:
            return True
        if len(self.levels) + len(new_levels) > MAX_LEVELS:
            return False
        self.levels = sorted({*self.levels, *new_levels})
        self.resources = [*self.resources, *sorted(set(new_resources))]
        self._lay(self.capacity)
        return True

    def _columns(
        self, names: list[str], states: list[NodeState], summary_of: Callable[[NodeState], Summary]
    ) -> list[int] | None:
        """The nodes' columns, each rewritten if it is not of the node's current state; None when
        the table cannot hold one of them (too many levels)."""
        get, versions = self.slots.get, self.versions
        if self.catch_up(summary_of):
            # Every column is of its node's current state (kept in place): nothing to compare.
            slots = [get(name, -1) for name in names]
            if -1 not in slots:
                return slots
        slots = [get(name, -1) for name in names]
        stale = [
            i
            for i, (slot, state) in enumerate(zip(slots, states, strict=True))
            if slot < 0 or versions[slot] != state.version
        ]
        for _ in range(2):
            relaid = False
            for i in stale:
                s = summary_of(states[i])
                if s.plain and not all(self._has_level(lv) for lv in s.levels):
                    if not self.usable(s.levels, {}):
                        return None
                    relaid = True
                    break
                slot = slots[i] = self._slot(names[i])
                self._write(slot, s)
            if not relaid:
                return slots
            # Re-laid: every column is stale, these nodes' included.
            slots = [self._slot(name) for name in names]
            stale = list(range(len(names)))
        return slots

    def sync(self, name: str, s: Summary) -> None:
        """Write a node's column now (a worker warming its index), if the table can hold it."""
        if s.plain and not all(self._has_level(lv) for lv in s.levels) and not self.usable(s.levels, {}):
            return
        slot = self._slot(name)
        if self.versions[slot] != s.version:
            self._write(slot, s)

    def _has_level(self, level: int) -> bool:
        i = bisect.bisect_left(self.levels, level)
        return i < len(self.levels) and self.levels[i] == level

    def _clear(self, slot: int) -> None:
        """A column that holds nothing and is not plain."""
        for r in self.resources:
            self.free[r][slot] = 0
            self.cum[r][:, slot] = 0
            self.maxby[r][:, slot] = 0
        self.latest[:, slot] = 0
        self.count[:, slot] = 0
        self.lowest[slot] = 0
        self.tolerant_until[slot] = NO_TOLERANCE
        self.tolerant_below[slot] = 0
        self.plain[slot] = False

    def _write(self, slot: int, s: Summary) -> None:
        """The node's column from its summary (of kind "all")."""
        if not s.plain:
            # Figures beyond int64 room (a 9E cpu node, pods summing past 8Ei): numpy cannot
            # hold them, and `bounds` hands a node that is not plain back to summary.bound.
            self._clear(slot)
            self.versions[slot] = s.version
            return
        # `_lay`'s one placeholder row while the cluster has no level yet: a node without pods
        # (a summary with levels is laid out first, `usable`) writes "nothing below" into it.
        levels, own = self.levels or [0], s.levels
        rows: list[int] = []  # for each table level, the summary's level at or below it (-1: none)
        j = -1
        for level in levels:
            while j + 1 < len(own) and own[j + 1] <= level:
                j += 1
            rows.append(j)
        for r in self.resources:
            self.free[r][slot] = s.free.get(r, 0)
            by = s.cum_by.get(r)
            mx = s.max_by.get(r)
            if by is None or mx is None:
                self.cum[r][:, slot] = 0
                self.maxby[r][:, slot] = 0
            else:
                self.cum[r][:, slot] = [by[j] if j >= 0 else 0 for j in rows]
                self.maxby[r][:, slot] = [mx[j] if j >= 0 else 0 for j in rows]
        self.latest[:, slot] = [
            s.latest_start[j] if j >= 0 and own[j] == level else 0
            for j, level in zip(rows, levels, strict=True)
        ]
        self.count[:, slot] = [s.cum_count[j] if j >= 0 else 0 for j in rows]
        self.lowest[slot] = own[0] if own else 0
        if s.tolerant:
            self.tolerant_until[slot] = min(s.tolerant_until, PLAIN_START)
            self.tolerant_below[slot] = s.tolerant_below
        else:
            self.tolerant_until[slot] = NO_TOLERANCE
            self.tolerant_below[slot] = 0
        self.plain[slot] = s.plain
        self.versions[slot] = s.version

    # ---- bounds --------------------------------------------------------------------

    def bounds(
        self,
        names: list[str],
        states: list[NodeState],
        summary_of: Callable[[NodeState], Summary],
        requests: Mapping[str, int],
        priority: int,
        now: int,
        *,
        minimal: bool,
        free_of: Callable[[NodeState], Mapping[str, int]],
    ) -> tuple[list[tuple[str, tuple[int, ...]]], list[tuple[str, str]], list[int]]:
        """Where the arrays give `summary.bound` exactly: candidates' values and rejected nodes'
        reasons; and the positions of the other nodes.

        `states[i]` is node `names[i]`'s state and `summary_of` its current summary
        (kind "all", read only for columns not of that state), `free_of` its free
        capacity for this preemptor (read only where pods are nominated). The values equal
        `summary.bound(...).value` with tier CANDIDATE, the reasons its reason with
        tier REJECTED, neither with an expiry; every node the table cannot vouch for
        is returned by position, for `summary.bound`.
        """
        everyone = list(range(len(names)))
        if (
            any(not -LIMIT < v < LIMIT for v in requests.values())
            or not -PLAIN_PRIORITY < priority < PLAIN_PRIORITY
        ):
            return [], [], everyone
        if not self.usable((), requests):
            return [], [], everyone
        slots = self._columns(names, states, summary_of)
        if slots is None:
            return [], [], everyone
        below = bisect.bisect_left(self.levels, priority)
        if below == 0:
            return [], [], everyone  # no level below the preemptor: every node is rejected
        sl = np.array(slots, dtype=np.intp)
        own = np.ones(len(names), dtype=bool)
        free = {r: self.free[r][sl] for r in requests}  # copies: patched below
        nominated = self.cluster.nominated_nodes
        if nominated:
            # A node with nominated pods has less free capacity than its own (`Summaries.free_at`).
            held = [self.slots[name] for name in nominated if name in self.slots]
            for i in np.flatnonzero(np.isin(sl, held)).tolist():
                have = free_of(states[i])
                for r in requests:
                    v = have.get(r, 0)
                    if not -LIMIT < v < LIMIT:
                        own[i] = False
                    free[r][i] = v if own[i] else 0
        tolerant = (self.tolerant_until[sl] >= now) & (priority < self.tolerant_below[sl])
        first = np.zeros(len(names), dtype=np.int64)
        anyshort = np.zeros(len(names), dtype=bool)
        shorts: list[tuple[str, Any, Any]] = []
        for r, v in requests.items():
            short = v - free[r]
            pos = short > 0
            anyshort |= pos
            # cum is non-decreasing over the levels (plain rows: no negative request), so the
            # count of levels below `below` still short of it is `bisect_left`'s answer.
            c = (self.cum[r][:below, sl] < short).sum(axis=0)
            first = np.maximum(first, np.where(pos, c, 0))
            shorts.append((r, short, pos))
        # Answerable: own free capacity, plain figures, no pod tolerating the preemptor, not fitting.
        plain = own & self.plain[sl] & ~tolerant & anyshort
        rejected = self._rejected(names, plain & (first >= below), sl, free, requests, below)
        ok = plain & (first < below)
        first = np.where(ok, first, 0)
        count = np.ones(len(names), dtype=np.int64)
        for r, short, pos in shorts:
            use = pos & ok
            most = self.maxby[r][first, sl]
            k = -((-short) // np.where(use, most, 1))
            count = np.maximum(count, np.where(use, k, 1))
        # A lone victim's start term needs the pods at that level ("alone"): read below.
        lone = ok & (count == 1)
        ok &= ~lone
        highest = self.level_array[first]
        shifted = highest + PRIORITY_SHIFT + (count - 1) * (self.lowest[sl] + PRIORITY_SHIFT)
        start = -self.latest[first, sl]
        alone = self._alone(names, states, summary_of, lone, highest, start, sl, shorts, minimal=minimal)
        picked: list[int] = np.flatnonzero(ok).tolist()
        h: list[int] = highest[ok].tolist()
        sh: list[int] = shifted[ok].tolist()
        co: list[int] = count[ok].tolist()
        st: list[int] = start[ok].tolist()
        # Tuples made in C (zip): one per candidate, thousands for a new shape.
        zeros = itertools.repeat(0)
        if minimal:
            values = zip(zeros, h, co, sh, st, strict=False)
        else:
            values = zip(zeros, h, sh, co, st, strict=False)
        out: list[tuple[str, tuple[int, ...]]] = list(
            zip(map(names.__getitem__, picked), values, strict=False)
        )
        rest = np.flatnonzero(~plain).tolist()
        return out + alone, rejected, rest

    def _alone(
        self,
        names: list[str],
        states: list[NodeState],
        summary_of: Callable[[NodeState], Summary],
        mask: Any,
        highest: Any,
        start: Any,
        sl: Any,
        shorts: list[tuple[str, Any, Any]],
        *,
        minimal: bool,
    ) -> list[tuple[str, tuple[int, ...]]]:
        """`summary.bound` where one victim could do: one only if a pod at that level covers the
        whole shortfall alone (the latest such pod's start), else two (the level's latest start)."""
        at: list[int] = np.flatnonzero(mask).tolist()
        if not at:
            return []
        high: list[int] = highest[mask].tolist()
        lowest: list[int] = self.lowest[sl][mask].tolist()
        latest: list[int] = start[mask].tolist()
        needs = [(r, short[mask].tolist(), pos[mask].tolist()) for r, short, pos in shorts]
        out: list[tuple[str, tuple[int, ...]]] = []
        for k, i in enumerate(at):
            s = summary_of(states[i])
            need = [(r, amounts[k]) for r, amounts, short in needs if short[k]]
            best: int | None = None
            for p in s.at_level[bisect.bisect_left(s.levels, high[k])]:
                req = p.requests
                for r, v in need:
                    if req.get(r, 0) < v:
                        break
                else:
                    if best is None or p.start > best:
                        best = p.start
            h = high[k]
            if best is None:
                count, shifted, term = 2, h + PRIORITY_SHIFT + lowest[k] + PRIORITY_SHIFT, latest[k]
            else:
                count, shifted, term = 1, h + PRIORITY_SHIFT, -best
            out.append((names[i], (0, h, count, shifted, term) if minimal else (0, h, shifted, count, term)))
        return out

    def _rejected(
        self,
        names: list[str],
        mask: Any,
        sl: Any,
        free: dict[str, Any],
        requests: Mapping[str, int],
        below: int,
    ) -> list[tuple[str, str]]:
        """`summary.bound`'s reason for each rejected node in `mask`: no pod is held back, so every
        pod below the preemptor is eligible, and the room is free capacity plus all their requests."""
        if not mask.any():
            return []
        at = np.flatnonzero(mask)
        cols = sl[at]
        order = sorted(requests)
        # One row per node: the eligible count and each resource's shortfall. Nodes alike in
        # those share one text, rendered once (np.unique), and each amount is rendered once.
        rows = np.empty((len(at), 1 + len(order)), dtype=np.int64)
        rows[:, 0] = self.count[below - 1, cols]
        for j, r in enumerate(order):
            rows[:, 1 + j] = requests[r] - (free[r][at] + self.cum[r][below - 1, cols])
        distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
        rendered: dict[tuple[str, int], str] = {}
        texts: list[str] = []
        for row in distinct.tolist():
            parts = []
            for r, d in zip(order, row[1:], strict=True):
                if d > 0:
                    amount = rendered.get((r, d))
                    if amount is None:
                        amount = rendered[(r, d)] = quantity.render(r, d)
                    parts.append(f"{r} {amount}")
            texts.append(
                f"does not fit even after removing all {row[0]} eligible lower-priority pods "
                f"(short {', '.join(parts)})"
            )
        which = map(texts.__getitem__, inverse.ravel().tolist())
        return list(zip(map(names.__getitem__, at.tolist()), which, strict=True))


def _widen(a: Any, extra: int, fill: int | bool) -> Any:
    """`a` with `extra` more columns (its last axis), filled with `fill`."""
    pad = np.full((*a.shape[:-1], extra), fill, dtype=a.dtype)
    return np.concatenate([a, pad], axis=-1)
