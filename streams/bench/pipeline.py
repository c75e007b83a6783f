"""`preemptctl bench pipeline`: the worker's fold rate and end-to-end latency, against the broker's own speed.

In one run, on one broker (the embedded tansu by default, or the one
`--bootstrap-server`/`--kafka-config` name, TLS and SASL included):
1. raw aiokafka produce and consume rates of 1 KiB records (the broker's speed);
2. fold rate: a PreemptionBasic-shaped log (objects plus the decisions' reactions)
   is written in records of `--events-per-record` events; a worker process then
   folds it from a cold start; its Prometheus counter gives events/s between the
   first and the last record processed;
3. end-to-end latency: the same kind of log offered at a fixed `--rate` events/s,
   one event per record; for each event that leads to a decision, the time from
   producing it to consuming the decision;
4. recovery from a snapshot (`--recovery-pods`, 0 to skip): a worker with no
   local store opens a partition whose latest snapshot holds a cluster of that
   many pods (4 per node) whose state reflects `--recovery-history` events, and
   folds the `--recovery-suffix` events written after it. The history before
   the snapshot is represented by the snapshot's sequence number: the log holds
   only the record at the snapshot's position and the suffix, since opening a
   partition never reads before its snapshot (tests/chaos deletes that part of
   the log to show it). Measured in-process (no group join): snapshot found,
   fetched, checked and loaded into the store, state restored, suffix folded.
With `--compare-tree DIR` (another checkout, e.g. the base branch), the fold
rate is measured alternately for this tree and that one, each on a fresh
embedded broker, and reported side by side.
5. projection (`--projection-runs`, 0 to skip): the fold log's objects dressed
   as a real API server holds them (streams.sim.apiserver: env, command lines,
   volumes, probes, last-applied-configuration, container statuses; node
   images), folded as the source used to write them (whole, no header: the
   worker projects them itself) and as it writes them now (projected, with the
   engine.projection header), alternately, each on a fresh embedded broker:
   the fold rate of each, side by side, and the mean event size of each.
The fold log (2.) is written as the source writes it: projected, with the header.
The result is one JSON object; the pipeline is reported as ratios of the raw rates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import TopicPartition

from engine import cluster as cluster_mod
from engine import projection
from engine.config import Config
from fold.controller import Controller
from schemas import records
from streams.bench import machine
from streams.brokers import embedded, process
from streams.kafka import connection, topics
from streams.kafka.reading import PartitionReader
from streams.pipeline import outbox as outbox_mod
from streams.pipeline import recovery as recovery_mod
from streams.pipeline import snapshot
from streams.pipeline.checkpoint import fingerprint
from streams.pipeline.setup import Setup
from streams.pipeline.store import Store
from streams.sim import apiserver, simulator, traces, workloads

RAW_MESSAGES = 50_000
RAW_VALUE = b"x" * 1024
# Worker start-up (group join, store open) is excluded: the rate is measured from
# the first to the last record the worker's own counter reports.
METRICS_POLL_S = 0.05
FOLD_TIMEOUT_S = 300.0
# A worker that folded the whole log and has not moved for this long is done.
FOLD_IDLE_S = 2.0
# Recovery: the suffix is written in records of this many events.
RECOVERY_EVENTS_PER_RECORD = 100


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def raw_rates(kafka: connection.KafkaConfig, topic: str) -> tuple[float, float]:
    await topics.ensure_topics(kafka, [topics.TopicSpec(topic)])
    producer = kafka.producer(linger_ms=5, max_batch_size=256 * 1024)
    await connection.start(kafka, producer)
    started = time.perf_counter()
    futures = [await producer.send(topic, RAW_VALUE) for _ in range(RAW_MESSAGES)]
    await asyncio.gather(*futures)
    produce = RAW_MESSAGES / (time.perf_counter() - started)
    await producer.stop()
    consumer = kafka.consumer(
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await connection.start(kafka, consumer)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    got = 0
    started = time.perf_counter()
    while got < RAW_MESSAGES:
        batch = await consumer.getmany(tp, timeout_ms=1000, max_records=10_000)
        got += sum(len(v) for v in batch.values())
    consume = got / (time.perf_counter() - started)
    await consumer.stop()
    return produce, consume


def _metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    m = re.search(rf"^{name} ([0-9.e+]+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


def _worker(
    kafka_args: list[str], store: Path, group: str, port: int, tree: Path | None = None, *extra: str
) -> subprocess.Popen[bytes]:
    """A worker process of this tree, or of another checkout's (`tree`) with the same interpreter."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    cmd = [
        sys.executable,
        "-m",
        "streams.cli",
        "worker",
        *kafka_args,
        "--store-dir",
        str(store),
        "--group-id",
        group,
        "--health-port",
        str(port),
        "--health-host",
        "127.0.0.1",
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=(store.parent / "worker.log").open("wb"),
        env=env,
        cwd=tree,
    )


