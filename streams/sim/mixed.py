"""A real cluster's mixed shape and churn, seeded: what `bench engine --workload mixed` decides on.

scheduler_perf's preemption workloads (`workloads`) have one node shape, one pod
shape and no PDBs, so every decision hits one warm ranking. Real clusters are not
like that; this generator builds one that is closer, from a seed:

- nodes of 8, 16 and 32 CPU (4 GiB per CPU) in three zones, a few tainted for
  dedicated use;
- 8 PriorityClasses, two of them with a PreemptionToleration policy;
- `WORKLOADS_PER_SHAPE` workloads (Deployments) for each of `shapes` pod shapes
  (requests, QoS, priority class, namespace), spread over 20 namespaces;
- 30-40 replicas per node drawn from those workloads until the node is ~90% full,
  with start times spread over a month;
- a PodDisruptionBudget on about a third of the workloads, with
  `disruptionsAllowed` between 0 and 3;
- a width (`WIDTHS`): `narrow` draws every replica from all workloads alike
  (~58 replicas each at 5,000 nodes, a PDB change touching ~58 nodes); `wide`
  gives the cluster a long tail, as big clusters have it: one workload per pod
  shape per `WIDE_NODES_PER_WORKLOAD` nodes (web fleets, batch arrays) carries
  `WIDE_SHARE` of the pods, sized from a Pareto distribution (hundreds to
  thousands of replicas spread over most nodes), a third of them under a PDB
  (and no other workload); the rest are narrow workloads;
- ElasticQuotas on half of the namespaces, whose pods carry the Koordinator
  labels (a mix of preemptible and not);
- preemptor shapes for each flow: 60 single-pod shapes for the default flow (some
  with a zone nodeSelector, some tolerating the dedicated taint), gangs of 8 under
  ElasticQuotas for the job flow, DaemonSet pods pinned to full nodes;
- churn between decisions, as a live cluster produces it: PDB status updates
  (disruptionsAllowed moving as pods come and go), pods created and deleted,
  status-only pod updates, and now and then an ElasticQuota status update.

Everything is raw Kubernetes JSON with uids and resourceVersions, so the same
objects feed the engine through `Cluster.apply`, exactly as the worker folds them.
The randomness is `random.Random(seed)`: a benchmark input, never a decision.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine import timeutil
from streams.sim import workloads

EPOCH = "2026-01-01T00:00:00Z"
_T0 = timeutil.parse(EPOCH)
# Workloads per pod shape: a shape is requests + class + namespace; each of its
# workloads is one Deployment with its own app label (and maybe its own PDB).
WORKLOADS_PER_SHAPE = 10
NAMESPACES = tuple(f"team-{i:02d}" for i in range(20))
QUOTA_NAMESPACES = NAMESPACES[:10]
ZONES = ("zone-a", "zone-b", "zone-c")
ZONE_LABEL = "topology.kubernetes.io/zone"
DEDICATED_TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
# (name, value, toleration annotations): two classes protect their pods for a while.
CLASSES: tuple[tuple[str, int, dict[str, str]], ...] = (
    ("scavenger", 0, {}),
    (
        "batch",
        100,
        {
            "preemption-toleration.scheduling.x-k8s.io/minimum-preemptable-priority": "10000",
            "preemption-toleration.scheduling.x-k8s.io/toleration-seconds": "3600",
        },
    ),
    ("low", 1000, {}),
    ("default", 5000, {}),
    (
        "standard",
        10000,
        {
            "preemption-toleration.scheduling.x-k8s.io/minimum-preemptable-priority": "100000",
            "preemption-toleration.scheduling.x-k8s.io/toleration-seconds": "600",
        },
    ),
    ("high", 50000, {}),
    ("critical-apps", 100000, {}),
    ("platform", 1000000, {}),
)
VICTIM_CLASSES = CLASSES[:6]  # workloads run at these; preemptors come from above them
# Cluster widths: how replicas spread over workloads (module docstring).
NARROW, WIDE = "narrow", "wide"
WIDTHS = (NARROW, WIDE)
# Wide: one wide workload per this many nodes (312 at 5,000 nodes, 31 at 500), which
# together hold this share of the pods; their sizes are Pareto(WIDE_PARETO_ALPHA)
# draws (mean 3x the smallest), so a few run thousands of replicas.
WIDE_NODES_PER_WORKLOAD = 16
WIDE_SHARE = 0.9
WIDE_PARETO_ALPHA = 1.5
# A wide workload runs under a PDB this often (about a third: ~100 at 5,000 nodes).
WIDE_PDB_CHANCE = 0.33
CPU_MILLIS = (50, 100, 200, 250, 500, 500, 750, 1000, 1000, 1500, 2000, 4000)
# Node sizes in CPUs, drawn alike for each node (16 twice: half the nodes by default).
NODE_CPUS = (8, 16, 16, 32)
# Replicas per node, drawn between these: a busy node of an ordinary cluster.
PODS_PER_NODE = (30, 40)
POD_GROUP = "pod-group.scheduling.sigs.k8s.io"
QUOTA_NAME = "quota.scheduling.koordinator.sh/name"
PREEMPTIBLE = "quota.scheduling.koordinator.sh/preemptible"


@dataclass(slots=True)
class Workload:
    namespace: str
    app: str
    priority_class: str
    cpu_m: int
    mem_mi: int
    guaranteed: bool
    pdb_allowed: int | None
    preemptible: str | None
    replicas: list[str] = field(default_factory=list)  # uids
    # Required anti-affinity against its own replicas ("hostname"), or a DoNotSchedule
    # spread of them ("zone" or "hostname"): what `interpod` gives a share of workloads.
    spread: str | None = None


def _interpod_spec(kind: str, app: str) -> dict[str, Any]:
    """The pod spec fields of one inter-pod requirement against the replicas of `app`."""
    selector = {"matchLabels": {"app": app}}
    if kind == "anti-hostname":
        term = {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}
        return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}
    key = ZONE_LABEL if kind == "spread-zone" else "kubernetes.io/hostname"
    spread = {
        "maxSkew": 1,
        "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": selector,
    }
    return {"topologySpreadConstraints": [spread]}


def _time(seconds: float) -> str:
    return timeutil.render(_T0 + int(seconds * timeutil.SECOND))


class MixedCluster:
    """One seeded cluster: its objects, preemptors for each flow, and churn to apply between decisions."""

    def __init__(
        self,
        nodes: int,
        *,
        seed: int = 1,
        shapes: int = 300,
        pods_per_node: tuple[int, int] = PODS_PER_NODE,
        fill: float = 0.97,
        width: str = NARROW,
        interpod: float = 0.0,
        node_cpus: tuple[int, ...] = NODE_CPUS,
    ) -> None:
        if width not in WIDTHS:
            raise ValueError(f"width must be one of {', '.join(WIDTHS)}, got {width!r}")
        if not 0.0 <= interpod <= 1.0:
            raise ValueError(f"interpod must be a share from 0 to 1, got {interpod!r}")
        if not node_cpus or any(c <= 0 for c in node_cpus):
            raise ValueError(f"node sizes must be positive CPU counts, got {node_cpus!r}")
        self.node_cpus = tuple(node_cpus)
        self.rng = random.Random(seed)
        # A generator of its own, so a cluster without inter-pod requirements is the same
        # cluster, seed for seed, as before they existed.
        self.interpod = interpod
        self._interpod_rng = random.Random(seed * 7919 + 1)
        self.width = width
        self.rv = 1
        self.nodes: list[dict[str, Any]] = []
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> raw, bound pods
        self.free_m: dict[str, int] = {}  # node -> free CPU millis
        self.workloads: list[Workload] = []
        self.pdbs: dict[str, dict[str, Any]] = {}  # app -> raw
        self.quotas: list[dict[str, Any]] = []
        # Cumulative weights of `workloads` for drawing a replica's workload: all alike
        # when narrow, by each wide workload's target size when wide.
        self._cum_weights: list[float] = []
        self._serial = 0
        self._build(nodes, shapes, pods_per_node, fill)

    # ---- building ------------------------------------------------------------------

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _build(self, nodes: int, shapes: int, per_node: tuple[int, int], fill: float) -> None:
        rng = self.rng
        for i in range(nodes):
            cpu = rng.choice(self.node_cpus)
            name = f"node-{i:05d}"
            alloc = {"cpu": str(cpu), "memory": f"{cpu * 4}Gi", "pods": "110"}
            labels = {"kubernetes.io/hostname": name, ZONE_LABEL: ZONES[i % len(ZONES)]}
            spec: dict[str, Any] = {}
            if rng.random() < 0.05:
                spec["taints"] = [dict(DEDICATED_TAINT)]
            self.nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "uid": f"{name}-uid",
                        "resourceVersion": "1",
                        "labels": labels,
                    },
                    "spec": spec,
                    "status": {"allocatable": alloc, "capacity": alloc},
                }
            )
            self.free_m[name] = cpu * 1000
        for s in range(shapes):
            namespace = NAMESPACES[s % len(NAMESPACES)]
            klass = rng.choice(VICTIM_CLASSES)[0]
            cpu_m = rng.choice(CPU_MILLIS)
            mem_mi = cpu_m * rng.choice((1, 2, 4))
            guaranteed = rng.random() < 0.3
            for copy_no in range(WORKLOADS_PER_SHAPE):
                preemptible = None
                if namespace in QUOTA_NAMESPACES:
                    preemptible = rng.choice(("true", "true", "false"))
                workload = Workload(
                    namespace,
                    f"app-{s:03d}-{copy_no}",
                    klass,
                    cpu_m,
                    mem_mi,
                    guaranteed,
                    rng.randint(0, 3) if rng.random() < 0.3 else None,
                    preemptible,
                )
                self.workloads.append(workload)
        if self.interpod:
            pick = self._interpod_rng
            for w in self.workloads:
                if pick.random() < self.interpod:
                    w.spread = pick.choice(("anti-hostname", "spread-zone", "spread-hostname"))
        self._weigh(nodes, per_node)
        for n in self.nodes:
            name = n["metadata"]["name"]
            cap = int(n["status"]["allocatable"]["cpu"]) * 1000
            target = rng.randint(*per_node)
            for count in range(target):
                room = self.free_m[name] - int(cap * (1 - fill))
                if room <= 0:
                    break
                # Aim at an average that fills the node with `target` pods, as a
                # scheduler packing a busy cluster would leave it.
                aim = room / (target - count)
                for _ in range(50):
                    w = self._draw()
                    if aim / 4 <= w.cpu_m <= min(aim * 2, room):
                        break
                else:
                    continue
                self._replica(w, name, started=-rng.uniform(60, 30 * 86400))
        for w in self.workloads:
            if w.pdb_allowed is not None:
                self.pdbs[w.app] = self._pdb(w)
        for namespace in QUOTA_NAMESPACES:
            self.quotas.append(self._quota(namespace))

    def _weigh(self, nodes: int, per_node: tuple[int, int]) -> None:
        """Each workload's share of the replicas: alike when narrow; a long tail when wide."""
        rng = self.rng
        weights = [1.0] * len(self.workloads)
        if self.width == WIDE:
            wide = max(1, nodes // WIDE_NODES_PER_WORKLOAD)
            pods = nodes * sum(per_node) / 2
            sizes = [rng.paretovariate(WIDE_PARETO_ALPHA) for _ in range(wide)]
            scale = pods * WIDE_SHARE / sum(sizes)
            narrow_each = pods * (1 - WIDE_SHARE) / max(1, len(self.workloads) - wide)
            weights = [narrow_each] * len(self.workloads)
            for workload in self.workloads:
                workload.pdb_allowed = None  # PDBs guard the wide workloads, as in the clusters modelled
            shapes = len(self.workloads) // WORKLOADS_PER_SHAPE
            for i, size in enumerate(sizes):
                # Spread over the pod shapes: copy i // shapes of shape i % shapes.
                at = (i % shapes) * WORKLOADS_PER_SHAPE + (i // shapes) % WORKLOADS_PER_SHAPE
                weights[at] = size * scale
                self.workloads[at].pdb_allowed = rng.randint(0, 2) if rng.random() < WIDE_PDB_CHANCE else None
        total = 0.0
        for weight in weights:
            total += weight
            self._cum_weights.append(total)

    def _draw(self) -> Workload:
        """A workload for one replica, by the cluster's width."""
        if self.width == NARROW:
            return self.rng.choice(self.workloads)  # the narrow cluster as it always was, seed for seed
        return self.rng.choices(self.workloads, cum_weights=self._cum_weights)[0]

    def _replica(self, w: Workload, node: str, *, started: float) -> dict[str, Any]:
        self._serial += 1
        name = f"{w.app}-{self._serial:07d}"
        uid = f"{w.namespace}-{name}"
        requests = {"cpu": f"{w.cpu_m}m", "memory": f"{w.mem_mi}Mi"}
        resources: dict[str, Any] = {"requests": requests}
        if w.guaranteed:
            resources["limits"] = dict(requests)
        labels = {"app": w.app}
        if w.preemptible is not None:
            labels[PREEMPTIBLE] = w.preemptible
        at = _time(started)
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": w.namespace,
                "uid": uid,
                "resourceVersion": self._next_rv(),
                "creationTimestamp": at,
                "labels": labels,
                "ownerReferences": [{"kind": "ReplicaSet", "name": f"{w.app}-rs", "uid": f"{w.app}-rs-uid"}],
            },
            "spec": {
                "nodeName": node,
                "priorityClassName": w.priority_class,
                "priority": dict((c[0], c[1]) for c in CLASSES)[w.priority_class],
                "containers": [{"name": "app", "resources": resources}],
                "terminationGracePeriodSeconds": 30,
            },
            "status": {
                "phase": "Running",
                "startTime": at,
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at}],
            },
        }
        if w.spread is not None:
            pod["spec"].update(_interpod_spec(w.spread, w.app))
        self.pods[uid] = pod
        w.replicas.append(uid)
        self.free_m[node] -= w.cpu_m
        return pod

    def _pdb(self, w: Workload) -> dict[str, Any]:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {
                "name": w.app,
                "namespace": w.namespace,
                "uid": f"{w.namespace}-{w.app}-pdb",
                "resourceVersion": self._next_rv(),
            },
            "spec": {"selector": {"matchLabels": {"app": w.app}}, "maxUnavailable": 1},
            "status": {"disruptionsAllowed": w.pdb_allowed},
        }

    def _quota(self, namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "ElasticQuota",
            "metadata": {
                "name": f"{namespace}-quota",
                "namespace": namespace,
                "uid": f"{namespace}-quota-uid",
                "resourceVersion": self._next_rv(),
            },
            "spec": {
                "min": {"cpu": "2000", "memory": "8000Gi"},
                "max": {"cpu": "100000", "memory": "400000Gi"},
            },
            "status": {"used": {"cpu": "0"}},
        }

    def classes(self) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name, "uid": f"{name}-uid", "resourceVersion": "1", "annotations": ann},
                "value": value,
                "preemptionPolicy": "PreemptLowerPriority",
            }
            for name, value, ann in CLASSES
        ]

    def objects(self) -> list[dict[str, Any]]:
        """Every object of the cluster, classes and nodes first."""
        return [*self.classes(), *self.nodes, *self.pdbs.values(), *self.quotas, *self.pods.values()]

    # ---- preemptors ------------------------------------------------------------------

    def _pending(self, name: str, namespace: str, *, priority: int, cpu_m: int, at: float) -> dict[str, Any]:
        ts = _time(at)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"{namespace}-{name}",
                "resourceVersion": self._next_rv(),
                "creationTimestamp": ts,
                "labels": {},
            },
            "spec": {
                "priority": priority,
                "containers": [
                    {
                        "name": "app",
                        "resources": {"requests": {"cpu": f"{cpu_m}m", "memory": f"{cpu_m * 2}Mi"}},
                    }
                ],
                "terminationGracePeriodSeconds": 30,
            },
            "status": workloads.unschedulable(ts),
        }

    def preemptor_shapes(self, count: int = 60, *, zone_share: float | None = None) -> list[dict[str, Any]]:
        """`count` single-pod shapes for the default flow: priority, size, zone selector, taint toleration.

        `zone_share`: the share of shapes pinned to a zone by nodeSelector, spread evenly
        over the shapes (None: every third shape, as always)."""
        if zone_share is not None and not 0.0 <= zone_share <= 1.0:
            raise ValueError(f"zone share must be from 0 to 1, got {zone_share!r}")
        rng = self.rng
        shapes = []
        for s in range(count):
            shape: dict[str, Any] = {
                "priority": rng.choice((5000, 10000, 50000, 100000, 1000000)),
                "cpu_m": rng.choice((1000, 2000, 3000, 4000, 6000, 8000)),
            }
            if zone_share is None:
                pinned = s % 3 == 0
            else:
                pinned = int((s + 1) * zone_share + 1e-9) > int(s * zone_share + 1e-9)
            if pinned:
                shape["zone"] = ZONES[s % len(ZONES)]
            if s % 10 == 5:
                shape["tolerate"] = True
            if self.interpod and self._interpod_rng.random() < self.interpod:
                # Joins a workload that carries one, as a new replica of a rollout does; or
                # asks for a host port.
                carriers = [w for w in self.workloads if w.spread is not None and w.namespace == "team-19"]
                if carriers and self._interpod_rng.random() < 0.8:
                    w = self._interpod_rng.choice(carriers)
                    shape["interpod"] = (w.spread, w.app)
                else:
                    shape["interpod"] = ("port", "")
            shapes.append(shape)
        return shapes

    def default_preemptor(self, k: int, shape: dict[str, Any], *, at: float) -> dict[str, Any]:
        pod = self._pending(
            f"pre-{k:06d}", "team-19", priority=shape["priority"], cpu_m=shape["cpu_m"], at=at
        )
        if "zone" in shape:
            pod["spec"]["nodeSelector"] = {ZONE_LABEL: shape["zone"]}
        if shape.get("tolerate"):
            pod["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
        if "interpod" in shape:
            kind, app = shape["interpod"]
            if kind == "port":
                pod["spec"]["containers"][0]["ports"] = [{"containerPort": 9100, "hostPort": 9100}]
            else:
                pod["metadata"]["labels"] = {"app": app}
                pod["spec"].update(_interpod_spec(kind, app))
        return pod

    def gang(self, k: int, *, size: int = 8, at: float) -> list[dict[str, Any]]:
        """A job of `size` members under a namespace's ElasticQuota (pod-group label, preemptible)."""
        rng = self.rng
        namespace = QUOTA_NAMESPACES[k % len(QUOTA_NAMESPACES)]
        priority = rng.choice((5000, 10000, 50000))
        cpu_m = rng.choice((2000, 4000, 6000))
        group = f"job-{k:05d}"
        # A share `interpod` of gangs spread their members, one per host (required
        # anti-affinity) or evenly over zones (DoNotSchedule spread), as distributed training
        # jobs do; drawn from their own generator so the other gangs stay as they were.
        interpod = None
        if self.interpod and self._interpod_rng.random() < self.interpod:
            interpod = self._interpod_rng.choice(("anti-hostname", "spread-zone"))
        members = []
        for m in range(size):
            pod = self._pending(f"{group}-{m}", namespace, priority=priority, cpu_m=cpu_m, at=at)
            pod["metadata"]["labels"] = {
                POD_GROUP: group,
                QUOTA_NAME: f"{namespace}-quota",
                PREEMPTIBLE: "true",
            }
            if interpod is not None:
                pod["metadata"]["labels"]["app"] = group
                pod["spec"].update(_interpod_spec(interpod, group))
            members.append(pod)
        return members

    def daemonset_pod(self, k: int, *, at: float) -> dict[str, Any]:
        """A DaemonSet pod pinned (node affinity on metadata.name) to a node with too little room."""
        rng = self.rng
        full = [n for n, free in self.free_m.items() if free < 600]
        node = rng.choice(full or sorted(self.free_m))
        pod = self._pending(
            f"ds-{k:06d}", "kube-system", priority=1000000, cpu_m=rng.choice((200, 500, 1000)), at=at
        )
        pod["metadata"]["ownerReferences"] = [
            {"kind": "DaemonSet", "name": f"ds-{k % 20}", "uid": f"ds-{k % 20}-uid"}
        ]
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                }
            }
        }
        return pod

    # ---- churn -----------------------------------------------------------------------

    def churn(
        self, *, pdb_updates: int = 2, pod_events: int = 5, quota_every: int = 10, step: int = 0, at: float
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The watch events a live cluster produces between two decisions, as (type, object)."""
        rng = self.rng
        if self.pdbs:
            for app in rng.sample(sorted(self.pdbs), min(pdb_updates, len(self.pdbs))):
                pdb = copy.deepcopy(self.pdbs[app])
                old = pdb["status"]["disruptionsAllowed"]
                pdb["status"]["disruptionsAllowed"] = rng.choice([v for v in (0, 1, 2, 3) if v != old])
                pdb["metadata"]["resourceVersion"] = self._next_rv()
                self.pdbs[app] = pdb
                yield "MODIFIED", pdb
        uids = list(self.pods)
        for _ in range(pod_events):
            roll = rng.random()
            if roll < 0.4 and uids:
                uid = uids[rng.randrange(len(uids))]
                pod = self.pods.pop(uid, None)
                if pod is None:
                    continue
                self.free_m[pod["spec"]["nodeName"]] += int(
                    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"][:-1]
                )
                pod = copy.deepcopy(pod)
                pod["metadata"]["resourceVersion"] = self._next_rv()
                yield "DELETED", pod
            elif roll < 0.8:
                w = self._draw()
                fits = [n for n, free in self.free_m.items() if free >= w.cpu_m]
                if not fits:
                    continue
                node = fits[rng.randrange(len(fits))]
                yield "ADDED", copy.deepcopy(self._replica(w, node, started=at))
            elif uids:
                uid = uids[rng.randrange(len(uids))]
                pod = self.pods.get(uid)
                if pod is None:
                    continue
                pod["metadata"]["resourceVersion"] = self._next_rv()  # a kubelet status heartbeat
                yield "MODIFIED", copy.deepcopy(pod)
        if quota_every and step % quota_every == 0 and self.quotas:
            q = copy.deepcopy(self.quotas[step // quota_every % len(self.quotas)])
            q["status"] = {"used": {"cpu": str(rng.randint(0, 2000))}}
            q["metadata"]["resourceVersion"] = self._next_rv()
            self.quotas[step // quota_every % len(self.quotas)] = q
            yield "MODIFIED", q

    def forget(self, uid: str) -> None:
        """A pod the engine's decision removed (evicted): no longer churned."""
        pod = self.pods.pop(uid, None)
        if pod is not None:
            cpu = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
            self.free_m[pod["spec"]["nodeName"]] += int(cpu[:-1])
