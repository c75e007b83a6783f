"""`preemptctl bench engine`: decisions per second at cluster scale, against the reference.

Two workloads:
- `uniform` (default): scheduler_perf's PreemptionBasic/Async shape: one node
  shape, one pod shape, no PDBs. K preemptors decided one after the other with
  one long-lived Index, each decision applied before the next (victims
  terminating, preemptor nominated); in the `async` shape decisions complete five
  decisions later (victims deleted, preemptor bound).
- `mixed`: a real cluster's shape (streams.sim.mixed): nodes of several sizes,
  30-40 pods per node from hundreds of workload shapes, 8 priority classes, 20
  namespaces, PDBs on a third of the workloads, 60 preemptor shapes (`--width
  wide`: a long tail of workload sizes, hundreds to thousands of replicas each for
  the widest, PDBs on a third of those); with
  `--churn`, the watch events a live cluster produces between decisions (PDB
  status updates, pods created and deleted, quota status updates) are folded in
  with `Cluster.apply`, as the worker does. `--flow job` decides gangs of 8 under
  ElasticQuotas, `--flow daemonset` DaemonSet pods pinned to full nodes.

The literal reference (engine.reference) decides some of the same questions on
the same states in the same run; the answers must agree, and the speed ratio is
reported. Before the first decision the index is warmed as a worker warms it
when it restores its state (every node's summary: `warmup_ms`, not counted as a
decision); `--no-warm` leaves it cold, as an index made with `Index(cluster,
lasting=True)` and used at once is (its first decisions pay for the summaries).
`index_ms` is making the index (`Index(...)`, outside every decision).
`cold_ms_*` are the decisions whose preemptor shape had not been decided before
in the run (each builds its ranking over every node); `warm_p99_ms` is the p99 of
all the others. `answers_sha256` digests every decision's answer (`Decision.answer`,
explanation included) in order: two trees that decide alike print the same digest.

The held-out shape (docs/performance.md, "New preemptor shapes"): `--workload mixed
--width wide --node-cpus 8,16,32 --zone-pinned 0.4 --preemptor-shapes 60 --churn
--pdb-updates 2 --pod-events 5 --no-warm --preemptors 300`.

Every latency is also given in CPU time (`cpu_*`: `time.process_time` around each
decision, the engine's own work whatever else ran on the machine meanwhile):
on a shared machine wall-clock rates move 2x with the load (`load_average`, the
1-minute figure before and after the run), CPU time far less, so compare those.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from engine import cluster as cluster_mod
from engine import flows, objects, timeutil
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import FITS, PREEMPT, Decision
from engine.index import Index
from engine.objects import Pod
from streams.bench import machine
from streams.common import options
from streams.common.errors import UsageError
from streams.sim import mixed, workloads

# Decisions the reference makes in a run: it needs ~0.1-1 s each at 5,000 nodes (the job flow: 6-13 s).
DEFAULT_REFERENCE_DECISIONS = 5
# In the async shape a decision's evictions complete this many decisions later.
ASYNC_LAG = 5


def _apply(cluster: Cluster, d: Decision, pre: Pod) -> None:
    for v in d.victims:
        pod = cluster.pods[v.uid]
        cluster.upsert(dataclasses.replace(pod, deleting=True, disruption_target=True, preempted=True))
    cluster.upsert(dataclasses.replace(cluster.pods[pre.uid], nominated=d.node))


def _complete(cluster: Cluster, d: Decision, pre: Pod) -> None:
    for v in d.victims:
        cluster.remove("Pod", v.uid)
    cluster.upsert(dataclasses.replace(cluster.pods[pre.uid], node=d.node, nominated=None))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_figures(cpu: list[float]) -> dict[str, Any]:
    """The same decisions in CPU time (`time.process_time`): what the engine spent, whatever else
    the machine ran meanwhile. Wall-clock rates on a shared machine move 2x with its load;
    these move far less, so before/after comparisons quote them."""
    return {
        "cpu_decisions_per_s": round(len(cpu) / max(sum(cpu), 1e-9), 1),
        "cpu_p50_ms": round(_percentile(cpu, 0.50) * 1000, 3),
        "cpu_p99_ms": round(_percentile(cpu, 0.99) * 1000, 3),
        "cpu_max_ms": round(max(cpu) * 1000, 3),
    }


def _load() -> float:
    """The 1-minute load average (other processes competing for the cores), -1 where unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0


