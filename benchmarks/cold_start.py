"""Cold start: fold a cluster's initial list into a worker store, then time reopening it.

    .venv/bin/python benchmarks/cold_start.py 37500     # 37,500 nodes, 150,000 pods

Prints the fold time and how long `recovery.open` takes to restore the
state and build the index from the local rocksdict store (docs/performance.md, cold start),
in-process over an in-memory broker. Recovery from a snapshot in Kafka, with
no local store, is `preemptctl bench pipeline --recovery-pods 150000`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from engine.config import Config
from schemas import records
from streams.kafka.memory import MemoryBroker
from streams.pipeline import recovery
from streams.pipeline.outbox import MemoryOutbox, Outbox
from streams.pipeline.setup import Setup, SnapshotPolicy
from streams.sim import workloads

EVENTS_PER_RECORD = 200


async def main(nodes: int) -> None:
    events = [{"type": "ADDED", "ts": workloads.EPOCH, "object": o} for o in workloads.cluster_objects(nodes)]
    broker = MemoryBroker()
    for i in range(0, len(events), EVENTS_PER_RECORD):
        value = records.encode_batch("default", events[i : i + EVENTS_PER_RECORD])
        broker.append(records.CLUSTER_EVENTS, 0, b"default", value)

    async def outbox(partition: int) -> Outbox:
        return MemoryOutbox(broker)

    setup = Setup(
        config=Config(),
        key=None,
        store_dir=Path(tempfile.mkdtemp()),
        reader=lambda: broker,
        outbox=outbox,
        # No snapshots while folding: this measures the store alone.
        snapshots=SnapshotPolicy(min_events=10**12),
    )
    started = time.perf_counter()
    worker = await recovery.open(partition=0, setup=setup)
    await recovery.catch_up(worker)
    await worker.close()
    print(f"folded {len(events)} events in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    worker = await recovery.open(partition=0, setup=setup)
    cluster = worker.controllers["default"].cluster
    print(
        f"cold start from the store: {len(cluster.pods)} pods, {len(cluster.nodes)} nodes, "
        f"ready in {time.perf_counter() - started:.2f} s"
    )
    await worker.close(commit=False)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 37_500))
