"""`preemptctl bench engine`: decisions per second at cluster scale, against the reference.

Builds a scheduler_perf-shaped cluster, then decides K preemptors one after the
other with one long-lived Index, applying each decision to the cluster before
the next one (victims terminating, preemptor nominated), as the worker does.
In the `async` shape, decisions complete five decisions later (victims deleted,
preemptor bound), so the index also absorbs the cluster's own churn. The
literal reference (engine.reference) decides the first few preemptors on the
same states in the same run; the answers must agree and the speed ratio is
reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from collections import deque
from typing import Any

import orjson

from engine import cluster as cluster_mod
from engine import flows, objects, reference, timeutil
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import PREEMPT, Decision
from engine.index import Index
from engine.objects import Pod
from streams.bench import machine
from streams.sim import workloads

# Decisions the reference makes in a run: it needs ~0.1-1 s each at 5,000 nodes.
DEFAULT_REFERENCE_DECISIONS = 5
# In the async shape a decision's evictions complete this many decisions later.
ASYNC_LAG = 5


def _apply(cluster: Cluster, d: Decision, pre: Pod) -> None:
    for v in d.victims:
        pod = cluster.pods[v.uid]
        cluster.upsert(dataclasses.replace(pod, deleting=True, disruption_target=True))
    cluster.upsert(dataclasses.replace(cluster.pods[pre.uid], nominated=d.node))


def _complete(cluster: Cluster, d: Decision, pre: Pod) -> None:
    for v in d.victims:
        cluster.remove("Pod", v.uid)
    cluster.upsert(dataclasses.replace(cluster.pods[pre.uid], node=d.node, nominated=None))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    nodes: int, pods_per_node: int, count: int, shape: str, mode: str, reference_decisions: int
) -> dict[str, Any]:
    build_started = time.perf_counter()
    raw = workloads.cluster_objects(nodes, pods_per_node) + workloads.preemptors(count)
    cluster = cluster_mod.build([objects.normalize(o) for o in raw])
    build_s = time.perf_counter() - build_started
    now = timeutil.parse(workloads.EPOCH)
    config = Config(victim_selection=mode)
    index = Index(cluster)
    pending = [cluster.pods[f"high-{k:05d}-uid"] for k in range(count)]
    latencies: list[float] = []
    ref_latencies: list[float] = []
    disagreements = 0
    in_flight: deque[tuple[Decision, Pod]] = deque()
    outcomes: dict[str, int] = {}
    gc.disable()  # collector pauses would dominate sub-millisecond timings
    try:
        started = time.perf_counter()
        for k, pre in enumerate(pending):
            t0 = time.perf_counter()
            d = flows.decide(cluster, [pre], now=now, config=config, index=index)
            latencies.append(time.perf_counter() - t0)
            if k < reference_decisions and mode == "kubernetes":
                t0 = time.perf_counter()
                want = reference.decide(cluster, pre, now)
                ref_latencies.append(time.perf_counter() - t0)
                got = sorted(v.key for v in d.victims)
                if (want["outcome"], want["victims"]) != (d.outcome, got) or (
                    d.outcome == PREEMPT and want["node"] != d.node
                ):
                    disagreements += 1
            outcomes[d.outcome] = outcomes.get(d.outcome, 0) + 1
            if d.outcome == PREEMPT:
                _apply(cluster, d, pre)
                in_flight.append((d, pre))
                if shape == "async" and len(in_flight) > ASYNC_LAG:
                    _complete(cluster, *in_flight.popleft())
        total = time.perf_counter() - started - sum(ref_latencies)
    finally:
        gc.enable()
    engine_rate = len(latencies) / total
    result: dict[str, Any] = {
        "benchmark": "engine",
        "shape": shape,
        "victimSelection": mode,
        "nodes": nodes,
        "pods": nodes * pods_per_node,
        "preemptors": count,
        "outcomes": outcomes,
        "decisions_per_s": round(engine_rate, 1),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "max_ms": round(max(latencies) * 1000, 3),
        "first_decision_ms": round(latencies[0] * 1000, 3),
        "cluster_build_s": round(build_s, 3),
        "machine": machine.describe(),
    }
    if ref_latencies:
        ref_rate = len(ref_latencies) / sum(ref_latencies)
        result["reference_decisions"] = len(ref_latencies)
        result["reference_decisions_per_s"] = round(ref_rate, 2)
        result["reference_p50_ms"] = round(statistics.median(ref_latencies) * 1000, 1)
        result["speedup"] = round(engine_rate / ref_rate, 1)
        result["reference_agrees"] = disagreements == 0
    return result


def cmd(args: argparse.Namespace) -> int:
    if args.write_case:
        with open(args.write_case, "wb") as f:
            f.write(orjson.dumps(workloads.case(args.nodes, args.pods_per_node)))
        print(f"wrote a {args.nodes}-node case to {args.write_case}", file=sys.stderr)
        return 0
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


def register(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "engine",
        help="decisions/s and latency at cluster scale, side by side with the reference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  preemptctl bench engine --nodes 5000 --output json\n"
        "  preemptctl bench engine --nodes 500 --shape async --victim-selection minimal\n"
        "  preemptctl bench engine --nodes 5000 --write-case big.json   # a case for `decide`",
    )
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods-per-node", type=int, default=4)
    p.add_argument("--preemptors", type=int, default=1000)
    p.add_argument("--shape", choices=("basic", "async"), default="basic")
    p.add_argument("--victim-selection", choices=("kubernetes", "minimal"), default="kubernetes")
    p.add_argument("--reference-decisions", type=int, default=DEFAULT_REFERENCE_DECISIONS)
    p.add_argument("--write-case", metavar="FILE", help="write one large decide case as JSON and exit")
    p.add_argument("--output", choices=("json", "text"), default="text")
    p.set_defaults(func=cmd)
