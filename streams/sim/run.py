"""`preemptctl run`: the whole pipeline in one process tree, on a simulated cluster.

Starts the embedded broker (or uses `--broker`), creates the topics, starts a
worker process, and plays the simulated cluster: trace events and the
cluster's reactions are written to preemption.cluster-events in batches, and
whenever the log so far calls for decisions, the simulator waits for the
worker's decisions on preemption.decisions and reacts to those (evictions,
bindings), so the loop is closed through Kafka. A local controller predicts
which events lead to decisions (so the simulator knows when to wait) and checks
that the worker's records are byte-identical to the prediction. Decisions and
evictions are shown on stderr as they happen; the simulated actuator also
publishes eviction outcomes to preemption.evictions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from fold.controller import BadEvent
from fold.fleet import Fleet
from schemas import VERSION, cloudevent, records
from streams.brokers.embedded import EmbeddedBroker
from streams.common.errors import UsageError
from streams.common.options import load_config, load_key
from streams.kafka import connection, logio, topics
from streams.sim import traces
from streams.sim.simulator import Simulator

# Events per cluster-events record at most, and bytes per record at most (docs/topics.md).
MAX_BATCH_EVENTS = 500
MAX_BATCH_BYTES = 900 * 1024
# How long the simulator waits for a decision the log calls for before declaring the worker stuck.
DECISION_TIMEOUT_S = 60.0
# The worker must join its group and open its store within this long.
WORKER_START_TIMEOUT_S = 60.0
# Grace for the worker process to stop on SIGTERM before it is killed.
WORKER_STOP_TIMEOUT_S = 10.0


class Divergence(RuntimeError):
    """The worker's decisions differ from the deterministic prediction."""


def _line(d: Mapping[str, Any]) -> str:
    at = str(d["ts"])[11:19]
    head = f"{at} {d['outcome'].upper():<13} {d['preemptor']}"
    if d["outcome"] == "preempt":
        where = d.get("node") or ", ".join(
            f"{k}->{v}" for k, v in sorted((d.get("placements") or {}).items())
        )
        fresh = [v for v in d["victims"] if not v.get("terminating")]
        again = len(d["victims"]) - len(fresh)
        names = ", ".join(f"{v['action']} {v['namespace']}/{v['name']}" for v in fresh) or "no new evictions"
        tail = f" ({again} already leaving)" if again else ""
        return f"{head} -> {where}: {names}{tail}"
    return f"{head}: {d['reason']}"


class Run:
    def __init__(
        self, *, kafka: connection.Connect, trace: list[dict[str, Any]], config: Any, key: bytes | None
    ) -> None:
        self.kafka = connection.of(kafka)
        self.trace = trace
        self.fleet = Fleet(config, key)
        self.sim = Simulator(trace)
        self.received: dict[str, dict[str, Any]] = {}
        self.decisions: list[dict[str, Any]] = []
        self.events = 0
        self.records = 0
        self.evictions = 0
        self.outcomes: Counter[str] = Counter()
        self._batch: list[dict[str, Any]] = []
        self._batch_bytes = 0
        self._batch_cluster: str | None = None

    async def _flush(self, producer: AIOKafkaProducer) -> None:
        if not self._batch:
            return
        cluster = self._batch_cluster or records.DEFAULT_CLUSTER
        value = records.encode_batch(cluster, self._batch)
        await producer.send_and_wait(records.CLUSTER_EVENTS, key=cluster.encode(), value=value)
        self.records += 1
        self._batch, self._batch_bytes, self._batch_cluster = [], 0, None

    async def _add(self, producer: AIOKafkaProducer, event: Mapping[str, Any]) -> None:
        cluster = str(event.get("cluster") or records.DEFAULT_CLUSTER)
        body = {k: v for k, v in event.items() if k != "cluster"}
        size = len(orjson.dumps(body))
        if self._batch and (
            cluster != self._batch_cluster
            or len(self._batch) >= MAX_BATCH_EVENTS
            or self._batch_bytes + size > MAX_BATCH_BYTES
        ):
            await self._flush(producer)
        self._batch.append(body)
        self._batch_bytes += size
        self._batch_cluster = cluster

    async def _await_decisions(self, consumer: AIOKafkaConsumer, ids: Sequence[str]) -> list[dict[str, Any]]:
        deadline = time.monotonic() + DECISION_TIMEOUT_S
        while not all(i in self.received for i in ids):
            if time.monotonic() > deadline:
                missing = [i for i in ids if i not in self.received]
                raise Divergence(f"the worker did not emit {missing[0]} within {DECISION_TIMEOUT_S:.0f}s")
            batch = await consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                for m in msgs:
                    d = orjson.loads(m.value or b"{}")
                    self.received.setdefault(d["id"], d)
        return [self.received[i] for i in ids]

    async def play(self, *, until_idle: bool, decisions_out: Path | None) -> None:
        await topics.ensure_topics(self.kafka)
        producer = self.kafka.producer(linger_ms=2)
        # A short fetch wait: the embedded broker holds a fetch for the whole wait.
        consumer = self.kafka.consumer(enable_auto_commit=False, fetch_max_wait_ms=10)
        try:
            await connection.start(self.kafka, producer)
            await connection.start(self.kafka, consumer)
            tp = TopicPartition(records.DECISIONS, 0)
            consumer.assign([tp])
            await consumer.seek_to_end(tp)  # a shared broker may hold earlier runs' decisions
            for sim_event in self.sim:
                event: dict[str, Any] = {"cluster": records.DEFAULT_CLUSTER, **sim_event}
                try:
                    predicted = self.fleet.step(event).records
                except BadEvent:
                    predicted = []  # the worker dead-letters it too, and decides on without it
                await self._add(producer, event)
                self.events += 1
                if not predicted:
                    continue
                await self._flush(producer)
                got = await self._await_decisions(consumer, [d["id"] for d in predicted])
                for want, have in zip(predicted, got, strict=True):
                    if want["hash"] != have["hash"]:
                        raise Divergence(
                            f"decision {want['id']} from the worker differs from the replayed one"
                        )
                for d in got:
                    self.decisions.append(d)
                    self.outcomes[d["outcome"]] += 1
                    print(_line(d), file=sys.stderr, flush=True)
                self.sim.react(got)
                await self._publish_evictions(producer, got)
                if decisions_out is not None:
                    logio.write_jsonl(decisions_out, self.decisions)
            await self._flush(producer)
            if decisions_out is not None:
                logio.write_jsonl(decisions_out, self.decisions)
            print(
                f"trace consumed: {self.events} events in {self.records} records", file=sys.stderr, flush=True
            )
            if not until_idle:
                print("the pipeline keeps running; Ctrl-C to stop", file=sys.stderr, flush=True)
                await asyncio.Event().wait()
        finally:
            await consumer.stop()
            await producer.stop()

    async def _publish_evictions(
        self, producer: AIOKafkaProducer, decisions: Sequence[Mapping[str, Any]]
    ) -> None:
        for d in decisions:
            if d["outcome"] != "preempt":
                continue
            for v in d["victims"]:
                result = "already-terminating" if v.get("terminating") else "done"
                outcome = {
                    "v": VERSION,
                    "decisionId": d["id"],
                    "cluster": d["cluster"],
                    "victim": v,
                    "action": v["action"],
                    "result": result,
                    "attempts": 0 if v.get("terminating") else 1,
                    "ts": d["ts"],
                    "message": "simulated cluster",
                }
                await producer.send(
                    records.EVICTIONS,
                    key=v["uid"].encode(),
                    value=orjson.dumps(outcome),
                    headers=cloudevent.eviction_headers(outcome),
                )
                if result == "done":
                    self.evictions += 1
                    print(
                        f"{str(d['ts'])[11:19]} {'EVICTED':<13} {v['namespace']}/{v['name']} "
                        f"({v['action']}, decision {d['id']})",
                        file=sys.stderr,
                        flush=True,
                    )