def _reference_figures(ref_latencies: list[float], engine_rate: float, *, agrees: bool) -> dict[str, Any]:
    """The reference's rate on the same questions, and how the engine compares."""
    ref_rate = len(ref_latencies) / sum(ref_latencies)
    return {
        "reference_decisions": len(ref_latencies),
        "reference_decisions_per_s": round(ref_rate, 3),
        "reference_p50_ms": round(statistics.median(ref_latencies) * 1000, 1),
        "speedup": round(engine_rate / ref_rate, 1),
        "reference_agrees": agrees,
    }


def run(
    nodes: int, pods_per_node: int, count: int, shape: str, mode: str, reference_decisions: int
) -> dict[str, Any]:
    build_started = time.perf_counter()
    raw = workloads.cluster_objects(nodes, pods_per_node) + workloads.preemptors(count)
    cluster = cluster_mod.build([objects.normalize(o) for o in raw])
    build_s = time.perf_counter() - build_started
    now = timeutil.parse(workloads.EPOCH)
    config = Config(victim_selection=mode)
    index = Index(cluster, lasting=True)
    pending = [cluster.pods[f"high-{k:05d}-uid"] for k in range(count)]
    latencies: list[float] = []
    cpu: list[float] = []
    ref_latencies: list[float] = []
    disagreements = 0
    load_before = _load()
    in_flight: deque[tuple[Decision, Pod]] = deque()
    outcomes: dict[str, int] = {}
    capped = 0  # minimal mode: decisions whose explanation lists a candidate whose search hit the cap
    digest = hashlib.sha256()
    answering = 0.0
    gc.disable()  # collector pauses would dominate sub-millisecond timings
    try:
        started = time.perf_counter()
        for k, pre in enumerate(pending):
            t0, c0 = time.perf_counter(), time.process_time()
            d = flows.decide(cluster, [pre], now=now, config=config, index=index)
            latencies.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if k < reference_decisions:
                decided = flows.select(cluster, [pre])
                t0 = time.perf_counter()
                want = decided.reference(cluster, [pre], now, config)
                if want is not None:  # None: the reference does not cover this config (minimal)
                    ref_latencies.append(time.perf_counter() - t0)
                    got = sorted(v.key for v in d.victims)
                    if (want["outcome"], want["victims"]) != (d.outcome, got) or (
                        d.outcome == PREEMPT and want["node"] != d.node
                    ):
                        disagreements += 1
            t0 = time.perf_counter()
            digest.update(orjson.dumps(d.answer(), option=orjson.OPT_SORT_KEYS))
            digest.update(b"\n")
            answering += time.perf_counter() - t0
            outcomes[d.outcome] = outcomes.get(d.outcome, 0) + 1
            if any(c.get("searchCapped") for c in d.explanation.get("candidates", ())):
                capped += 1
            if d.outcome == PREEMPT:
                _apply(cluster, d, pre)
                in_flight.append((d, pre))
                if shape == "async" and len(in_flight) > ASYNC_LAG:
                    _complete(cluster, *in_flight.popleft())
        total = time.perf_counter() - started - sum(ref_latencies) - answering
    finally:
        gc.enable()
    engine_rate = len(latencies) / total
    result: dict[str, Any] = {
        "benchmark": "engine",
        "workload": "uniform",
        "shape": shape,
        "victimSelection": mode,
        "nodes": nodes,
        "pods": nodes * pods_per_node,
        "preemptors": count,
        "outcomes": outcomes,
        "capped_searches": capped,
        "decisions_per_s": round(engine_rate, 1),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "max_ms": round(max(latencies) * 1000, 3),
        "first_decision_ms": round(latencies[0] * 1000, 3),
        **_cpu_figures(cpu),
        "answers_sha256": digest.hexdigest(),
        "cluster_build_s": round(build_s, 3),
        "load_average": [load_before, _load()],
        "machine": machine.describe(),
    }
    if ref_latencies:
        result.update(_reference_figures(ref_latencies, engine_rate, agrees=disagreements == 0))
    return result


