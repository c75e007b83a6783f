"""Issue 33 #3 on real Kafka: a producer of whole objects leaves no unread field in the worker's
store or in preemption.snapshots.

The log is the bundled cluster's, every object dressed as the API server holds it
(streams.sim.apiserver: env values, args, secret volume names, probes, managedFields,
last-applied-configuration, status messages), each unread field holding a secret-looking
value, written without the source's projection header, as an older source or any other
writer would. A worker under exactly_once folds it; the decisions are `replay`'s of the same
log (by id and bytes). Then what it kept is read back as an operator would: the store's
entries decoded, and every snapshot in preemption.snapshots fetched, checked against its
manifest and decoded. The secret is in none of them, nor in any decision's explanation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from streams.brokers.kafka_local import LocalKafka
from streams.kafka import topics
from streams.kafka.reading import PartitionReader
from streams.pipeline import snapshot
from streams.pipeline.store import Store
from streams.sim import apiserver
from tests.chaos.harness import Worker, assert_same, expected, log_of, produce, wait_published

SECRET = "zq9-s3cr3t-value"
NODES = 20


async def _snapshots(bootstrap: str) -> list[tuple[snapshot.Manifest, list[bytes]]]:
    """Every snapshot the latest manifest names (it and its previous), decoded from its chunks."""
    out = []
    async with PartitionReader(bootstrap, read_committed=True) as reader:
        latest = await snapshot.latest(reader, 0, topic=topics.SNAPSHOTS)
        assert latest is not None, "the worker wrote no snapshot"
        for manifest in (latest, latest.previous):
            if manifest is None:
                continue
            state, entries = await snapshot.load(reader, manifest, topic=topics.SNAPSHOTS)
            out.append(
                (manifest, [orjson.dumps(state)] + [orjson.dumps(orjson.loads(v)) for _, v in entries])
            )
    return out


def test_a_whole_object_producer_leaves_no_unread_field_in_the_store_or_the_snapshots(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    cluster = "dressed"
    whole = apiserver.dress_log(log_of(cluster, NODES), secret=SECRET)
    want = expected(whole)
    assert want and SECRET.encode() in orjson.dumps(whole)
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-whole")
    w.start().wait_ready()
    try:
        asyncio.run(produce(kafka.bootstrap, cluster, whole, [7]))
        got = wait_published(kafka.bootstrap, cluster, len(want))
    finally:
        w.stop()  # a clean stop commits: the store reflects the whole log
    assert_same(got, want)
    assert not [d for d in got if SECRET.encode() in d]  # no explanation carries it
    with Store(tmp_path / "store" / "cluster-events-0") as kept:
        state = kept.state()
        assert state is not None and state["projection"] == 1
        values = [orjson.dumps(orjson.loads(v)) for _, v in kept.entries()]
    assert values and not [v for v in values if SECRET.encode() in v]
    for manifest, decoded in asyncio.run(_snapshots(kafka.bootstrap)):
        assert manifest.projected
        assert not [v for v in decoded if SECRET.encode() in v]