async def _produce_log(
    kafka: connection.KafkaConfig,
    cluster: str,
    log: list[dict[str, Any]],
    per_record: int,
    topic: str = records.CLUSTER_EVENTS,
    *,
    projected: bool = True,
) -> int:
    """Write the log in records of `per_record` events to `topic`; the last record's offset.

    `projected`: as the source writes it, each object projected (engine.projection) and every
    record declaring so in its header, which spares the worker projecting it again; without,
    as an older source or another writer would (whole objects, no header: the worker projects).
    """
    producer = kafka.producer(
        linger_ms=5,
        max_batch_size=1024 * 1024,
        max_request_size=records.RECORD_MAX_BYTES,
    )
    await connection.start(kafka, producer)
    futures = []
    headers = [(projection.HEADER, projection.HEADER_VALUE)] if projected else None
    for i in range(0, len(log), per_record):
        events = [
            {
                k: projection.project(v) if projected and k == "object" and isinstance(v, dict) else v
                for k, v in e.items()
                if k != "cluster"
            }
            for e in log[i : i + per_record]
        ]
        futures.append(
            await producer.send(
                topic,
                key=cluster.encode(),
                value=records.encode_batch(cluster, events),
                headers=headers,
            )
        )
    last = (await futures[-1]).offset
    await producer.stop()
    return int(last)