def _answer(d: Decision) -> dict[str, Any]:
    """What the reference answers: outcome, node or placements, victims."""
    out: dict[str, Any] = {"outcome": d.outcome, "victims": sorted(v.key for v in d.victims)}
    out["node"] = d.node if d.outcome in (PREEMPT, "fits") else None
    if d.placements is not None:
        out["placements"] = dict(sorted(d.placements.items()))
    return out


# How the mixed cluster makes one decision's preemptors for a flow, by the flow's name: the
# pending pod manifests and the preemptor's shape key (a shape seen before is decided warm).
Manifests = list[dict[str, Any]]
Preemptors = Callable[[mixed.MixedCluster, int, float, Manifests], tuple[Manifests, Any]]


def _default_preemptors(
    gen: mixed.MixedCluster, k: int, at: float, shapes: Manifests
) -> tuple[Manifests, Any]:
    s = gen.rng.randrange(len(shapes))
    # Two drawn shapes alike are one shape: the second is decided warm.
    return [gen.default_preemptor(k, shapes[s], at=at)], ("default", tuple(sorted(shapes[s].items())))


def _job_preemptors(gen: mixed.MixedCluster, k: int, at: float, shapes: Manifests) -> tuple[Manifests, Any]:
    raws = gen.gang(k, at=at)
    spec = raws[0]["spec"]
    return raws, ("job", spec["priority"], spec["containers"][0]["resources"]["requests"]["cpu"])


def _daemonset_preemptors(
    gen: mixed.MixedCluster, k: int, at: float, shapes: Manifests
) -> tuple[Manifests, Any]:
    return [gen.daemonset_pod(k, at=at)], ("daemonset", k)  # every DaemonSet pod has its own node


MIXED_PREEMPTORS: dict[str, Preemptors] = {
    "default": _default_preemptors,
    "job": _job_preemptors,
    "daemonset": _daemonset_preemptors,
}


