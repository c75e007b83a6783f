"""The cluster index: the materialised state every decision reads.

Pods, nodes, PriorityClasses, PDBs, ElasticQuotas and Namespaces by identity, plus the
derived indexes decisions need on every call, each kept current when an object
changes rather than recomputed when a decision asks: pods bound to each node
with the node's used resources, pending pods nominated to each node, which PDBs
cover each bound pod (`disruption.Budgets`), pending pods by pod group, how many
pods name each uid as their owner, and quota usage by (namespace, quota label,
preemptible label). Updating one object costs the pods of one node and the PDBs
that could cover it, so the streaming worker folds events straight into it.

Changes stay local. Two logs tell the caches what changed: `touched` lists nodes
whose pods, nominations or node object changed (everything about the node must
be looked at again), `pdb_touched` PDB changes (evaluations change, capacity does
not): the nodes where membership changed, or one entry for a status update,
however wide the budget's workload, which a cache applies to the nodes it
evaluated with that budget where the change can matter there. A PriorityClass
change touches only the nodes running pods of that class, and only when its
toleration policy changed; a quota change no node, nor a namespace change (its labels
are read per decision, by the inter-pod filters' namespace selectors: engine.interpod).

Folding is idempotent (docs/architecture.md §2): an object event whose resourceVersion is
not newer than what the index holds is ignored, and a deleted object leaves a
tombstone so a re-delivered older event cannot resurrect it.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine import disruption, objects, resources, toleration
from engine.constraints import NAMESPACE_NAME_LABEL
from engine.errors import InvalidObject
from engine.objects import PREEMPT_LOWER, ElasticQuota, Namespace, Node, Pdb, Pod, PriorityClass, Record
from engine.resources import Resources

# Deleted objects remembered (oldest forgotten first) so a re-delivered older event
# cannot resurrect them; re-delivery reaches back minutes, not millions of deletions.
MAX_TOMBSTONES = 100_000
# Touch-log entries kept whatever the readers: a worker folding events with no
# preemptor to decide, or a cache last used long ago, would otherwise hold every
# change ever folded. A reader that falls further behind starts over (its cache
# is rebuilt, which costs about what replaying this many changes would).
MAX_TOUCH_LOG = 200_000


@dataclass(slots=True)
class NodeState:
    node: Node
    pods: dict[str, Pod] = field(default_factory=dict)  # bound, non-terminal pods by uid
    used: Resources = field(default_factory=dict)
    # Moves on whenever the node's state changes; unique across the cluster's nodes and
    # their lifetimes, so a node deleted and created again never repeats a version.
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
        self.budgets = disruption.Budgets()
        self.quotas: dict[str, ElasticQuota] = {}
        # Namespace objects by name: their labels, for namespace selectors (`namespace_labels`).
        self.namespaces: dict[str, Namespace] = {}
        self._nominated: dict[str, dict[str, Pod]] = {}
        # Bound pods whose node is not (yet) known: watch order is per kind.
        self._orphans: dict[str, dict[str, Pod]] = {}
        self._policies: dict[str, toleration.Policy | None] = {}
        self.tombstones: dict[str, str] = {}
        # Bound, non-terminal pods by namespace and by PriorityClass: what a new PDB
        # selector or a changed toleration policy has to look at.
        self._bound_in_ns: dict[str, dict[str, Pod]] = {}
        # (namespace, label key) -> label value -> uid -> bound pod: built the first time a
        # selector asks for that key (`bound_labelled`), then kept as pods bind and unbind.
        # The inter-pod filters read the pods their selectors can match, not a namespace.
        self._by_label: dict[tuple[str, str], dict[str, dict[str, Pod]]] = {}
        # Node label key -> value -> node names, built when asked (`nodes_labelled`) and dropped
        # whenever a node is added, changed or removed (rare beside pod events).
        self._nodes_by_label: dict[str, dict[str, frozenset[str]]] = {}
        self._bound_in_class: dict[str, set[str]] = {}
        # Bound, non-terminal pods with required pod anti-affinity: every preemptor must
        # keep out of their domains when their terms match it (engine.interpod). Grouped by
        # their terms too: a workload's replicas share them, so a preemptor matches each
        # group once, not each pod.
        self.anti_affine: dict[str, Pod] = {}
        self.anti_groups: dict[tuple[Any, ...], dict[str, Pod]] = {}
        # Bound, non-terminal pods holding a host port, by port number: the nodes where a
        # preemptor's port can clash, without a scan.
        self.host_ports: dict[int, dict[str, Pod]] = {}
        # Pending pods by (namespace, pod group): a gang's members without a scan.
        self._pending_groups: dict[tuple[str, str], set[str]] = {}
        # uid -> number of other pods whose ownerReferences name it (a driver's executors).
        self._owned: dict[str, int] = {}
        # (namespace, quota-name label, preemptible label) -> [requests, pods] of bound,
        # non-terminal pods: the job flow's quota usage without a scan.
        self.usage: dict[tuple[str, str, str | None], list[Any]] = {}
        # Bound pods by (namespace, pod group): never victims of their own job.
        self._bound_groups: dict[tuple[str, str], set[str]] = {}
        # Warnings for the operator (unparsable annotations); the runtime logs each once.
        self.warnings: dict[str, str] = {}
        # Pods whose record came without spec.priority: the index stamped it from their
        # class (or the global default), and stamps it again when classes change, so the
        # order classes and pods were folded in does not matter (docs/semantics.md §8).
        self._stamped: set[str] = set()
        # Names of nodes whose state changed, in order; caches replay it to stay current.
        # `touched_base` is the absolute position of touched[0] (the log is trimmed).
        self.touched: list[str] = []
        self.touched_base = 0
        # PDB changes, capacity never changing: (node, "", ALWAYS) where PDB membership
        # changed for pods the node hosts (any evaluation there is stale); ("", PDB uid,
        # threshold) where only that PDB's status changed: an evaluation that read it is
        # stale on a node hosting more than `threshold` of its pods (`Budgets.on_nodes`,
        # `disruption.status_threshold`). One entry per status change however many
        # nodes the budget's workload spans: a cache looks only at what it evaluated.
        self.pdb_touched: list[tuple[str, str, int]] = []
        self.pdb_touched_base = 0
        # The last NodeState.version handed out: caches keyed by (node name, version)
        # must not mistake a re-created node for the one it replaced.
        self._versions = 0

    @property
    def pdbs(self) -> dict[str, Pdb]:
        return self.budgets.pdbs

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

    @property
    def nominated_nodes(self) -> Mapping[str, Mapping[str, Pod]]:
        """Nodes some pending pod is nominated to (each with its pods): read it, never change it."""
        return self._nominated

    def bound_in(self, namespace: str) -> Mapping[str, Pod]:
        """Bound, non-terminal pods of `namespace` by uid (their node may not be known yet)."""
        return self._bound_in_ns.get(namespace, {})

    def namespace_labels(self, name: str) -> Mapping[str, str]:
        """The labels of namespace `name`, as a namespace selector matches them: its Namespace
        object's, else (no object seen) only the label the API server sets on every namespace,
        `kubernetes.io/metadata.name`, to its name (docs/semantics.md §1)."""
        ns = self.namespaces.get(name)
        return ns.labels if ns is not None else {NAMESPACE_NAME_LABEL: name}

    def bound_namespaces(self) -> list[str]:
        return sorted(self._bound_in_ns)

    def bound_labelled(self, namespace: str, key: str, values: Iterable[str]) -> dict[str, Pod]:
        """Bound, non-terminal pods of `namespace` whose label `key` has one of `values`, by uid."""
        index = self._by_label.get((namespace, key))
        if index is None:
            index = {}
            for uid, pod in self._bound_in_ns.get(namespace, {}).items():
                value = pod.labels.get(key)
                if value is not None:
                    index.setdefault(value, {})[uid] = pod
            self._by_label[(namespace, key)] = index
        out: dict[str, Pod] = {}
        for value in values:
            out.update(index.get(value, {}))
        return out

    def nodes_labelled(self, key: str) -> Mapping[str, frozenset[str]]:
        """The nodes carrying label `key`, by its value."""
        index = self._nodes_by_label.get(key)
        if index is None:
            building: dict[str, set[str]] = {}
            for name, state in self.nodes.items():
                value = state.node.labels.get(key)
                if value is not None:
                    building.setdefault(value, set()).add(name)
            index = {value: frozenset(names) for value, names in building.items()}
            self._nodes_by_label[key] = index
        return index

    def _label_index(self, pod: Pod, keep: bool) -> None:
        """File (`keep`) or withdraw `pod` in the label indexes built so far."""
        if not self._by_label:
            return
        for key, value in pod.labels.items():
            index = self._by_label.get((pod.namespace, key))
            if index is None:
                continue
            if keep:
                index.setdefault(value, {})[pod.uid] = pod
            else:
                held = index.get(value)
                if held is not None:
                    held.pop(pod.uid, None)
                    if not held:
                        del index[value]

    def pending(self) -> Iterator[Pod]:
        for pod in self.pods.values():
            if pod.node is None and not pod.terminal:
                yield pod

    def pending_in_group(self, namespace: str, group: str) -> list[Pod]:
        """Pending, non-terminal pods labelled with pod group `group` in `namespace`."""
        return [self.pods[uid] for uid in self._pending_groups.get((namespace, group), ())]

    def bound_in_group(self, namespace: str, group: str) -> list[Pod]:
        return [self.pods[uid] for uid in sorted(self._bound_groups.get((namespace, group), ()))]

    def owns(self, uid: str) -> bool:
        """Does another pod name this one in its ownerReferences?"""
        return self._owned.get(uid, 0) > 0

    def free(self, state: NodeState) -> Resources:
        out = dict(state.node.allocatable)
        resources.sub(out, state.used)
        return out

    # ---- updates -------------------------------------------------------------------

    def upsert(self, record: Record) -> None:
        self._upsert(record)
        self._bound_logs()

    def _bound_logs(self) -> None:
        if len(self.touched) > MAX_TOUCH_LOG:
            self.trim_touched(self.touched_end - MAX_TOUCH_LOG // 2)
        if len(self.pdb_touched) > MAX_TOUCH_LOG:
            self.trim_pdb_touched(self.pdb_touched_end - MAX_TOUCH_LOG // 2)

    def _upsert(self, record: Record) -> None:
        if isinstance(record, Pod):
            self._upsert_pod(record)
        elif isinstance(record, Node):
            self._upsert_node(record)
        elif isinstance(record, PriorityClass):
            self._upsert_class(record)
        elif isinstance(record, Namespace):
            # Read per decision (engine.interpod): no node evaluation holds them.
            self.namespaces[record.name] = record
        elif isinstance(record, Pdb):
            old = self.budgets.pdbs.get(record.uid)
            members, regrouped = self.budgets.upsert(
                record, self._bound_in_ns.get(record.namespace, {}).values()
            )
            self._pdb_changed(old, record, members, regrouped)
        else:
            # Quotas are read per job decision (admission, reprieve); no node evaluation
            # depends on them, so nothing is touched.
            self.quotas[record.uid] = record

    def remove(self, kind: str, uid: str) -> None:
        self._remove(kind, uid)
        self._bound_logs()

    def _remove(self, kind: str, uid: str) -> None:
        if kind == "Pod":
            self._remove_pod(uid)
            self._stamped.discard(uid)
        elif kind == "Node":
            state = self.nodes.pop(uid, None)
            self._nodes_by_label.clear()
            if state is not None:
                if state.pods:
                    self._orphans[uid] = state.pods
                self.touched.append(uid)
        elif kind == "PriorityClass":
            old = self.priority_classes.pop(uid, None)
            if old is not None:
                had = self._policies.pop(uid, None)
                if had is not None:
                    self._touch_class(uid)
                self._restamp()
        elif kind == "PodDisruptionBudget":
            old_pdb = self.budgets.pdbs.get(uid)
            if old_pdb is not None:
                self._pdb_changed(old_pdb, None, self.budgets.remove(uid), True)
        elif kind == "ElasticQuota":
            self.quotas.pop(uid, None)
        elif kind == "Namespace":
            self.namespaces.pop(uid, None)

    def _upsert_class(self, record: PriorityClass) -> None:
        before = self._policies.get(record.name)
        held = self.priority_classes.get(record.name)
        self.priority_classes[record.name] = record
        if held is None or (held.value, held.global_default) != (record.value, record.global_default):
            self._restamp()
        try:
            policy = toleration.parse_policy(record.value, record.annotations)
            self.warnings.pop(f"PriorityClass/{record.name}", None)
        except toleration.PolicyError as exc:
            policy = None
            self.warnings[f"PriorityClass/{record.name}"] = f"{exc}; toleration disabled for this class"
        self._policies[record.name] = policy
        # Pods carry their priority (stamped at admission), so only the toleration
        # policy of a class reaches an evaluation: the nodes running its pods.
        if policy != before:
            self._touch_class(record.name)

    def _restamp(self) -> None:
        """Stamp again the pods whose priority came from the classes, now that the classes changed."""
        for uid in sorted(self._stamped):
            pod = self.pods[uid]
            if self.priority(dataclasses.replace(pod, priority=None)) != pod.priority:
                self._upsert_pod(dataclasses.replace(pod, priority=None))

    def _touch_class(self, name: str) -> None:
        for node in sorted({self.pods[uid].node or "" for uid in self._bound_in_class.get(name, ())}):
            self._touch(node)

    def _pdb_changed(self, old: Pdb | None, new: Pdb | None, members: set[str], regrouped: bool) -> None:
        """Log what a PDB change can alter (`pdb_touched`)."""
        if regrouped or old is None or new is None:
            nodes = {pod.node for uid in members if (pod := self.pods.get(uid)) is not None and pod.node}
            self.pdb_touched.extend((node, "", disruption.ALWAYS) for node in sorted(nodes))
            return
        # One entry, whatever the budget's width: caches look only at nodes they evaluated with it.
        self.pdb_touched.append(("", new.uid, disruption.status_threshold(old, new)))

    def _touch(self, name: str | None) -> None:
        if name is None:
            return
        state = self.nodes.get(name)
        if state is not None:
            self._versions += 1
            state.version = self._versions
        self.touched.append(name)

    def _upsert_node(self, node: Node) -> None:
        self._nodes_by_label.clear()
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
        old = self.pods.get(pod.uid)
        if pod.priority is None:
            # Admission stamps spec.priority from the class; do the same for hand-written objects.
            pod = dataclasses.replace(pod, priority=self.priority(pod), stamped=True)
            self._stamped.add(pod.uid)
        elif pod.stamped:
            # Derived from a record we stamped (dataclasses.replace keeps the flag): still ours.
            self._stamped.add(pod.uid)
        else:
            # A priority written in the object, even one equal to our stamp: a later change
            # of the classes must leave it alone, as a cluster built from the objects would.
            self._stamped.discard(pod.uid)
        if old is not None and _BUT_VERSION(old) == _BUT_VERSION(pod):
            # Only the resourceVersion moved (a kubelet status heartbeat, say): every
            # field the engine keeps is equal, so swap the record in place and touch
            # nothing, and no cache starts over.
            self._swap(old, pod)
            return
        self._remove_pod(pod.uid)
        self.pods[pod.uid] = pod
        for owner in pod.owners:
            if owner.uid != pod.uid:
                self._owned[owner.uid] = self._owned.get(owner.uid, 0) + 1
        if pod.terminal:
            return
        if pod.node is not None:
            self._bind(pod)
            state = self.nodes.get(pod.node)
            if state is not None:
                state.pods[pod.uid] = pod
                resources.add(state.used, pod.requests)
            else:
                self._orphans.setdefault(pod.node, {})[pod.uid] = pod
            self._touch(pod.node)
            return
        group = pod.labels.get(POD_GROUP)
        if group:
            self._pending_groups.setdefault((pod.namespace, group), set()).add(pod.uid)
        if pod.nominated is not None:
            self._nominated.setdefault(pod.nominated, {})[pod.uid] = pod
            self._touch(pod.nominated)

    def _remove_pod(self, uid: str) -> None:
        old = self.pods.pop(uid, None)
        if old is None:
            return
        for owner in old.owners:
            if owner.uid != old.uid:
                left = self._owned.get(owner.uid, 0) - 1
                if left > 0:
                    self._owned[owner.uid] = left
                else:
                    self._owned.pop(owner.uid, None)
        if old.terminal:
            return
        if old.node is not None:
            self._unbind(old)
            state = self.nodes.get(old.node)
            if state is not None and state.pods.pop(uid, None) is not None:
                resources.take(state.used, old.requests)
            elif old.node in self._orphans:
                self._orphans[old.node].pop(uid, None)
                if not self._orphans[old.node]:
                    del self._orphans[old.node]
            self._touch(old.node)
            return
        group = old.labels.get(POD_GROUP)
        if group:
            members = self._pending_groups.get((old.namespace, group))
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._pending_groups[(old.namespace, group)]
        if old.nominated is not None:
            noms = self._nominated.get(old.nominated)
            if noms is not None:
                noms.pop(uid, None)
                if not noms:
                    del self._nominated[old.nominated]
            self._touch(old.nominated)

    def _swap(self, old: Pod, pod: Pod) -> None:
        self.pods[pod.uid] = pod
        if old.terminal:
            return
        if old.node is not None:
            state = self.nodes.get(old.node)
            holder = state.pods if state is not None else self._orphans.get(old.node, {})
            if pod.uid in holder:
                holder[pod.uid] = pod
            in_ns = self._bound_in_ns.get(pod.namespace)
            if in_ns is not None and pod.uid in in_ns:
                in_ns[pod.uid] = pod
                self._label_index(pod, True)  # equal labels: the same entries, the new record
            if pod.uid in self.anti_affine:
                self.anti_affine[pod.uid] = pod
                assert pod.scheduling is not None  # equal records: the same terms
                self.anti_groups[pod.scheduling.anti_affinity][pod.uid] = pod
            if pod.scheduling is not None:
                for port in pod.scheduling.ports:
                    self.host_ports[port.port][pod.uid] = pod
        elif old.nominated is not None:
            noms = self._nominated.get(old.nominated)
            if noms is not None and pod.uid in noms:
                noms[pod.uid] = pod

    def _bind(self, pod: Pod) -> None:
        """File a bound, non-terminal pod in the derived indexes."""
        self._bound_in_ns.setdefault(pod.namespace, {})[pod.uid] = pod
        self._label_index(pod, True)
        if pod.scheduling is not None:
            if pod.scheduling.anti_affinity:
                self.anti_affine[pod.uid] = pod
                self.anti_groups.setdefault(pod.scheduling.anti_affinity, {})[pod.uid] = pod
            for port in pod.scheduling.ports:
                self.host_ports.setdefault(port.port, {})[pod.uid] = pod
        if pod.priority_class:
            self._bound_in_class.setdefault(pod.priority_class, set()).add(pod.uid)
        self.budgets.add_pod(pod)
        pod_group = pod.labels.get(POD_GROUP)
        if pod_group:
            self._bound_groups.setdefault((pod.namespace, pod_group), set()).add(pod.uid)
        group = self.usage.get(_usage_key(pod))
        if group is None:
            self.usage[_usage_key(pod)] = [dict(pod.requests), 1]
        else:
            resources.add(group[0], pod.requests)
            group[1] += 1

    def _unbind(self, pod: Pod) -> None:
        in_ns = self._bound_in_ns.get(pod.namespace)
        if in_ns is not None:
            in_ns.pop(pod.uid, None)
        self._label_index(pod, False)
        if self.anti_affine.pop(pod.uid, None) is not None and pod.scheduling is not None:
            alike = self.anti_groups.get(pod.scheduling.anti_affinity)
            if alike is not None:
                alike.pop(pod.uid, None)
                if not alike:
                    del self.anti_groups[pod.scheduling.anti_affinity]
        if pod.scheduling is not None:
            for port in pod.scheduling.ports:
                held = self.host_ports.get(port.port)
                if held is not None:
                    held.pop(pod.uid, None)
                    if not held:
                        del self.host_ports[port.port]
        if pod.priority_class:
            in_class = self._bound_in_class.get(pod.priority_class)
            if in_class is not None:
                in_class.discard(pod.uid)
        self.budgets.remove_pod(pod.uid)
        pod_group = pod.labels.get(POD_GROUP)
        if pod_group:
            in_group = self._bound_groups.get((pod.namespace, pod_group))
            if in_group is not None:
                in_group.discard(pod.uid)
                if not in_group:
                    del self._bound_groups[(pod.namespace, pod_group)]
        key = _usage_key(pod)
        group = self.usage.get(key)
        if group is not None:
            resources.take(group[0], pod.requests)
            group[1] -= 1
            if group[1] <= 0:
                del self.usage[key]

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

    def pdb_touched_since(self, position: int) -> list[tuple[str, str, int]] | None:
        if position < self.pdb_touched_base:
            return None
        return self.pdb_touched[position - self.pdb_touched_base :]

    @property
    def pdb_touched_end(self) -> int:
        return self.pdb_touched_base + len(self.pdb_touched)

    def trim_pdb_touched(self, position: int) -> None:
        drop = position - self.pdb_touched_base
        if drop > 0:
            del self.pdb_touched[:drop]
            self.pdb_touched_base = position

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
            "Namespace": self.namespaces,
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
        # A pod's record lends what this event did not change (objects.pod: most
        # MODIFIED events move status or metadata only).
        record = objects.pod(obj, self.pods.get(record_uid)) if kind == "Pod" else objects.normalize(obj)
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
        keys |= {("Namespace", n) for n in self.namespaces}
        return keys


POD_GROUP = "pod-group.scheduling.sigs.k8s.io"
# Every field a Pod compares by except its resourceVersion: equal means a heartbeat. (One
# C-level tuple per record; dataclasses.replace cost a tenth of a uniform decision.)
_BUT_VERSION = operator.attrgetter(
    *(f.name for f in dataclasses.fields(Pod) if f.compare and f.name != "resource_version")
)
QUOTA_NAME = "quota.scheduling.koordinator.sh/name"
PREEMPTIBLE = "quota.scheduling.koordinator.sh/preemptible"


def _usage_key(pod: Pod) -> tuple[str, str, str | None]:
    """A pod's quota usage group; an absent preemptible label (None) differs from an empty one."""
    return (pod.namespace, pod.labels.get(QUOTA_NAME) or "", pod.labels.get(PREEMPTIBLE))


def _table_key(obj: Mapping[str, Any]) -> str:
    """Pods, PDBs and quotas are keyed by uid; nodes, classes and namespaces by name
    (cluster-scoped, unique)."""
    kind = obj.get("kind")
    meta = obj.get("metadata")
    if kind == "Pod" and type(meta) is dict:
        # The common case first (every pod event): an API object's uid, named and all.
        uid, name = meta.get("uid"), meta.get("name")
        if type(uid) is str and uid and type(name) is str and name:
            return uid
    if kind in ("Node", "PriorityClass", "Namespace"):
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
    rank = {PriorityClass: 0, Node: 1, Pdb: 2, ElasticQuota: 3, Namespace: 4, Pod: 5}
    for record in sorted(records, key=lambda r: (rank[type(r)], _sort_id(r))):
        cluster.upsert(record)
    return cluster


def _sort_id(record: Record) -> str:
    return record.name if isinstance(record, (Node, PriorityClass, Namespace)) else record.uid
