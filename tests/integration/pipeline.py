"""Helpers for pipeline tests: write a log to cluster-events, run workers, read decisions back.

Tests share one broker per session, so each uses its own cluster name (the
cluster-events key) and consumer group, and reads back only its own records.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from schemas import records
from streams.kafka import connection, reading
from streams.kafka import topics as kafka_topics

# A worker must produce what the log calls for within this long (group join included).
DECISIONS_TIMEOUT_S = 90.0


def with_cluster(events: Sequence[dict[str, Any]], cluster: str) -> list[dict[str, Any]]:
    return [dict(e, cluster=cluster) for e in events]


async def produce(
    kafka: connection.Connect,
    cluster: str,
    events: Sequence[dict[str, Any]],
    *,
    per_record: int = 10,
    raw: Sequence[bytes] = (),
    topic: str = records.CLUSTER_EVENTS,
    create: bool = True,
) -> None:
    config = connection.of(kafka)
    if create:
        await kafka_topics.ensure_topics(config)
    producer = config.producer(linger_ms=5)
    await connection.start(config, producer)
    try:
        for value in raw:
            await producer.send_and_wait(topic, key=cluster.encode(), value=value)
        for i in range(0, len(events), per_record):
            chunk = [{k: v for k, v in e.items() if k != "cluster"} for e in events[i : i + per_record]]
            value = orjson.dumps({"v": 1, "cluster": cluster, "events": chunk})
            await producer.send_and_wait(topic, key=cluster.encode(), value=value)
    finally:
        await producer.stop()


def start_worker(
    bootstrap: str,
    store: Path,
    group: str,
    *,
    guarantee: str = "at_least_once",
    extra: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    store.mkdir(parents=True, exist_ok=True)
    log = (store.parent / f"{store.name}.log").open("ab")
    cmd = [
        sys.executable,
        "-m",
        "streams.cli",
        "worker",
        "--broker",
        f"kafka://{bootstrap}",
        "--store-dir",
        str(store),
        "--group-id",
        group,
        "--processing-guarantee",
        guarantee,
        "--log-level",
        "info",
        "--health-port",
        "0",
        *extra,
    ]
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ)
    )


def stop(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def decisions(
    kafka: connection.Connect,
    cluster: str,
    *,
    read_committed: bool = False,
    topic: str = records.DECISIONS,
) -> list[dict[str, Any]]:
    out = []
    async for m in reading.read_all(kafka, topic, read_committed=read_committed):
        d = orjson.loads(m.value)
        if d.get("cluster") == cluster:
            out.append(d)
    return out


async def wait_for_decisions(
    bootstrap: connection.Connect,
    cluster: str,
    count: int,
    *,
    read_committed: bool = False,
    timeout: float = DECISIONS_TIMEOUT_S,
    settle: bool = True,
    topic: str = records.DECISIONS,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    got: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        got = await decisions(bootstrap, cluster, read_committed=read_committed, topic=topic)
        if len(got) >= count:
            if not settle:
                return got
            await asyncio.sleep(1.0)  # anything beyond the expected count (a duplicate) shows up too
            return await decisions(bootstrap, cluster, read_committed=read_committed, topic=topic)
        await asyncio.sleep(0.1 if not settle else 0.5)
    return got


async def dead_letters(bootstrap: str, cluster: str) -> list[tuple[bytes, dict[str, bytes]]]:
    out = []
    async for m in reading.read_all(bootstrap, records.DEAD_LETTER):
        if m.key == cluster.encode():
            out.append((m.value, dict(m.headers)))
    return out