def _metric_labelled(port: int, name: str) -> float:
    """The largest value of a labelled series (the worker's position over its partitions)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    values = [float(v) for v in re.findall(rf"^{name}{{[^}}]*}} ([0-9.e+-]+)$", body, re.M)]
    return max(values, default=-1.0)


def fold_rate(
    kafka_args: list[str],
    kafka: connection.KafkaConfig,
    log: list[dict[str, Any]],
    per_record: int,
    tmp: Path,
    *,
    tree: Path | None = None,
    own_topics: bool = True,
    projected: bool = True,
) -> dict[str, Any]:
    """A cold worker folds the log; events/s from its own counter, first to last record it processed.

    With `own_topics` the log goes to topics of its own (see below); without, to the default
    ones, which must then be empty (a fresh broker), for a tree that may predate --topic-prefix.

    It is done when its store reflects the log's last record (the position gauge),
    whatever else it folded first (a worker without state reads from its snapshot or
    the log start), or, for a worker that stores only when a later record arrives
    (before the commit timer), when it has folded the whole log and stopped.
    """
    cluster = f"bench-{uuid.uuid4().hex[:6]}"
    # Topics of its own: a worker without state folds its cluster-events from the start, and
    # on a shared topic that start holds the latency run's 1,500 one-event records (slow per
    # event), which the fold rate then counted as its own.
    names = topics.Names(f"{cluster}.") if own_topics else topics.DEFAULT_NAMES
    asyncio.run(topics.ensure_topics(kafka, topics.Layout(names=names).specs()))
    last_offset = asyncio.run(
        _produce_log(kafka, cluster, log, per_record, names.cluster_events, projected=projected)
    )
    port = process.free_loopback_port()
    store = Path(tempfile.mkdtemp(prefix="fold-", dir=tmp)) / "store"
    prefix = ("--topic-prefix", names.prefix) if own_topics else ()
    proc = _worker(kafka_args, store, f"bench-fold-{cluster}", port, tree, *prefix)
    try:
        deadline = time.monotonic() + FOLD_TIMEOUT_S
        first_t = first_n = last_t = last_n = 0.0
        while time.monotonic() < deadline:
            try:
                n = _metric(port, "preemptctl_worker_events_total")
                position = _metric_labelled(port, "preemptctl_worker_position")
            except OSError:
                n, position = 0.0, -1.0
            now = time.perf_counter()
            if n > 0 and not first_t:
                first_t, first_n = now, n
            if n > last_n:
                last_t, last_n = now, n
            if position >= last_offset or (n >= len(log) and last_t and now - last_t > FOLD_IDLE_S):
                break
            time.sleep(METRICS_POLL_S)
        rate = (last_n - first_n) / (last_t - first_t) if last_t > first_t else float("nan")
        seconds = _metric(port, "preemptctl_worker_record_seconds_sum")
        count = _metric(port, "preemptctl_worker_record_seconds_count")
    finally:
        proc.terminate()
        proc.wait(20)
    return {
        "events": int(last_n),
        "events_per_record": per_record,
        "fold_events_per_s": round(rate, 1),
        "worker_busy_events_per_s": round(last_n / seconds, 1) if seconds else None,
        "record_mean_ms": round(seconds / count * 1000, 3) if count else None,
    }


def fold_projection_side_by_side(
    log: list[dict[str, Any]], per_record: int, tmp: Path, runs: int
) -> dict[str, Any]:
    """The fold rate of whole objects against their projections, alternately on fresh embedded brokers."""
    whole = apiserver.dress_log(log)
    projected = [
        {**e, "object": projection.project(e["object"])} if isinstance(e.get("object"), dict) else e
        for e in whole
    ]
    rates: dict[str, list[float]] = {"whole": [], "projected": []}
    for _ in range(runs):
        for label, events in (("whole", whole), ("projected", projected)):
            with embedded.EmbeddedBroker() as broker:
                kafka = connection.KafkaConfig(bootstrap=broker.bootstrap)
                asyncio.run(topics.ensure_topics(kafka))
                # Whole: as an older source wrote them (no header; the worker projects them).
                rates[label].append(
                    fold_rate(
                        ["--broker", broker.url],
                        kafka,
                        events,
                        per_record,
                        tmp,
                        projected=label == "projected",
                    )["fold_events_per_s"]
                )

    def mean_bytes(events: list[dict[str, Any]]) -> int:
        return round(sum(len(orjson.dumps(e)) for e in events) / max(1, len(events)))

    return {
        "projection_fold_whole_events_per_s": rates["whole"],
        "projection_fold_projected_events_per_s": rates["projected"],
        "projection_fold_projected_vs_whole_median": round(
            statistics.median(rates["projected"]) / statistics.median(rates["whole"]), 3
        ),
        "projection_event_bytes_whole_mean": mean_bytes(whole),
        "projection_event_bytes_projected_mean": mean_bytes(projected),
    }


def fold_side_by_side(
    log: list[dict[str, Any]], per_record: int, tmp: Path, other: Path, runs: int
) -> dict[str, Any]:
    """The fold rate of this tree and of `other`, alternately, each on a fresh embedded broker."""
    rates: dict[str, list[float]] = {"after": [], "before": []}
    for _ in range(runs):
        for label, tree in (("after", None), ("before", other)):
            with embedded.EmbeddedBroker() as broker:
                kafka = connection.KafkaConfig(bootstrap=broker.bootstrap)
                asyncio.run(topics.ensure_topics(kafka))
                rates[label].append(
                    fold_rate(
                        ["--broker", broker.url], kafka, log, per_record, tmp, tree=tree, own_topics=False
                    )["fold_events_per_s"]
                )
    after, before = statistics.median(rates["after"]), statistics.median(rates["before"])
    return {
        "compare_tree": str(other),
        "fold_after_events_per_s": rates["after"],
        "fold_before_events_per_s": rates["before"],
        "fold_after_vs_before_median": round(after / before, 3),
    }


# ---- recovery from a snapshot -------------------------------------------------------------


async def _write_snapshot(
    kafka: connection.KafkaConfig, cluster: str, pods: int, history: int, tmp: Path
) -> dict[str, Any]:
    """A snapshot of a `pods`-pod cluster whose state reflects `history` events, at a real log position."""
    objects = workloads.cluster_objects(pods // 4)
    # The record at the snapshot's position: its fingerprint ties the snapshot to this log.
    anchor_key = cluster.encode()
    anchor = records.encode_batch(cluster, [{"ts": workloads.EPOCH, "type": "TICK"}])
    producer = outbox_mod.new_producer(kafka)
    await connection.start(kafka, producer)
    try:
        position = (await producer.send_and_wait(records.CLUSTER_EVENTS, anchor, key=anchor_key)).offset
        async with PartitionReader(kafka) as reader:
            decisions_next = (await reader.bounds(records.DECISIONS, 0))[1]
        ctl = Controller(cluster, Config())
        ctl.seq = history
        store = Store(tmp / "snapshot-source")
        dirty = {f"{o['kind']}/{cluster_mod.table_key(o)}": o for o in objects}
        state = {
            "position": position,
            "fingerprint": fingerprint(anchor_key, anchor),
            "decisionsNext": decisions_next,
            "sinceSnapshot": 0,
            "clusters": {cluster: ctl.state()},
        }
        store.write({cluster: dirty}, state)
        started = time.perf_counter()
        outbox = outbox_mod.KafkaOutbox(producer, transactional=False, owns_producer=False)
        manifest = await snapshot.write(
            outbox, partition=0, state=state, entries=store.entries(), previous=None
        )
        written = time.perf_counter() - started
        store.close()
    finally:
        await producer.stop()
    return {"position": position, "chunks": len(manifest.chunks), "snapshot_write_s": round(written, 2)}


def _suffix(cluster: str, pods: int, events: int) -> list[dict[str, Any]]:
    """Status updates of the cluster's pods (new resourceVersions) and ticks: the log after the snapshot."""
    out: list[dict[str, Any]] = []
    nodes = pods // 4
    for k in range(events):
        if k % 50 == 49:
            out.append({"ts": workloads.EPOCH, "type": "TICK", "cluster": cluster})
            continue
        i, j = (k // 4) % nodes, k % 4
        obj = workloads.pod(
            f"low-{i:05d}-{j}",
            priority=workloads.LOW_PRIORITY,
            cpu="900m",
            memory="500Mi",
            node=f"node-{i:05d}",
        )
        obj["metadata"]["resourceVersion"] = str(2 + k)
        out.append({"ts": workloads.EPOCH, "type": "MODIFIED", "object": obj, "cluster": cluster})
    return out


def recovery(
    kafka: connection.KafkaConfig, pods: int, history: int, suffix: int, tmp: Path
) -> dict[str, Any]:
    cluster = f"rec-{uuid.uuid4().hex[:6]}"
    written = asyncio.run(_write_snapshot(kafka, cluster, pods, history, tmp))
    asyncio.run(_produce_log(kafka, cluster, _suffix(cluster, pods, suffix), RECOVERY_EVENTS_PER_RECORD))

    async def recover() -> dict[str, Any]:
        async def new_outbox(partition: int) -> outbox_mod.Outbox:
            producer = outbox_mod.new_producer(kafka)
            await connection.start(kafka, producer)
            return outbox_mod.KafkaOutbox(producer, transactional=False, owns_producer=True)

        setup = Setup(
            config=Config(),
            key=None,
            store_dir=tmp / "recovered",
            reader=lambda: PartitionReader(kafka),
            outbox=new_outbox,
        )
        started = time.perf_counter()
        worker = await recovery_mod.open(partition=0, setup=setup)
        opened = time.perf_counter()
        loaded_at = worker.position
        await recovery_mod.catch_up(worker)
        done = time.perf_counter()
        ctl = worker.controllers[cluster]
        result = {
            "recovery_snapshot_position": loaded_at,
            "recovery_pods": len(ctl.cluster.pods),
            "recovery_history_events": history,
            "recovery_suffix_events": worker.events,
            "recovery_open_s": round(opened - started, 2),
            "recovery_suffix_s": round(done - opened, 2),
            "recovery_s": round(done - started, 2),
        }
        await worker.close(commit=False)
        assert ctl.seq == history + suffix, "the recovered state is not the snapshot plus the suffix"
        return result

    return {**{f"recovery_{k}": v for k, v in written.items() if k != "position"}, **asyncio.run(recover())}


async def _latency(
    kafka: connection.KafkaConfig,
    cluster: str,
    log: list[dict[str, Any]],
    triggers: dict[int, str],
    rate: float,
) -> list[float]:
    producer = kafka.producer(linger_ms=0)
    # A short fetch wait: tansu holds a fetch for the whole wait, which would be measured as latency.
    consumer = kafka.consumer(enable_auto_commit=False, fetch_max_wait_ms=10)
    await connection.start(kafka, producer)
    await connection.start(kafka, consumer)
    tp = TopicPartition(records.DECISIONS, 0)
    consumer.assign([tp])
    await consumer.seek_to_end(tp)
    sent: dict[str, float] = {}
    received: dict[str, float] = {}

    async def collect() -> None:
        while len(received) < len(triggers):
            batch = await consumer.getmany(tp, timeout_ms=100)
            now = time.perf_counter()
            for msgs in batch.values():
                for m in msgs:
                    d = orjson.loads(m.value or b"{}")
                    if d.get("cluster") == cluster:
                        received.setdefault(d["id"], now)

    collector = asyncio.create_task(collect())
    started = time.perf_counter()
    for i, e in enumerate(log):
        due = started + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body = {k: v for k, v in e.items() if k != "cluster"}
        fut = await producer.send(
            records.CLUSTER_EVENTS,
            key=cluster.encode(),
            value=records.encode_batch(cluster, [body]),
        )
        if i in triggers:
            await fut
            sent[triggers[i]] = time.perf_counter()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(collector, timeout=30)
    await producer.stop()
    await consumer.stop()
    return [(received[k] - sent[k]) * 1000 for k in sent if k in received]


def latency(
    kafka_args: list[str], kafka: connection.KafkaConfig, nodes: int, rate: float, tmp: Path
) -> dict[str, Any]:
    cluster = f"lat-{uuid.uuid4().hex[:6]}"
    expected = simulator.simulate([dict(e, cluster=cluster) for e in traces.basic(nodes)], Config())
    # Which event (by its position in the log) leads to which decision.
    triggers = {d["seq"]: d["id"] for d in expected.decisions}
    port = process.free_loopback_port()
    proc = _worker(kafka_args, tmp / "lat-store", f"bench-lat-{cluster}", port)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the worker is in its group, ready
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1).status == 200:
                    break
            time.sleep(0.2)
        lat = asyncio.run(_latency(kafka, cluster, expected.log, triggers, rate))
    finally:
        proc.terminate()
        proc.wait(20)
    return {
        "events_offered": len(expected.log),
        "offered_events_per_s": rate,
        "decisions_measured": len(lat),
        "decisions_expected": len(triggers),
        "e2e_p50_ms": round(_percentile(lat, 0.5), 2),
        "e2e_p99_ms": round(_percentile(lat, 0.99), 2),
        "e2e_max_ms": round(max(lat), 2) if lat else None,
    }


