"""Signed decisions for the actuator tests, the fake clusters they are acted on, and what the
actuator wrote back (tests/k8s/test_actuator*.py, test_forged_log.py, test_preemptor_events.py,
test_real_api.py).

- `KEY`, `ORIGIN`, `FAST`: the signing key, the record's origin and a fast retry policy;
- `world(fake)`: a node full of low-priority pods and a pending high-priority preemptor;
  `cluster(fake)`: the trust tests' two nodes, coredns, pods above and equal to the preemptor and
  a two-member gang, all scheduled by `SCHEDULER`;
- `victim`, `decision`: a victim record and a sealed decision record, as the worker writes them;
- `outcomes`, `outcome_events`, `pod_writes`: the eviction outcomes (schema-checked), the OUTCOME
  events and the pod writes the actuator made;
- `produce`, `wait_until`: records onto a topic of a real broker, and a bounded wait;
- `OneBatchConsumer`: a consumer handing out one batch, then nothing, recording the commits.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import jsonschema
import orjson
from aiokafka import AIOKafkaProducer

from schemas import chain, records
from schemas.records import VictimRecord
from streams.kafka.deadletter import Origin
from streams.kafka.sink import MemorySink
from streams.kube import actuator, eviction
from tests.k8s import objects
from tests.k8s.fakeapi import FakeApi

KEY = b"test-hmac-key"
ORIGIN = Origin("preemption.decisions", 0, 7)
FAST = eviction.RetryPolicy(
    eviction_attempts=3,
    eviction_backoff_initial_s=0.01,
    eviction_backoff_max_s=0.02,
    transient_attempts=2,
    transient_backoff_initial_s=0.01,
    transient_backoff_max_s=0.02,
)
SCHEMA = json.loads((Path(actuator.__file__).parents[2] / "schemas" / "evictions.schema.json").read_text())
STEP_TIMEOUT_S = 30.0

Pods = dict[str, dict[str, Any]]

SCHEDULER = "preemptctl-scheduler"


def world(fake: FakeApi) -> Pods:
    """A node full of low-priority pods and a pending high-priority preemptor."""
    fake.create("nodes", objects.node("n1"))
    pods = {"high": fake.create("pods", objects.pod("high", priority=1000, cpu="3", unschedulable=True))}
    for name, grace in (("v-evict", 30), ("v-delete", 17), ("v-label", 30), ("v-other", 30)):
        pods[name] = fake.create("pods", objects.pod(name, node="n1", grace=grace))
    return pods


def victim(pod: dict[str, Any], action: str, **extra: Any) -> VictimRecord:
    meta = pod["metadata"]
    record = {
        "uid": meta["uid"],
        "namespace": meta["namespace"],
        "name": meta["name"],
        "node": "n1",
        "priority": 0,
        "action": action,
        **extra,
    }
    return cast(VictimRecord, record)


def decision(
    preemptor: dict[str, Any],
    victims: list[VictimRecord],
    *,
    key: bytes | None = KEY,
    decision_id: str = "default/42/high-uid",
    **fields: Any,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "v": 1,
        "id": decision_id,
        "cluster": "default",
        "seq": 42,
        "ts": "2026-01-01T00:00:00Z",
        "flow": "default",
        "preemptor": f"{preemptor['metadata']['namespace']}/{preemptor['metadata']['name']}",
        "preemptorUid": preemptor["metadata"]["uid"],
        "outcome": "preempt",
        "node": "n1",
        "victims": victims,
        "reason": "preempting lower-priority pods",
        "explanation": {},
        "configHash": "cfg",
        "engineVersion": "test",
        **fields,
    }
    return chain.seal(record, chain.GENESIS, key)


def cluster(fake: FakeApi) -> Pods:
    """n1 with three low-priority pods, coredns (kube-system, 2e9) and a pod above the preemptor;
    n2 with a low one; a pending preemptor of priority 1000 and a two-member gang (priority 500, 700)."""
    for name in ("n1", "n2"):
        fake.create("nodes", objects.node(name))
    pods = {
        "high": fake.create(
            "pods", objects.pod("high", priority=1000, cpu="3", unschedulable=True, scheduler=SCHEDULER)
        )
    }
    for name in ("v-evict", "v-delete", "v-label"):
        pods[name] = fake.create("pods", objects.pod(name, node="n1", priority=10, grace=30))
    pods["coredns"] = fake.create(
        "pods", objects.pod("coredns", namespace="kube-system", node="n1", priority=2_000_000_000)
    )
    pods["above"] = fake.create("pods", objects.pod("above", node="n1", priority=5000))
    pods["equal"] = fake.create("pods", objects.pod("equal", node="n1", priority=1000))
    pods["elsewhere"] = fake.create("pods", objects.pod("elsewhere", node="n2", priority=0))
    for name, priority in (("w-0", 500), ("w-1", 700)):
        pods[name] = fake.create(
            "pods", objects.pod(name, priority=priority, unschedulable=True, scheduler=SCHEDULER)
        )
    return pods


def outcome_events(sink: MemorySink) -> list[dict[str, Any]]:
    """The OUTCOME events the actuator wrote into the cluster's log, in order."""
    found = []
    for r in sink.records:
        if r.topic == "preemption.cluster-events":
            batch = orjson.loads(r.value)
            assert r.key == batch["cluster"].encode() and records.decode_batch(r.value)
            found += batch["events"]
    return found


def outcomes(sink: MemorySink, topic: str = "preemption.evictions") -> dict[str, dict[str, Any]]:
    found = [orjson.loads(r.value) for r in sink.on(topic)]
    for record in found:
        jsonschema.validate(record, SCHEMA)
    return {r["victim"]["name"]: r for r in found}


def pod_writes(fake: FakeApi) -> list[tuple[str, str | None, str | None]]:
    """(method, name, subresource) of every write to a pod."""
    return [(c.method, c.name, c.subresource) for c in fake.writes() if c.plural == "pods"]


async def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, key=b"default")
    finally:
        await producer.stop()


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Message:
    def __init__(self, offset: int, value: bytes) -> None:
        self.offset, self.value, self.key, self.headers = offset, value, b"default", ()


class OneBatchConsumer:
    """Hands out one batch, then nothing; records the commits."""

    def __init__(self, values: list[bytes], stopping: asyncio.Event) -> None:
        self.batches = [{actuator.TopicPartition("preemption.decisions", 0): [
            Message(i, v) for i, v in enumerate(values)
        ]}]  # fmt: skip
        self.commits: list[int] = []
        self.stopping = stopping

    async def getmany(self, timeout_ms: int) -> dict[Any, list[Message]]:
        if self.batches:
            return self.batches.pop()
        self.stopping.set()
        return {}

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits += list(offsets.values())

    def assignment(self) -> set[Any]:
        return set()  # one batch is all there is: nothing to look ahead at