def run_mixed(
    nodes: int,
    count: int,
    *,
    flow: str,
    churn: bool,
    shape: str,
    mode: str,
    seed: int,
    reference_decisions: int,
    width: str = mixed.NARROW,
    node_pods: tuple[int, int] = mixed.PODS_PER_NODE,
    interpod: float = 0.0,
    node_cpus: tuple[int, ...] = mixed.NODE_CPUS,
    zone_pinned: float | None = None,
    preemptor_shapes: int = 60,
    pdb_updates: int = 2,
    pod_events: int = 5,
    warm_index: bool = True,
) -> dict[str, Any]:
    flow_ = flows.named(flow)
    make_preemptors = MIXED_PREEMPTORS.get(flow)
    if flow_ is None or make_preemptors is None:
        raise UsageError(
            f"bench engine --workload mixed: no mixed workload makes {flow!r} preemptors "
            f"(there are: {', '.join(n for n in flows.names() if n in MIXED_PREEMPTORS)})"
        )
    build_started = time.perf_counter()
    gen = mixed.MixedCluster(
        nodes, seed=seed, width=width, pods_per_node=node_pods, interpod=interpod, node_cpus=node_cpus
    )
    cluster = Cluster()
    for obj in gen.objects():
        cluster.apply("ADDED", obj)
    build_s = time.perf_counter() - build_started
    config = Config(victim_selection=mode)
    t0, c0 = time.perf_counter(), time.process_time()
    index = Index(cluster, lasting=True)
    index_s, index_cpu = time.perf_counter() - t0, time.process_time() - c0
    # As a worker does when it restores its state (Controller.warm): every node's
    # summary before the first decision, so decisions are timed as they run live.
    t0 = time.perf_counter()
    if warm_index:
        index.warm((), mixed._T0, mode)
    warmup_s = time.perf_counter() - t0
    shapes = gen.preemptor_shapes(preemptor_shapes, zone_share=zone_pinned)
    digest = hashlib.sha256()
    # Reference checks spread over the run, so they see the churned states too.
    checks = {round(i * (count - 1) / max(1, reference_decisions - 1)) for i in range(reference_decisions)}
    latencies: list[float] = []
    cold: list[float] = []
    warm: list[float] = []
    cpu: list[float] = []
    cpu_cold: list[float] = []
    cpu_warm: list[float] = []
    load_before = _load()
    ref_latencies: list[float] = []
    seen: set[Any] = set()
    disagreements: list[dict[str, Any]] = []
    outcomes: dict[str, int] = {}
    victims_total = 0
    capped = 0  # minimal mode: decisions whose explanation lists a candidate whose search hit the cap
    churn_events = 0
    churn_s = 0.0
    in_flight: deque[tuple[Decision, list[Pod]]] = deque()
    gc.disable()  # collector pauses would dominate sub-millisecond timings
    try:
        for k in range(count):
            at = 60.0 + k  # one decision per second of log time: toleration windows move
            now = mixed._T0 + int(at * timeutil.SECOND)
            if churn:
                for kind, obj in gen.churn(pdb_updates=pdb_updates, pod_events=pod_events, step=k, at=at):
                    t0 = time.perf_counter()
                    cluster.apply(kind, obj)
                    churn_s += time.perf_counter() - t0
                    churn_events += 1
            raws, key = make_preemptors(gen, k, at, shapes)
            for raw in raws:
                cluster.apply("ADDED", raw)
            pods = [cluster.pods[r["metadata"]["uid"]] for r in raws]
            t0, c0 = time.perf_counter(), time.process_time()
            d = flows.decide(cluster, pods, now=now, config=config, index=index)
            elapsed = time.perf_counter() - t0
            spent = time.process_time() - c0
            latencies.append(elapsed)
            cpu.append(spent)
            digest.update(orjson.dumps(d.answer(), option=orjson.OPT_SORT_KEYS))
            digest.update(b"\n")
            if key not in seen:
                seen.add(key)
                cold.append(elapsed)
                cpu_cold.append(spent)
            else:
                warm.append(elapsed)
                cpu_warm.append(spent)
            if k in checks:
                t0 = time.perf_counter()
                want = flow_.reference(cluster, pods, now, config)
                if want is not None:  # None: the reference does not cover this config
                    ref_latencies.append(time.perf_counter() - t0)
                    got = _answer(d)
                    if {k2: got.get(k2) for k2 in want} != want:
                        disagreements.append({"decision": k, "engine": got, "reference": want})
            outcomes[d.outcome] = outcomes.get(d.outcome, 0) + 1
            if any(c.get("searchCapped") for c in d.explanation.get("candidates", ())):
                capped += 1
            if d.outcome == FITS:
                _bind_any(cluster, d, pods)  # the scheduler binds it: its room is taken
            elif d.outcome == PREEMPT:
                victims_total += len(d.victims)
                _apply_any(cluster, d, pods)
                for v in d.victims:
                    gen.forget(v.uid)
                in_flight.append((d, pods))
                if shape == "async" and len(in_flight) > ASYNC_LAG:
                    _complete_any(cluster, *in_flight.popleft())
    finally:
        gc.enable()
    total = sum(latencies)
    result: dict[str, Any] = {
        "benchmark": "engine",
        "workload": "mixed",
        "width": width,
        "flow": flow,
        "churn": churn,
        "shape": shape,
        "victimSelection": mode,
        "seed": seed,
        "nodes": nodes,
        "pods": len(gen.pods),
        "pods_per_node": f"{node_pods[0]}-{node_pods[1]}",
        "pdbs": len(gen.pdbs),
        "interpod": interpod,
        "node_cpus": list(node_cpus),
        "zone_pinned": zone_pinned,
        "warmed": warm_index,
        "preemptor_shapes": len(seen),
        "preemptors": count,
        "outcomes": outcomes,
        "victims_per_preempt": round(victims_total / max(1, outcomes.get(PREEMPT, 0)), 2),
        "capped_searches": capped,
        "decisions_per_s": round(count / total, 1),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "max_ms": round(max(latencies) * 1000, 3),
        "warm_p99_ms": round(_percentile(warm, 0.99) * 1000, 3) if warm else None,
        "cold_decisions": len(cold),
        "cold_ms_p50": round(_percentile(cold, 0.50) * 1000, 3),
        "cold_ms_max": round(max(cold) * 1000, 3),
        **_cpu_figures(cpu),
        "cpu_warm_p99_ms": round(_percentile(cpu_warm, 0.99) * 1000, 3) if cpu_warm else None,
        "cpu_cold_ms_p50": round(_percentile(cpu_cold, 0.50) * 1000, 3),
        "cpu_cold_ms_max": round(max(cpu_cold) * 1000, 3),
        "cpu_cold_ms_total": round(sum(cpu_cold) * 1000, 1),
        "answers_sha256": digest.hexdigest(),
        "churn_events": churn_events,
        "churn_apply_us_per_event": round(churn_s / churn_events * 1e6, 1) if churn_events else None,
        "cluster_build_s": round(build_s, 3),
        "warmup_ms": round(warmup_s * 1000, 1),
        # Making the lasting index (a worker makes it once; what it does then is not a decision's).
        "index_ms": round(index_s * 1000, 1),
        "cpu_index_ms": round(index_cpu * 1000, 1),
        "load_average": [load_before, _load()],
        "machine": machine.describe(),
    }
    if ref_latencies:
        result.update(_reference_figures(ref_latencies, count / total, agrees=not disagreements))
        if disagreements:
            result["disagreements"] = disagreements[:3]
    return result