def cmd(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        if connection.given(args):
            kafka = connection.from_args(args)
            name = f"kafka (given: {kafka.security_protocol})"
            kafka_args = ["--bootstrap-server", kafka.bootstrap]
            kafka_args += ["--kafka-config", args.kafka_config] if args.kafka_config else []
        else:
            broker = stack.enter_context(embedded.EmbeddedBroker())
            kafka = connection.KafkaConfig(bootstrap=broker.bootstrap)
            name = "tansu (embedded)"
            kafka_args = ["--bootstrap-server", broker.bootstrap]
        asyncio.run(topics.ensure_topics(kafka))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="preemptctl-bench-")))
        raw_topic = f"bench-raw-{uuid.uuid4().hex[:6]}"
        produce, consume = asyncio.run(raw_rates(kafka, raw_topic))
        # Latency first, on an empty cluster-events topic: a worker of a new group reads
        # the topic from its start, and a backlog would be measured as latency.
        lat = latency(kafka_args, kafka, args.latency_nodes, args.rate, tmp)
        lat.pop("events_offered")
        log = simulator.simulate(traces.basic(args.nodes), Config()).log
        fold = fold_rate(kafka_args, kafka, log, args.events_per_record, tmp)
        compared = (
            fold_side_by_side(log, args.events_per_record, tmp, Path(args.compare_tree), args.compare_runs)
            if args.compare_tree
            else {}
        )
        projected = (
            fold_projection_side_by_side(log, args.events_per_record, tmp, args.projection_runs)
            if args.projection_runs
            else {}
        )
        rec = (
            recovery(kafka, args.recovery_pods, args.recovery_history, args.recovery_suffix, tmp)
            if args.recovery_pods
            else {}
        )
    result = {
        "benchmark": "pipeline",
        "broker": name,
        "raw_produce_msgs_per_s": round(produce, 1),
        "raw_consume_msgs_per_s": round(consume, 1),
        **fold,
        "fold_vs_raw_produce": round(fold["fold_events_per_s"] / produce, 3),
        **compared,
        **projected,
        **lat,
        **rec,
        "machine": machine.describe(),
    }
    print(
        orjson.dumps(result).decode()
        if args.output == "json"
        else "\n".join(f"{k:>28}: {v}" for k, v in result.items())
    )
    return 0


