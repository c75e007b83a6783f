"""The source run in-process, and the cluster-events topic read back, for the source tests
(tests/k8s/test_source.py) and those that run a source or read what one wrote (test_commands.py,
test_real_api.py).

- `running(api, sink)`: a Source until the block ends, ready first (no ticks, a fast backoff);
- `read_topic`: consume a cluster-events topic until its events say enough; `read_raw`,
  `batch_events`: the (key, value) pairs and the events they batch;
- `STEP_TIMEOUT_S`, `NO_TICKS`, `fast_backoff`: the bounds and backoff the tests run with.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from kubernetes_asyncio import client

from streams.common.backoff import Backoff
from streams.kafka.sink import RecordSink
from streams.kube import source

# Long enough for any step of a scenario on a loaded CI machine; a hang fails instead of stalling.
STEP_TIMEOUT_S = 10.0
# No TICK unless a test asks for one.
NO_TICKS = 3600.0

Event = dict[str, Any]


def fast_backoff() -> Backoff:
    return Backoff(initial_s=0.01, max_s=0.05, jitter=0.0)


@asynccontextmanager
async def running(api: client.ApiClient, sink: RecordSink, **kwargs: Any) -> AsyncIterator[source.Source]:
    kwargs.setdefault("tick_seconds", NO_TICKS)
    kwargs.setdefault("backoff", fast_backoff)
    src = source.Source(api, sink, **kwargs)
    task = asyncio.create_task(src.run())
    try:
        await asyncio.wait_for(src.ready.wait(), STEP_TIMEOUT_S)
        yield src
    finally:
        src.stop()
        await asyncio.wait_for(task, STEP_TIMEOUT_S)


async def read_raw(
    bootstrap: str, topic: str, until: Callable[[list[tuple[bytes | None, bytes]]], bool]
) -> list[tuple[bytes | None, bytes]]:
    """Consume partition 0 from the start until `until(records)` holds; (key, value) pairs."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        raw: list[tuple[bytes | None, bytes]] = []
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not until(raw):
            assert time.monotonic() < deadline, f"timed out with {len(raw)} records: {raw[-2:]}"
            batch = await consumer.getmany(tp, timeout_ms=100)
            raw += [(m.key, m.value) for m in batch.get(tp, []) if m.value is not None]
        return raw
    finally:
        await consumer.stop()


def batch_events(raw: list[tuple[bytes | None, bytes]]) -> list[Event]:
    out: list[Event] = []
    for _, value in raw:
        try:
            out.extend(orjson.loads(value)["events"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue  # the session broker is shared: other tests write deliberate poison records
    return out


async def read_topic(
    bootstrap: str, topic: str, until: Callable[[list[Event]], bool]
) -> tuple[list[Event], list[tuple[bytes | None, bytes]]]:
    """Consume cluster-events batches until `until(events)` holds."""
    raw = await read_raw(bootstrap, topic, lambda records: until(batch_events(records)))
    return batch_events(raw), raw