def _apply_any(cluster: Cluster, d: Decision, pods: list[Pod]) -> None:
    """As the controller does after a preempt: victims leaving, the preemptor (or each member) nominated."""
    for v in d.victims:
        pod = cluster.pods.get(v.uid)
        if pod is not None and not pod.deleting:
            cluster.upsert(dataclasses.replace(pod, deleting=True, disruption_target=True, preempted=True))
    where = d.placements or ({pods[0].key: d.node} if d.node else {})
    for pod in pods:
        node = where.get(pod.key)
        if node is not None:
            cluster.upsert(dataclasses.replace(cluster.pods[pod.uid], nominated=node))


def _bind_any(cluster: Cluster, d: Decision, pods: list[Pod]) -> None:
    where = d.placements or ({pods[0].key: d.node} if d.node else {})
    for pod in pods:
        node = where.get(pod.key)
        if node is not None:
            cluster.upsert(dataclasses.replace(cluster.pods[pod.uid], node=node, nominated=None))


def _complete_any(cluster: Cluster, d: Decision, pods: list[Pod]) -> None:
    for v in d.victims:
        cluster.remove("Pod", v.uid)
    for pod in pods:
        held = cluster.pods.get(pod.uid)
        if held is not None and held.nominated:
            cluster.upsert(dataclasses.replace(held, node=held.nominated, nominated=None))


def cmd(args: argparse.Namespace) -> int:
    if args.write_case:
        with open(args.write_case, "wb") as f:
            f.write(orjson.dumps(workloads.case(args.nodes, args.pods_per_node)))
        print(f"wrote a {args.nodes}-node case to {args.write_case}", file=sys.stderr)
        return 0
    if args.workload == "mixed":
        result = run_mixed(
            args.nodes,
            args.preemptors,
            flow=args.flow,
            churn=args.churn,
            shape=args.shape,
            mode=args.victim_selection,
            seed=args.seed,
            reference_decisions=args.reference_decisions,
            width=args.width,
            node_pods=args.node_pods,
            interpod=args.interpod,
            node_cpus=args.node_cpus,
            zone_pinned=args.zone_pinned,
            preemptor_shapes=args.preemptor_shapes,
            pdb_updates=args.pdb_updates,
            pod_events=args.pod_events,
            warm_index=not args.no_warm,
        )
    else:
        result = run(
            args.nodes,
            args.pods_per_node,
            args.preemptors,
            args.shape,
            args.victim_selection,
            args.reference_decisions,
        )
    if args.output == "json":
        print(orjson.dumps(result).decode())
    else:
        for k, v in result.items():
            print(f"{k:>28}: {v}")
    return 0


def _pod_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"pods per node must be MIN-MAX, got {text!r}") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"pods per node must be 1 <= MIN <= MAX, got {text!r}")
    return bounds


def _cpus(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"node sizes must be CPU counts like 8,16,32, got {text!r}"
        ) from None
    if not sizes or any(c <= 0 for c in sizes):
        raise argparse.ArgumentTypeError(f"node sizes must be positive CPU counts, got {text!r}")
    return sizes


_share = options.bounded(float, least=0, most=1, what="a share from 0 to 1")


