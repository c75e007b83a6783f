"""The whole loop, side by side: preemptctl's profile and kube-scheduler's DefaultPreemption on one cluster.

    .venv/bin/python benchmarks/e2e.py --nodes 1000 --pods-per-node 10 --preemptors 30 --victims 4
    .venv/bin/python benchmarks/e2e.py --nodes 40 --preemptors 6 --output json      # a quick look

One control plane (testbed/stack.py: kube-apiserver + etcd, kube-scheduler v1.34.2
with both profiles of docs/deploy.md, kwok faking the nodes) and preemptctl's source,
worker and actuator on the embedded tansu. The nodes are split in two halves by a
label, one per profile, each node full of low-priority pods (bound directly; their
status is written here, as kwok falls behind at thousands of pods on a loaded
machine). Preemptors are then created alternately for each profile, one every
--interval seconds, each needing --victims victims on one node; the two profiles
never compete for a node, so each sees the same cluster load.

For each profile it reports time-to-bind (creation to kube-scheduler's binding, seen
by a watch) p50/p99, evictions per preemptor, preemptors never bound, and wasted
evictions: victims evicted for a preemptor that was bound on another node or never
bound (victims are attributed by the Preempted Events both deciders write, regarding
the victim, naming the preemptor's uid). For preemptctl it also says where the time
goes, from the records' own times: kube-scheduler's first attempt and the source's
watch (creation to the event's ts), source batching and Kafka (ts to the record's
append time), the worker (record to decision), the actuator (decision to its last
outcome), and kwok plus kube-scheduler's retry (last outcome to binding).
This is a benchmark, never a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas import records
from streams.brokers import embedded
from testbed import objects
from testbed.stack import ControlPlane, Stack, stack, wait_for

NAMESPACE = "bench"
PROFILES = {"preemptctl": "preemptctl-scheduler", "default": "default-scheduler"}
ROLE = "bench.preemptctl.io/role"
# Pods created at once while filling the nodes: the API server takes these in parallel.
FILL_THREADS = 8
# A preemptor not bound this long after the last one was created counts as never bound.
BIND_TIMEOUT_S = 120.0


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Watch(threading.Thread):
    """Watches the preemptors; the wall time each was first seen bound, and where."""

    def __init__(self, plane: ControlPlane) -> None:
        super().__init__(daemon=True)
        self.plane = plane
        self.bound: dict[str, tuple[float, str]] = {}  # name -> (time, node)
        self.uids: dict[str, str] = {}

    def run(self) -> None:
        cluster = self.plane.cluster
        selector = urllib.request.quote(f"{ROLE}=preemptor")
        url = f"{cluster.url}/api/v1/namespaces/{NAMESPACE}/pods?watch=1&labelSelector={selector}"
        context = ssl.create_default_context(cafile=str(cluster.ca_file))
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {cluster.token('admin')}"})
        while True:
            try:
                response = urllib.request.urlopen(request, context=context, timeout=600)
            except OSError:
                return  # the control plane is gone: the run is over
            with response:
                for line in response:
                    pod = orjson.loads(line)["object"]
                    name = pod["metadata"]["name"]
                    self.uids[name] = pod["metadata"]["uid"]
                    node = pod["spec"].get("nodeName")
                    if node and name not in self.bound:
                        self.bound[name] = (time.time(), node)


def fill(plane: ControlPlane, nodes: int, pods_per_node: int) -> dict[str, str]:
    """kwok nodes, half per profile, each full of low-priority pods; node -> profile."""
    for name, value in (("bench-low", 10), ("bench-high", 1000)):
        try:
            plane.create(objects.priority_class(name, value))
        except urllib.error.HTTPError:
            pass
    owner = {f"bench-n{i:04d}": list(PROFILES)[i % 2] for i in range(nodes)}

    def make_node(name: str) -> None:
        plane.create(objects.node(name, owner[name], cpu=str(pods_per_node), pods=pods_per_node + 10))

    def make_pod(args: tuple[str, int]) -> None:
        node, i = args
        pod = objects.pod(
            f"{node}-v{i}", NAMESPACE, owner[node], cpu="1", priority_class="bench-low", node=node
        )
        created = plane.create(pod)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"phase": "Running", "startTime": now,
                  "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now},
                                 {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}]}  # fmt: skip
        plane.patch(created, {"status": status}, subresource="status")

    started = time.monotonic()
    with ThreadPoolExecutor(FILL_THREADS) as pool:
        list(pool.map(make_node, owner))
        list(pool.map(make_pod, [(n, i) for n in owner for i in range(pods_per_node)]))
    print(f"filled {nodes} nodes, {nodes * pods_per_node} pods in {time.monotonic() - started:.0f}s",
          file=sys.stderr)  # fmt: skip
    return owner


def stream(plane: ControlPlane, count: int, victims: int, interval: float) -> dict[str, tuple[str, float]]:
    """`count` preemptors per profile, alternating; name -> (profile, created at)."""
    made: dict[str, tuple[str, float]] = {}
    for i in range(count):
        for profile, scheduler in PROFILES.items():
            name = f"{profile}-p{i:03d}"
            pod = objects.pod(name, NAMESPACE, profile, cpu=str(victims), priority_class="bench-high",
                              scheduler=scheduler, labels={ROLE: "preemptor"})  # fmt: skip
            made[name] = (profile, time.time())
            plane.create(pod)
            time.sleep(interval / 2)
    return made


def preempted(plane: ControlPlane) -> list[tuple[str, str, str]]:
    """(victim, preemptor uid, node) of every Preempted Event, whoever wrote it."""
    out = []
    events = plane.get(f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events")["items"]
    for e in events:
        if e.get("reason") != "Preempted":
            continue
        note = e.get("note") or ""  # "Preempted by pod <uid> on node <node>"
        words = note.split()
        if len(words) >= 7 and words[:3] == ["Preempted", "by", "pod"]:
            out.append((e["regarding"]["name"], words[3], words[6]))
    return sorted(set(out))


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU a process has used so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def processes(plane: ControlPlane, loop: Stack, tansu: embedded.EmbeddedBroker) -> dict[str, int | None]:
    """Every process of the run, by name: the control plane, the broker, preemptctl's components."""
    found: dict[str, int | None] = {
        os.path.basename(str(p.args[0])).split("-v")[0]: p.pid for p in plane.cluster._processes
    }
    found["kube-scheduler"] = plane.scheduler._process.pid if plane.scheduler and plane.scheduler._process else None
    found["kwok"] = plane._kwok.pid if plane._kwok else None
    found["tansu"] = tansu.pid
    found |= {f"preemptctl {name}": p.pid for name, p in loop.processes.items()}
    return found


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(
    made: dict[str, tuple[str, float]], watch: Watch, events: list[tuple[str, str, str]]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_uid = {watch.uids.get(n): n for n in made}
    for profile in PROFILES:
        names = [n for n, (p, _) in made.items() if p == profile]
        binds = [watch.bound[n][0] - made[n][1] for n in names if n in watch.bound]
        mine = [(v, uid, node) for v, uid, node in events if by_uid.get(uid) in names]
        wasted = [v for v, uid, node in mine if watch.bound.get(by_uid[uid], (0, None))[1] != node]
        out[profile] = {
            "preemptors": len(names),
            "bound": len(binds),
            "neverBound": len(names) - len(binds),
            "timeToBindP50": percentile(binds, 0.5),
            "timeToBindP99": percentile(binds, 0.99),
            "timeToBindMax": max(binds, default=None),
            "evictionsPerPreemptor": len(mine) / len(names) if names else None,
            "wastedEvictions": len(wasted),
        }
    return out


async def _read_records(bootstrap: str, topic: str) -> list[tuple[float, Any]]:
    """Every record of `topic` with the time Kafka has for it (the producer's create time)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            await consumer.topics()
            partitions = [
                TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        out = []
        deadline = time.monotonic() + 60
        while [
            tp for tp in partitions if await consumer.position(tp) < ends[tp]
        ] and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out += [(m.timestamp / 1000.0, orjson.loads(m.value)) for m in messages]
        return out
    finally:
        await consumer.stop()


def _requests(plane: ControlPlane) -> dict[str, list[dict[str, Any]]]:
    """The audit log's pod requests in the bench namespace, by pod name, in the order received:
    who (kube-scheduler, preemptctl's actuator, the bench), what, when received and answered."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in plane.cluster.audit():
        ref = e.get("objectRef") or {}
        if ref.get("namespace") != NAMESPACE or ref.get("resource") != "pods" or not ref.get("name"):
            continue
        agent = e.get("userAgent") or ""
        who = ("kube-scheduler" if agent.startswith("kube-scheduler")
               else "actuator" if "actuator" in (e.get("user") or {}).get("username", "")
               else "kwok" if agent.startswith("kwok") else "other")  # fmt: skip
        out.setdefault(ref["name"], []).append({
            "who": who, "verb": e["verb"], "sub": ref.get("subresource") or "",
            "code": (e.get("responseStatus") or {}).get("code"),
            "received": _ts(e["requestReceivedTimestamp"]), "done": _ts(e["stageTimestamp"]),
        })  # fmt: skip
    for calls in out.values():
        calls.sort(key=lambda c: c["received"])
    return out


def _first(calls: list[dict[str, Any]], who: str, verb: str, sub: str = "") -> dict[str, Any] | None:
    return next((c for c in calls if (c["who"], c["verb"], c["sub"]) == (who, verb, sub)), None)


# The critical path's marks per decider (the nomination goes beside the victims' marks, and the
# outcomes are written after the deletes: both are shown in each example's marks, not chained).
CHAINS = {
    "preemptctl": [
        "created",
        "unschedulable",
        "cluster-events record",
        "decision record",
        "actuator's first request",
        "first victim write",
        "last victim deleted",
        "bound",
    ],
    "default": ["created", "first victim write", "last victim deleted", "bound"],
}


def timeline(
    loop: Stack, made: dict[str, tuple[str, float]], watch: Watch, events: list[tuple[str, str, str]]
) -> dict[str, Any]:
    """Where each preemptor's time goes, per profile: the median of each stage in seconds, and the
    whole timeline (ms from creation, every API request on it and its victims) of the preemptor
    with the median time-to-bind. Times are the API server's (audit log: received, answered)
    and Kafka's (each record's create time); one machine, one clock."""
    calls = _requests(loop.plane)
    batches = asyncio.run(_read_records(loop.bootstrap, records.CLUSTER_EVENTS))
    decisions = asyncio.run(_read_records(loop.bootstrap, records.DECISIONS))
    evictions = asyncio.run(_read_records(loop.bootstrap, records.EVICTIONS))
    seen: dict[str, float] = {}  # preemptor uid -> its first Unschedulable event's record time
    for appended, batch in batches:
        for e in batch.get("events", []):
            obj = e.get("object") or {}
            conds = (obj.get("status") or {}).get("conditions") or []
            uid = (obj.get("metadata") or {}).get("uid")
            if uid and uid not in seen and any(c.get("reason") == "Unschedulable" for c in conds):
                seen[uid] = appended
    decided: dict[str, tuple[float, dict[str, Any]]] = {}
    for appended, d in decisions:
        if d["outcome"] == "preempt":
            decided.setdefault(d["preemptorUid"], (appended, d))
    outcome_at: dict[str, float] = {}
    for appended, o in evictions:
        outcome_at[o["decisionId"]] = max(outcome_at.get(o["decisionId"], 0.0), appended)
    victims_of: dict[str, list[str]] = {}  # preemptor uid -> victim names, by the Preempted Events
    for victim, uid, _node in events:
        victims_of.setdefault(uid, []).append(victim)

    out: dict[str, Any] = {}
    for profile in PROFILES:
        rows = []
        for name, (p, _) in made.items():
            uid = watch.uids.get(name, "")
            mine = calls.get(name, [])
            created, bound = (
                _first(mine, "other", "create"),
                _first(mine, "kube-scheduler", "create", "binding"),
            )
            if p != profile or created is None or bound is None:
                continue
            marks = {"created": created["received"],
                     "unschedulable": (_first(mine, "kube-scheduler", "patch", "status") or {}).get("done")}  # fmt: skip
            decider = "actuator" if profile == "preemptctl" else "kube-scheduler"
            names = victims_of.get(uid, [])
            if profile == "preemptctl" and uid in decided:
                marks["cluster-events record"] = seen.get(uid)
                marks["decision record"], decision = decided[uid]
                names = [v["name"] for v in decision["victims"]]
                marks["nominated"] = (_first(mine, "actuator", "patch", "status") or {}).get("done")
                marks["outcomes written"] = outcome_at.get(decision["id"])
            acting = [
                c for v in names for c in calls.get(v, []) if c["who"] == decider and c["verb"] != "get"
            ]
            reads = [c for v in names for c in calls.get(v, []) if c["who"] == decider and c["verb"] == "get"]
            if profile == "preemptctl":
                first = [
                    c["received"] for c in (*acting, *reads, *[c for c in mine if c["who"] == "actuator"])
                ]
                marks["actuator's first request"] = min(first, default=None)
            marks["first victim write"] = min((c["received"] for c in acting), default=None)
            marks["last victim deleted"] = max(
                (c["done"] for c in acting if c["verb"] == "delete"), default=None
            )
            marks["bound"] = bound["done"]
            rows.append((bound["done"] - created["received"], name, marks, sorted(
                [(c["received"], c["done"], n, c["who"], c["verb"], c["sub"], c["code"])
                 for n in (name, *names) for c in calls.get(n, []) if c["who"] in (decider, "kube-scheduler")])))  # fmt: skip
        if not rows:
            continue
        rows.sort(key=lambda r: r[0])
        order = CHAINS[profile]  # the marks on the critical path, in the order a preemptor passes them
        stages: dict[str, float | None] = {}
        for before, after in zip(order, order[1:], strict=False):
            gaps = [m[after] - m[before] for _, _, m, _ in rows if m.get(before) and m.get(after)]
            stages[f"{before} -> {after}"] = round(statistics.median(gaps), 4) if gaps else None
        totals = [m["bound"] - m["created"] for _, _, m, _ in rows]
        stages["created -> bound"] = round(statistics.median(totals), 4)
        _, name, marks, requests = rows[len(rows) // 2]
        t0 = marks["created"]
        out[profile] = {
            "stagesMedianSeconds": stages,
            "example": {
                "preemptor": name,
                "marksMs": {k: round((v - t0) * 1000, 1) for k, v in marks.items() if v},
                "requests": [
                    f"{(r - t0) * 1000:7.1f} .. {(d - t0) * 1000:7.1f} ms  {who:14} {verb:6} {n}"
                    f"{'/' + sub if sub else ''} -> {code}"
                    for r, d, n, who, verb, sub, code in requests
                ],  # fmt: skip
            },
        }
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--pods-per-node", type=int, default=10)
    parser.add_argument("--preemptors", type=int, default=10, help="per profile")
    parser.add_argument("--victims", type=int, default=4, help="victims each preemptor needs")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between preemptors of one profile"
    )
    parser.add_argument("--output", choices=("json", "text"), default="text")
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()
    with ControlPlane() as plane, embedded.EmbeddedBroker() as tansu:
        plane.cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        fill(plane, args.nodes, args.pods_per_node)
        watch = Watch(plane)
        watch.start()
        with stack(plane, tansu.bootstrap, "bench", NAMESPACE) as loop:
            # Ready means the actuator has read its outcomes back; its consumer group joins after
            # (tansu takes about half a session timeout): stream only once it has its partitions.
            wait_for(lambda: "newly assigned partitions" in loop.log("actuator"), "actuator in its group", 60)
            print("preemptctl ready; streaming preemptors", file=sys.stderr)
            load_streaming = os.getloadavg()
            pids = processes(plane, loop, tansu)
            cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
            made = stream(plane, args.preemptors, args.victims, args.interval)
            try:
                wait_for(
                    lambda: len(watch.bound) >= len(made),
                    "every preemptor bound",
                    BIND_TIMEOUT_S,
                    every_s=0.5,
                )
            except AssertionError as exc:
                print(f"warning: {exc}", file=sys.stderr)
            time.sleep(2.0)  # late evictions show up in the Events
            cpu_used = {
                name: round(after - before, 2)
                for name, pid in pids.items()
                if (before := cpu_before[name]) is not None and (after := _cpu_seconds(pid)) is not None
            }
            events = preempted(plane)
            result = {
                "nodes": args.nodes,
                "podsPerNode": args.pods_per_node,
                "victimsPerPreemptor": args.victims,
                # 1-minute load averages: at start, when streaming began, at the end (a shared machine)
                "loadAverage1m": [round(x[0], 1) for x in (load_at_start, load_streaming, os.getloadavg())],
                "profiles": report(made, watch, events),
                # CPU seconds each process used from the first preemptor to the end (both deciders)
                "cpuSecondsWhileStreaming": cpu_used,
                "timeline": timeline(loop, made, watch, events),
            }
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.nodes} kwok nodes, {args.nodes * args.pods_per_node} pods, {args.victims} victims per preemptor,"
              f" load average (1 min) {result['loadAverage1m']}")  # fmt: skip
        for profile, r in result["profiles"].items():
            print(f"  {profile:10} bound {r['bound']}/{r['preemptors']}  time-to-bind p50 {r['timeToBindP50']}"
                  f" p99 {r['timeToBindP99']}  evictions/preemptor {r['evictionsPerPreemptor']}"
                  f"  wasted {r['wastedEvictions']}")  # fmt: skip
        print(f"  CPU seconds while streaming: {result['cpuSecondsWhileStreaming']}")
        for profile, t in result["timeline"].items():
            print(f"  {profile}: stages, median s")
            for stage, seconds in t["stagesMedianSeconds"].items():
                print(f"    {stage:55} {seconds}")
            print(f"  {profile}: the median preemptor, {t['example']['preemptor']} (ms from creation)")
            for mark, ms in t["example"]["marksMs"].items():
                print(f"    {ms:8.1f}  {mark}")
            print("\n".join(f"    {line}" for line in t["example"]["requests"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
