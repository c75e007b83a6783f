"""The fault-injection suite's tools: worker processes to kill, pause and fence, logs in, decisions out.

Each scenario writes a cluster's log (the simulated cluster's full log, so the
undisturbed decisions are `fold` of it: determinism makes that the
undisturbed run's log byte for byte, as tests/integration shows), disturbs
the pipeline, and compares the decisions a read_committed consumer (the
actuator's view) sees, by id and by bytes, with the undisturbed ones.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import murmur2

from engine.config import Config
from fold import fleet
from schemas import VERSION, records
from streams.brokers import process
from streams.kafka import topics
from streams.kafka.reading import PartitionReader
from streams.sim import simulator, traces

# A worker must publish what its log calls for within this long, rebalances and
# recoveries included (a SIGKILLed member is noticed after the session timeout).
DECISIONS_TIMEOUT_S = 120.0
# Group session timeout of the workers here: a killed or paused worker's partitions
# move after this long.
SESSION_TIMEOUT_S = 6.0
# How long a worker may take to join its group and open its partitions.
READY_TIMEOUT_S = 60.0
# Poll interval while waiting for decisions.
POLL_S = 0.5


def log_of(cluster: str, nodes: int) -> list[dict[str, Any]]:
    """A PreemptionBasic cluster's full log (trace and the simulated cluster's reactions)."""
    return simulator.simulate([dict(e, cluster=cluster) for e in traces.basic(nodes)], Config()).log


def a_day_later(log: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same objects relisted a day later (a re-created topic): the same uids, names and
    decision ids when folded, other times, so other decision bytes."""

    def later(ts: str) -> str:
        day = datetime.strptime(ts[:10], "%Y-%m-%d") + timedelta(days=1)
        return day.strftime("%Y-%m-%d") + ts[10:]

    return [dict(e, ts=later(e["ts"])) if isinstance(e.get("ts"), str) else dict(e) for e in log]


def expected(log: Sequence[dict[str, Any]]) -> list[bytes]:
    """The undisturbed decisions of a log, as the bytes a worker publishes."""
    return [records.encode(d) for d in fleet.fold(log, Config()).decisions]


def partition_of(cluster: str, partitions: int) -> int:
    return int(murmur2(cluster.encode()) & 0x7FFFFFFF) % partitions


def clusters_on_partitions(prefix: str, partitions: int) -> list[str]:
    """One cluster name per partition, in partition order (the key decides the partition)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        name = f"{prefix}-{n}"
        found.setdefault(partition_of(name, partitions), name)
        n += 1
    return [found[p] for p in range(partitions)]


async def produce(
    bootstrap: str, cluster: str, events: Sequence[Any], sizes: Sequence[int] | None = None
) -> None:
    """Write events as cluster-events records, `sizes` events each (cycled), in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
    await producer.start()
    try:
        i, n = 0, 0
        while i < len(events):
            size = sizes[n % len(sizes)] if sizes else 10
            chunk = [
                {k: v for k, v in e.items() if k != "cluster"} if isinstance(e, dict) else e
                for e in events[i : i + size]
            ]
            value = orjson.dumps({"v": VERSION, "cluster": cluster, "events": chunk})
            await producer.send_and_wait(records.CLUSTER_EVENTS, key=cluster.encode(), value=value)
            i, n = i + size, n + 1
    finally:
        await producer.stop()


async def published(
    bootstrap: str,
    cluster: str,
    *,
    partitions: int = 1,
    read_committed: bool = True,
    topic: str = records.DECISIONS,
) -> list[bytes]:
    """The values on `topic` for `cluster`, in log order, as a consumer of that isolation level sees them."""
    out = []
    async with PartitionReader(bootstrap, read_committed=read_committed) as reader:
        p = partition_of(cluster, partitions)
        start, _ = await reader.bounds(topic, p)
        async for m in reader.read(topic, p, start):
            if m.key == cluster.encode():
                out.append(m.value)
    return out


def wait_published(
    bootstrap: str, cluster: str, count: int, *, partitions: int = 1, timeout: float = DECISIONS_TIMEOUT_S
) -> list[bytes]:
    """Read committed decisions until `count` are there (then once more, so a duplicate would show)."""
    deadline = time.monotonic() + timeout
    got: list[bytes] = []
    while time.monotonic() < deadline:
        got = asyncio.run(published(bootstrap, cluster, partitions=partitions))
        if len(got) >= count:
            time.sleep(2 * POLL_S)
            return asyncio.run(published(bootstrap, cluster, partitions=partitions))
        time.sleep(POLL_S)
    return got


def assert_same(got: Sequence[bytes], want: Sequence[bytes]) -> None:
    """Same decisions, by id (none lost, none doubled) and by bytes, in the same order."""
    ids = [orjson.loads(v)["id"] for v in got]
    want_ids = [orjson.loads(v)["id"] for v in want]
    assert len(ids) == len(set(ids)), f"doubled: {sorted({i for i in ids if ids.count(i) > 1})[:5]}"
    assert set(want_ids) - set(ids) == set(), f"lost: {sorted(set(want_ids) - set(ids))[:5]}"
    assert ids == want_ids
    assert list(got) == list(want)


@dataclass
class Worker:
    """One `preemptctl worker` process (exactly_once on real Kafka) in its own process group."""

    bootstrap: str
    store: Path
    group: str
    extra: Sequence[str] = ()
    guarantee: str = "exactly_once"
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> Worker:
        self.port = process.free_loopback_port()
        self.starts += 1
        log_path = self.store.parent / f"{self.store.name}.{self.starts}.log"
        self.logs.append(log_path)
        cmd = [
            sys.executable, "-m", "streams.cli", "worker",
            "--broker", f"kafka://{self.bootstrap}",
            "--store-dir", str(self.store),
            "--group-id", self.group,
            "--processing-guarantee", self.guarantee,
            "--session-timeout", str(SESSION_TIMEOUT_S),
            "--health-host", "127.0.0.1",
            "--health-port", str(self.port),
            "--log-level", "info",
            *self.extra,
        ]  # fmt: skip
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        """Does /readyz answer 200 right now?"""
        try:
            return bool(
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status == 200
            )
        except OSError:
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.alive(), f"worker exited: {self.tail()}"
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"worker not ready within {timeout:.0f}s: {self.tail()}")

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        if self.alive():
            self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            self.signal(signal.SIGCONT)  # a paused worker cannot handle SIGTERM
            self.signal(signal.SIGTERM)
            try:
                assert self.proc is not None
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, chars: int = 3000) -> str:
        return "\n".join(p.read_text(errors="replace")[-chars:] for p in self.logs[-1:] if p.exists())

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())


async def recreate(bootstrap: str, topic: str) -> None:
    """Delete `topic` and create it again, as an operator cleaning up would."""
    from aiokafka.admin import NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        spec = {s.name: s for s in topics.topic_specs()}[topic]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:  # the deletion completes asynchronously
            try:
                await admin.create_topics(
                    [NewTopic(topic, spec.partitions, 1, topic_configs=dict(spec.configs))]
                )
                return
            except Exception:
                assert time.monotonic() < deadline, f"{topic} could not be created again"
                await asyncio.sleep(0.5)
    finally:
        await admin.close()