def start_worker(
    kafka_args: list[str], store_dir: Path, config_path: str | None, key_path: str | None
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "streams.cli",
        "worker",
        *kafka_args,
        "--store-dir",
        str(store_dir),
        "--health-port",
        "0",
    ]
    if config_path:
        cmd += ["--config", config_path]
    if key_path:
        cmd += ["--hmac-key-file", key_path]
    log = (store_dir / "worker.log").open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WORKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cmd(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    key = load_key(args.hmac_key_file)
    trace = logio.read_trace(Path(args.trace)) if args.trace else traces.example()
    if len({e.get("cluster") or "default" for e in trace}) > 1:
        raise UsageError("the simulated cluster plays one cluster: split a multi-cluster trace by cluster")
    if args.kubeconfig:
        raise UsageError(
            "--kubeconfig: run with a real cluster means `preemptctl source|worker|actuator` (see README)"
        )
    started = time.perf_counter()
    kafka = connection.from_args(args) if connection.given(args) else None
    with contextlib.ExitStack() as stack:
        if kafka is None:
            embedded = stack.enter_context(EmbeddedBroker())
            kafka = connection.KafkaConfig(bootstrap=embedded.bootstrap)
            print(f"embedded broker (tansu) on {embedded.bootstrap}", file=sys.stderr, flush=True)
        asyncio.run(topics.ensure_topics(kafka))
        # The worker reaches the same Kafka the same way (the flags, not the secrets, are passed on).
        kafka_args = [
            "--bootstrap-server",
            kafka.bootstrap,
            "--bootstrap-timeout",
            f"{kafka.bootstrap_timeout_s:g}",
        ]
        if args.kafka_config:
            kafka_args += ["--kafka-config", args.kafka_config]
        store_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="preemptctl-run-")))
        worker = start_worker(kafka_args, store_dir, args.config, args.hmac_key_file)
        stack.callback(stop_worker, worker)
        run = Run(kafka=kafka, trace=trace, config=config, key=key)
        print(
            f"worker started (pid {worker.pid}); playing {len(trace)} trace events",
            file=sys.stderr,
            flush=True,
        )
        try:
            asyncio.run(
                run.play(
                    until_idle=args.until_idle,
                    decisions_out=Path(args.decisions_out) if args.decisions_out else None,
                )
            )
        except KeyboardInterrupt:
            pass
        except Divergence as exc:
            log_tail = (store_dir / "worker.log").read_text(errors="replace")[-2000:]
            raise UsageError(f"{exc}\nworker log:\n{log_tail}") from exc
        finally:
            elapsed = time.perf_counter() - started
            summary = ", ".join(f"{n} {o}" for o, n in sorted(run.outcomes.items())) or "none"
            print(
                f"summary: {run.events} events, {len(run.decisions)} decisions ({summary}), "
                f"{run.evictions} evictions, {elapsed:.1f}s",
                file=sys.stderr,
            )
    return 0
