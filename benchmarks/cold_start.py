"""Cold start: fold a cluster's initial list into a worker store, then time reopening it.

    .venv/bin/python benchmarks/cold_start.py 37500     # 37,500 nodes, 150,000 pods

Prints the fold time and how long `PartitionWorker.open` takes to restore the
state and build the index from the local rocksdict store (DESIGN §8 cold start).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import orjson

from engine.config import Config
from streams.pipeline.worker import PartitionWorker
from streams.sim import workloads

EVENTS_PER_RECORD = 200


async def _emit(decisions: object) -> None:
    return None


async def _dead(key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
    return None


def _open(path: Path) -> PartitionWorker:
    return PartitionWorker.open(
        partition=0, path=path, config=Config(), key=None, emit=_emit, dead_letter=_dead, visible={}
    )


async def main(nodes: int) -> None:
    events = [{"type": "ADDED", "ts": workloads.EPOCH, "object": o} for o in workloads.cluster_objects(nodes)]
    records = [
        orjson.dumps({"v": 1, "cluster": "default", "events": events[i : i + EVENTS_PER_RECORD]})
        for i in range(0, len(events), EVENTS_PER_RECORD)
    ]
    path = Path(tempfile.mkdtemp()) / "store"
    worker = _open(path)
    started = time.perf_counter()
    for offset, value in enumerate(records):
        await worker.process(offset, b"default", value)
    worker.close()
    print(f"folded {len(events)} events in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    worker = _open(path)
    cluster = worker.controllers["default"].cluster
    print(
        f"cold start from the store: {len(cluster.pods)} pods, {len(cluster.nodes)} nodes, "
        f"ready in {time.perf_counter() - started:.2f} s"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 37_500))