def register(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "engine",
        help="decisions/s and latency at cluster scale, side by side with the reference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  preemptctl bench engine --nodes 5000 --output json\n"
        "  preemptctl bench engine --workload mixed --churn --nodes 5000 --output json\n"
        "  preemptctl bench engine --workload mixed --width wide --churn --nodes 5000\n"
        "  preemptctl bench engine --workload mixed --width wide --interpod 0.3 --nodes 5000\n"
        "  preemptctl bench engine --workload mixed --width wide --node-cpus 8,16,32 --zone-pinned 0.4 \\\n"
        "      --churn --no-warm --preemptors 300   # new shapes' cold cost (held-out shape)\n"
        "  preemptctl bench engine --workload mixed --churn --flow job --preemptors 100\n"
        "  preemptctl bench engine --nodes 500 --shape async --victim-selection minimal\n"
        "  preemptctl bench engine --workload mixed --nodes 12 --node-pods 50-110 \\\n"
        "      --victim-selection minimal\n"
        "  preemptctl bench engine --nodes 5000 --write-case big.json   # a case for `decide`",
    )
    p.add_argument("--workload", choices=("uniform", "mixed"), default="uniform")
    p.add_argument(
        "--interpod",
        type=_share,
        default=0.0,
        metavar="SHARE",
        help="mixed: the share of workloads (and of preemptor shapes) carrying required anti-affinity "
        "or a DoNotSchedule zone/hostname spread; preemptor shapes may also ask for a host port "
        "(e.g. 0.3)",
    )
    p.add_argument(
        "--churn", action="store_true", help="mixed: fold a live cluster's events between decisions"
    )
    p.add_argument(
        "--flow",
        choices=flows.names(),
        default=flows.registry()[-1].name,
        help="mixed only: the flow whose preemptors the run makes (default: the catch-all, default)",
    )
    p.add_argument("--seed", type=int, default=1, help="mixed: the generator's seed")
    p.add_argument(
        "--width",
        choices=mixed.WIDTHS,
        default=mixed.NARROW,
        help="mixed: replicas per workload; narrow: alike (~58 each at 5,000 nodes); wide: a long tail "
        "(a few hundred workloads of hundreds to thousands of replicas over most nodes, PDBs on them)",
    )
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods-per-node", type=int, default=4, help="uniform only")
    p.add_argument(
        "--node-pods",
        type=_pod_range,
        default=mixed.PODS_PER_NODE,
        metavar="MIN-MAX",
        help="mixed only: pods per node, drawn between MIN and MAX (default 30-40; 50-110 fills nodes to "
        "kubelet's pod limit, where minimal mode searches hardest)",
    )
    p.add_argument(
        "--node-cpus",
        type=_cpus,
        default=mixed.NODE_CPUS,
        metavar="C,C,...",
        help="mixed only: node sizes in CPUs, each node drawing one alike (default 8,16,16,32: half of "
        "them 16; the held-out shape is 8,16,32)",
    )
    p.add_argument(
        "--zone-pinned",
        type=_share,
        default=None,
        metavar="SHARE",
        help="mixed only: the share of preemptor shapes pinned to a zone by nodeSelector (default: "
        "every third shape; the held-out shape is 0.4)",
    )
    p.add_argument(
        "--preemptor-shapes",
        type=int,
        default=60,
        metavar="N",
        help="mixed, default flow: preemptor shapes drawn from (default 60)",
    )
    p.add_argument(
        "--pdb-updates",
        type=int,
        default=2,
        metavar="N",
        help="mixed --churn: PDB status updates per decision",
    )
    p.add_argument(
        "--pod-events",
        type=int,
        default=5,
        metavar="N",
        help="mixed --churn: pod events (created, deleted, status-only) per decision",
    )
    p.add_argument(
        "--no-warm",
        action="store_true",
        help="mixed: do not warm the index before the first decision (Index(cluster, lasting=True) used "
        "at once: the first decisions pay for every node's summary)",
    )
    p.add_argument("--preemptors", type=int, default=1000)
    p.add_argument("--shape", choices=("basic", "async"), default="basic")
    p.add_argument("--victim-selection", choices=("kubernetes", "minimal"), default="kubernetes")
    p.add_argument("--reference-decisions", type=int, default=DEFAULT_REFERENCE_DECISIONS)
    p.add_argument("--write-case", metavar="FILE", help="write one large decide case as JSON and exit")
    p.add_argument("--output", choices=("json", "text"), default="text")
    p.set_defaults(func=cmd)
