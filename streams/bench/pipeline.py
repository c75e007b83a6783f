"""`preemptctl bench pipeline`: the worker's fold rate and end-to-end latency, against the broker's own speed.

In one run, on one broker (the embedded tansu by default, or `--broker`):
1. raw aiokafka produce and consume rates of 1 KiB records (the broker's speed);
2. fold rate: a PreemptionBasic-shaped log (objects plus the decisions' reactions)
   is written in records of `--events-per-record` events; a worker process then
   folds it from a cold start; its Prometheus counter gives events/s between the
   first and the last record processed;
3. end-to-end latency: the same kind of log offered at a fixed `--rate` events/s,
   one event per record; for each event that leads to a decision, the time from
   producing it to consuming the decision.
The result is one JSON object; the pipeline is reported as ratios of the raw rates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from engine.config import Config
from schemas import VERSION, records
from streams.bench import machine
from streams.brokers import embedded, process
from streams.kafka import topics
from streams.sim import simulator, traces

RAW_MESSAGES = 50_000
RAW_VALUE = b"x" * 1024
# Worker start-up (group join, store open) is excluded: the rate is measured from
# the first to the last record the worker's own counter reports.
METRICS_POLL_S = 0.05
FOLD_TIMEOUT_S = 300.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def raw_rates(bootstrap: str, topic: str) -> tuple[float, float]:
    await topics.ensure_topics(bootstrap, [topics.TopicSpec(topic)])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=256 * 1024)
    await producer.start()
    started = time.perf_counter()
    futures = [await producer.send(topic, RAW_VALUE) for _ in range(RAW_MESSAGES)]
    await asyncio.gather(*futures)
    produce = RAW_MESSAGES / (time.perf_counter() - started)
    await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await consumer.start()
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


def _worker(url: str, store: Path, group: str, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "streams.cli",
        "worker",
        "--broker",
        url,
        "--store-dir",
        str(store),
        "--group",
        group,
        "--health-port",
        str(port),
        "--health-host",
        "127.0.0.1",
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=(store.parent / "worker.log").open("wb"))


async def _produce_log(bootstrap: str, cluster: str, log: list[dict[str, Any]], per_record: int) -> int:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1024 * 1024, max_request_size=2 * 1024 * 1024
    )
    await producer.start()
    n = 0
    for i in range(0, len(log), per_record):
        events = [{k: v for k, v in e.items() if k != "cluster"} for e in log[i : i + per_record]]
        await producer.send(
            records.CLUSTER_EVENTS,
            key=cluster.encode(),
            value=orjson.dumps({"v": VERSION, "cluster": cluster, "events": events}),
        )
        n += 1
    await producer.flush()
    await producer.stop()
    return n


def fold_rate(
    url: str, bootstrap: str, log: list[dict[str, Any]], per_record: int, tmp: Path, *, already: int = 0
) -> dict[str, Any]:
    """`already`: events other stages left in the topic, folded too (a new group reads from the start)."""
    cluster = f"bench-{uuid.uuid4().hex[:6]}"
    asyncio.run(_produce_log(bootstrap, cluster, log, per_record))
    port = process.free_loopback_port()
    proc = _worker(url, tmp / "fold-store", f"bench-fold-{cluster}", port)
    try:
        deadline = time.monotonic() + FOLD_TIMEOUT_S
        first_t = first_n = last_t = last_n = 0.0
        target = len(log) + already
        while time.monotonic() < deadline:
            try:
                n = _metric(port, "preemptctl_worker_events_total")
            except OSError:
                n = 0.0
            now = time.perf_counter()
            if n > 0 and not first_t:
                first_t, first_n = now, n
            if n > last_n:
                last_t, last_n = now, n
            if n >= target:
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


async def _latency(
    bootstrap: str, cluster: str, log: list[dict[str, Any]], triggers: dict[int, str], rate: float
) -> list[float]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    # A short fetch wait: tansu holds a fetch for the whole wait, which would be measured as latency.
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
    await producer.start()
    await consumer.start()
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
            value=orjson.dumps({"v": VERSION, "cluster": cluster, "events": [body]}),
        )
        if i in triggers:
            await fut
            sent[triggers[i]] = time.perf_counter()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(collector, timeout=30)
    await producer.stop()
    await consumer.stop()
    return [(received[k] - sent[k]) * 1000 for k in sent if k in received]


def latency(url: str, bootstrap: str, nodes: int, rate: float, tmp: Path) -> dict[str, Any]:
    cluster = f"lat-{uuid.uuid4().hex[:6]}"
    expected = simulator.simulate([dict(e, cluster=cluster) for e in traces.basic(nodes)], Config())
    # Which event (by its position in the log) leads to which decision.
    triggers = {d["seq"]: d["id"] for d in expected.decisions}
    port = process.free_loopback_port()
    proc = _worker(url, tmp / "lat-store", f"bench-lat-{cluster}", port)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the worker is in its group, ready
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1).status == 200:
                    break
            time.sleep(0.2)
        lat = asyncio.run(_latency(bootstrap, cluster, expected.log, triggers, rate))
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
        if args.broker:
            url = args.broker
            name = "kafka (given)"
        else:
            url = stack.enter_context(embedded.EmbeddedBroker()).url
            name = "tansu (embedded)"
        bootstrap = topics.parse_broker_url(url)
        asyncio.run(topics.ensure_topics(bootstrap))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="preemptctl-bench-")))
        raw_topic = f"bench-raw-{uuid.uuid4().hex[:6]}"
        produce, consume = asyncio.run(raw_rates(bootstrap, raw_topic))
        # Latency first, on an empty cluster-events topic: a worker of a new group reads
        # the topic from its start, and a backlog would be measured as latency.
        lat = latency(url, bootstrap, args.latency_nodes, args.rate, tmp)
        log = simulator.simulate(traces.basic(args.nodes), Config()).log
        fold = fold_rate(url, bootstrap, log, args.events_per_record, tmp, already=lat.pop("events_offered"))
    result = {
        "benchmark": "pipeline",
        "broker": name,
        "raw_produce_msgs_per_s": round(produce, 1),
        "raw_consume_msgs_per_s": round(consume, 1),
        **fold,
        "fold_vs_raw_produce": round(fold["fold_events_per_s"] / produce, 3),
        **lat,
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
        "  preemptctl bench pipeline --broker kafka://127.0.0.1:9092 --output json",
    )
    p.add_argument("--broker", help="kafka://host:port (default: the embedded tansu)")
    p.add_argument(
        "--nodes", type=int, default=2000, help="PreemptionBasic nodes in the fold log (default 2000)"
    )
    p.add_argument("--events-per-record", type=int, default=100)
    p.add_argument("--rate", type=float, default=1000.0, help="offered events/s for the latency run")
    p.add_argument("--latency-nodes", type=int, default=100, help="nodes in the latency log (default 100)")
    p.add_argument("--output", choices=("json", "text"), default="text")
    p.set_defaults(func=cmd)