def register(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = bench.add_parser(
        "pipeline",
        help="worker fold rate and end-to-end latency, with the broker's raw rates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  preemptctl bench pipeline --output json\n"
        "  preemptctl bench pipeline --bootstrap-server 127.0.0.1:9092 --output json\n"
        "  preemptctl bench pipeline --bootstrap-server 127.0.0.1:9093 --kafka-config client.properties",
    )
    connection.add_arguments(p, required=False)
    p.add_argument(
        "--nodes", type=int, default=2000, help="PreemptionBasic nodes in the fold log (default 2000)"
    )
    p.add_argument("--events-per-record", type=int, default=100)
    p.add_argument("--rate", type=float, default=1000.0, help="offered events/s for the latency run")
    p.add_argument("--latency-nodes", type=int, default=100, help="nodes in the latency log (default 100)")
    p.add_argument(
        "--recovery-pods",
        type=int,
        default=150_000,
        help="pods in the recovered snapshot (default 150000; 0 skips)",
    )
    p.add_argument(
        "--recovery-history",
        type=int,
        default=10_000_000,
        help="events the snapshot's state reflects (default 10000000)",
    )
    p.add_argument(
        "--recovery-suffix",
        type=int,
        default=50_000,
        help="events written after the snapshot (default 50000)",
    )
    p.add_argument("--compare-tree", metavar="DIR", help="another checkout: fold rates side by side with it")
    p.add_argument(
        "--compare-runs", type=int, default=2, help="runs per tree with --compare-tree (default 2)"
    )
    p.add_argument(
        "--projection-runs",
        type=int,
        default=2,
        help="fold runs each of whole objects and of their projections, alternately (default 2; 0 skips)",
    )
    p.add_argument("--output", choices=("json", "text"), default="text")
    p.set_defaults(func=cmd)
