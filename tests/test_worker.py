"""The worker's partitions on an in-memory broker: faults, snapshots and recovery, against replay.

Every scenario compares what the worker published (decisions, by id and bytes,
in order) with `fold` of the same log, the deterministic reference. The same
scenarios run on real Kafka in tests/chaos/; here they are fast enough to
sweep every fault position.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from engine.config import Config
from fold import fleet
from schemas import records
from streams.common.health import Health, RouteServer
from streams.kafka import topics
from streams.kafka.deadletter import Origin
from streams.pipeline import checkpoint, outbox, recovery, snapshot, tables
from streams.pipeline.checkpoint import CHECKPOINT_INTERVAL_S
from streams.pipeline.faults import Faults
from streams.pipeline.partitions import Partitions
from streams.pipeline.setup import SnapshotPolicy
from streams.sim import simulator, traces
from tests.support import mixed_logs
from tests.support.memory_pipeline import CLUSTER, Pipeline, batches

SMALL_SNAPSHOTS = SnapshotPolicy(min_events=300, events_per_object=0)


def _log(nodes: int = 40) -> list[dict[str, Any]]:
    return simulator.simulate(traces.basic(nodes), Config()).log


def _reference(events: list[Any]) -> list[dict[str, Any]]:
    return [dict(d) for d in fleet.fold(events, Config()).decisions]


def test_the_worker_publishes_what_replay_derives(tmp_path: Path) -> None:
    log = _log()
    p = Pipeline(tmp_path)
    p.produce(batches(log, per_record=7))
    asyncio.run(p.feed())
    assert p.decisions() == _reference(log)
    assert not p.dead_letters()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=mixed_logs.mixed_logs(), per_record=st.integers(1, 9))
def test_garbage_inside_valid_batches_never_stalls_the_partition(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[list[Any], set[int]], per_record: int
) -> None:
    mixed, bad = case
    p = Pipeline(tmp_path_factory.mktemp("store"))
    p.produce(batches(mixed, cluster="c", per_record=per_record))
    asyncio.run(p.feed())
    good = [dict(e, cluster="c") for i, e in enumerate(mixed) if i not in bad]
    assert p.decisions() == _reference(good)
    dead = p.dead_letters()
    assert len(dead) == len(bad)  # one dead letter per bad event, never a whole record
    where = sorted(
        int(h["origin-offset"]) * per_record + int(h["origin-index"]) for h in (dict(m.headers) for m in dead)
    )
    assert where == sorted(bad)
    for m in dead:
        headers = dict(m.headers)
        assert headers["origin-topic"] == records.CLUSTER_EVENTS.encode()
        assert headers["error-class"] and headers["error"]
        assert m.key == b"c"


@pytest.mark.parametrize("transactional", [True, False], ids=["transactions", "at-least-once"])
@pytest.mark.parametrize("fault", ["fail-send", "abort-commit"])
def test_a_failed_send_leaves_nothing_lost_or_doubled(
    tmp_path: Path, transactional: bool, fault: str
) -> None:
    """Issue 12, Why 2: a send failing at the Nth record, for every N up to past the last decision."""
    log = _log(12)
    want = _reference(log)
    undisturbed = Pipeline(tmp_path / "u", transactional=transactional)
    undisturbed.produce(batches(log, per_record=5))
    asyncio.run(undisturbed.feed())
    assert undisturbed.decisions() == want
    sends = len(want) + len(undisturbed.broker.messages(topics.SNAPSHOTS)) + 2
    for n in range(1, sends, 1 if fault == "fail-send" else 2):
        p = Pipeline(tmp_path / f"{n}", transactional=transactional, faults=Faults.parse([f"{fault}={n}"]))
        p.produce(batches(log, per_record=5))
        asyncio.run(p.feed())
        assert not p.fatal
        assert p.decisions() == want, f"{fault}={n}"


def _counted_decisions() -> float:
    return sum(
        s.value
        for m in REGISTRY.collect()
        if m.name == "preemptctl_decisions"
        for s in m.samples
        if s.name.endswith("_total")
    )


@pytest.mark.parametrize("transactional", [True, False], ids=["transactions", "at-least-once"])
@pytest.mark.parametrize("fault", ["", "fail-send=3", "abort-commit=1", "abort-commit=2"])
def test_every_published_decision_is_counted_once(tmp_path: Path, transactional: bool, fault: str) -> None:
    """preemptctl_decisions_total equals the decisions in the topic, whatever failed on the way.

    Without transactions an acknowledged decision is published even when the commit
    after it fails, and the reopened worker finds it published and sends it no more:
    counting only after the commit lost it.
    """
    before = _counted_decisions()
    p = Pipeline(tmp_path, transactional=transactional, faults=Faults.parse([fault] if fault else []))
    p.produce(batches(_log(12), per_record=5))
    asyncio.run(p.feed())
    assert _counted_decisions() - before == len(p.decisions())


def test_a_failed_store_write_keeps_its_changes(tmp_path: Path) -> None:
    """Issue 12, Why 5: a checkpoint marked changes stored before the write succeeded."""
    log = _log(20)
    for n in (1, 2, 3, 5):
        p = Pipeline(tmp_path / f"{n}", faults=Faults.parse([f"fail-store={n}"]))
        p.produce(batches(log, per_record=3))
        asyncio.run(p.feed())
        setup = Pipeline(tmp_path / f"{n}", broker=p.broker).setup
        reopened = asyncio.run(recovery.open(partition=0, setup=setup))
        try:
            reference = fleet.Fleet(Config())
            for e in log:
                reference.step(e)
            ctl, want = reopened.controllers[CLUSTER], reference.controllers[CLUSTER]
            assert reopened.position == len(batches(log, per_record=3)) - 1
            assert ctl.cluster.pods == want.cluster.pods
            assert {n: s.node for n, s in ctl.cluster.nodes.items()} == {
                n: s.node for n, s in want.cluster.nodes.items()
            }
            assert orjson.dumps(ctl.state()) == orjson.dumps(want.state())
        finally:
            asyncio.run(reopened.close(commit=False))


def test_a_record_keyed_to_another_cluster_is_dead_lettered_whole(tmp_path: Path) -> None:
    log = _log(5)
    p = Pipeline(tmp_path)
    recs = batches(log, per_record=10)
    wrong = (b"other", recs[1][1])
    p.produce([recs[0], wrong, *recs[1:]])
    asyncio.run(p.feed())
    assert p.decisions() == _reference(log)
    (dead,) = p.dead_letters()
    headers = dict(dead.headers)
    assert headers["error-class"] == b"KeyMismatch" and "origin-index" not in headers
    assert dead.value == wrong[1] and dead.key == b"other"


def _snapshotted(tmp_path: Path, log: list[dict[str, Any]], cut: int) -> Pipeline:
    """The first `cut` events folded with frequent snapshots; the rest produced, not yet folded."""
    p = Pipeline(tmp_path / "store", snapshots=SMALL_SNAPSHOTS)
    p.produce(batches(log[:cut], per_record=10))
    asyncio.run(p.run())
    p.produce(batches(log[cut:], per_record=10))
    return p


def test_a_worker_without_store_recovers_from_the_snapshot(tmp_path: Path) -> None:
    log = _log()
    p = _snapshotted(tmp_path, log, 2000)
    manifest = asyncio.run(snapshot.latest(p.broker, 0))
    assert manifest is not None and manifest.position > 0
    shutil.rmtree(p.store_dir)
    p.reads.clear()
    asyncio.run(p.run())
    assert p.decisions() == _reference(log)
    # Opening read the log from the snapshot's position on, the decisions from its commit on.
    events_from = min(start for topic, start in p.reads if topic == records.CLUSTER_EVENTS)
    assert events_from == manifest.position + 1
    assert all(start > 0 for topic, start in p.reads if topic == records.DECISIONS)


@pytest.mark.parametrize("commit_every_record", [False, True], ids=["timer", "loaded-machine"])
def test_retention_deleting_the_head_changes_no_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commit_every_record: bool
) -> None:
    """Retention by age deletes, in both topics, what is older than the latest snapshot.

    Issue 19 #11: this test deleted every decision, those published after the snapshot
    too, and expected none to be published again. That held only while the snapshot fell
    on the last record, i.e. while all of the first part was folded within one commit
    interval: on a loaded machine the timer commits (and snapshots) earlier, and the
    worker rightly re-published the decisions after its snapshot that the test had
    deleted. `loaded-machine` commits after every record, as such a machine does.
    """
    if commit_every_record:
        monkeypatch.setattr(checkpoint, "CHECKPOINT_INTERVAL_S", 0.0)
    log = _log()
    p = _snapshotted(tmp_path, log, 2000)
    manifest = asyncio.run(snapshot.latest(p.broker, 0))
    assert manifest is not None
    state, _ = asyncio.run(snapshot.load(p.broker, manifest))
    p.broker.delete_before(records.CLUSTER_EVENTS, 0, manifest.position + 1)
    expired = int(state["decisionsNext"])  # the decisions published before the snapshot's commit
    p.broker.delete_before(records.DECISIONS, 0, expired)
    shutil.rmtree(p.store_dir)
    asyncio.run(p.run())
    assert p.decisions() == _reference(log)[expired:]


def test_all_decisions_expired_is_not_a_store_ahead(tmp_path: Path) -> None:
    """Issue 12, Why 3: a cluster whose decisions all expired was taken for "store ahead"."""
    log = _log()
    p = Pipeline(tmp_path / "store")
    p.produce(batches(log[:2000], per_record=10))
    asyncio.run(p.run())
    published = len(p.decisions())
    p.broker.delete_before(records.DECISIONS, 0, 10**9)
    p.produce(batches(log[2000:], per_record=10))
    p.reads.clear()
    asyncio.run(p.run())
    assert min(start for topic, start in p.reads if topic == records.CLUSTER_EVENTS) > 0  # the store was kept
    assert p.decisions() == _reference(log)[published:]  # nothing sent twice


def test_a_recreated_topic_discards_the_state(tmp_path: Path) -> None:
    """The store records which topic incarnation its position refers to."""
    first, second = _log(10), simulator.simulate(traces.basic(30), Config()).log
    p = Pipeline(tmp_path / "store")
    p.produce(batches(first, per_record=10))
    asyncio.run(p.run())
    again = Pipeline(tmp_path / "store")  # same store, a new broker: the topics were recreated
    again.produce(batches(second, per_record=10))
    asyncio.run(again.run())
    assert again.decisions() == _reference(second)


def test_a_snapshot_torn_by_a_crash_is_never_read(tmp_path: Path) -> None:
    log = _log()
    p = _snapshotted(tmp_path, log, 2000)
    manifest = asyncio.run(snapshot.latest(p.broker, 0))
    assert manifest is not None and manifest.previous is not None
    # A crash mid-snapshot: chunks of a newer position, no manifest for them.
    for n, chunk in enumerate(snapshot.encode({"position": 10**6}, [(b"obj/x", b"{}")])):
        p.broker.append(topics.SNAPSHOTS, 0, snapshot.chunk_key(0, 10**6, n), chunk)
    # ... and the latest snapshot's first chunk damaged: the previous one is used.
    first = manifest.chunks[0].offset
    log_of = p.broker._log(topics.SNAPSHOTS, 0)
    damaged = log_of.records[first - log_of.base]
    assert damaged is not None
    log_of.records[first - log_of.base] = type(damaged)(
        damaged.partition, damaged.offset, damaged.key, b"x" + damaged.value, damaged.headers
    )
    shutil.rmtree(p.store_dir)
    p.reads.clear()
    asyncio.run(p.run())
    assert p.decisions() == _reference(log)
    assert min(start for topic, start in p.reads if topic == records.CLUSTER_EVENTS) == (
        manifest.previous.position + 1
    )


def test_only_two_snapshots_stay(tmp_path: Path) -> None:
    log = _log(200)
    p = Pipeline(tmp_path / "store", snapshots=SMALL_SNAPSHOTS)
    for part in range(4):  # each run ends with a commit, and a snapshot after it
        p.produce(batches(log[part * 700 : (part + 1) * 700], per_record=10))
        asyncio.run(p.run())
    manifest = asyncio.run(snapshot.latest(p.broker, 0))
    assert manifest is not None and manifest.previous is not None
    compacted = {m.key: m.value for m in p.broker.messages(topics.SNAPSHOTS)}  # what compaction keeps
    live = {k for k, v in compacted.items() if v}
    tombstoned = {k for k, v in compacted.items() if not v}
    kept = {manifest.position, manifest.previous.position}
    for key in live - {snapshot.manifest_key(0)}:
        assert int(key.split(b"/")[3]) in kept
    assert tombstoned and all(int(k.split(b"/")[3]) not in kept for k in tombstoned)


def test_the_tables_are_readable_over_http(tmp_path: Path) -> None:
    log = _log(10)
    p = Pipeline(tmp_path)
    p.produce(batches(log, per_record=10))

    async def scenario() -> None:
        parts = Partitions(p.setup)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        server = await RouteServer(tables.routes(parts), port=0).start()
        base = f"http://127.0.0.1:{server.port}"
        try:
            async with aiohttp.ClientSession() as http:
                got = await (await http.get(f"{base}/clusters/{CLUSTER}/nodes")).json()
                assert [n["name"] for n in got["nodes"]] == sorted(
                    parts.workers[0].controllers[CLUSTER].cluster.nodes
                )
                got = await (await http.get(f"{base}/clusters/{CLUSTER}/pods?limit=5")).json()
                assert len(got["pods"]) == 5 and got["total"] == len(
                    parts.workers[0].controllers[CLUSTER].cluster.pods
                )
                got = await (await http.get(f"{base}/clusters/{CLUSTER}/nominations")).json()
                assert set(got) == {"nominations", "leaving"}
                got = await (await http.get(f"{base}/partitions")).json()
                assert got["partitions"][0]["position"] == parts.workers[0].position
                assert (await http.get(f"{base}/clusters/nope/pods")).status == 404
        finally:
            await server.stop()
            await parts.close()

    asyncio.run(scenario())


def test_a_quiet_partition_is_committed_by_the_timer(tmp_path: Path) -> None:
    """Under exactly_once nothing is visible before a commit: a partition whose records stop must commit."""
    log = _log(10)
    p = Pipeline(tmp_path)
    recs = batches(log, per_record=10)

    async def scenario() -> None:
        parts = Partitions(p.setup)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        before = len(p.decisions())
        p.produce(recs)
        for m in p.broker.messages(records.CLUSTER_EVENTS):
            await parts.handle(0, m.offset, m.key, m.value)
        await asyncio.sleep(CHECKPOINT_INTERVAL_S * 1.5)
        await parts.tick()
        assert len(p.decisions()) - before == len(_reference(log))
        assert parts.workers[0].stored == len(recs) - 1
        await parts.close()

    asyncio.run(scenario())


def test_ready_only_once_every_partition_is_caught_up(tmp_path: Path) -> None:
    log = _log(20)
    p = Pipeline(tmp_path)
    p.produce(batches(log, per_record=10))

    async def scenario() -> None:
        health = Health("worker")
        parts = Partitions(p.setup, health=health)
        await parts.assign([0])
        assert not health.ready  # opening: store, snapshot, then the log to its end
        await asyncio.gather(*parts.opening.values())
        assert health.ready and parts.workers[0].position == len(batches(log, per_record=10)) - 1
        await parts.close()

    asyncio.run(scenario())


def test_a_revoked_partition_leaves_no_frozen_lag_series(tmp_path: Path) -> None:
    """Review: a revoked partition's lag gauges stayed at their last value on the old owner,
    and a lag left behind there kept the falling-behind alert firing."""
    p = Pipeline(tmp_path)
    p.produce(batches(_log(8), per_record=10))

    def series(name: str) -> list[dict[str, str]]:
        return [s.labels for m in REGISTRY.collect() for s in m.samples if s.name == name]

    async def scenario() -> None:
        parts = Partitions(p.setup)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        assert {"partition": "0"} in series("preemptctl_worker_lag_seconds")
        await parts.revoke([0])
        assert {"partition": "0"} not in series("preemptctl_worker_lag_seconds")
        assert {"partition": "0"} not in series("preemptctl_worker_position")
        await parts.close()

    asyncio.run(scenario())


def test_a_dead_letter_too_large_carries_a_reference_instead() -> None:
    origin = Origin(records.CLUSTER_EVENTS, 3, 42, 7)
    small = outbox.dead_letter(
        key=b"c", value=b"x" * 1000, origin=origin, error_class="E", error="why", partition=3
    )
    assert small.value == b"x" * 1000 and "value-omitted" not in dict(small.headers)
    big = b"y" * (records.VALUE_MAX_BYTES + 1)
    out = outbox.dead_letter(key=b"c", value=big, origin=origin, error_class="E", error="why", partition=3)
    assert out.value is not None and len(out.value) < 1000
    ref = orjson.loads(out.value)
    assert ref["bytes"] == len(big) and ref["origin"] == {
        "topic": records.CLUSTER_EVENTS,
        "partition": 3,
        "offset": 42,
        "index": 7,
    }
    headers = dict(out.headers)
    assert headers["value-omitted"] == b"too-large" and headers["origin-index"] == b"7"


@pytest.mark.parametrize(
    ("key", "value_bytes"),
    [
        (b"/" * 400_000, 1_000_000),  # a key percent-encoded in ce_source would triple
        (b"c" * 600_000, 1_000_000),
        (b"k" * (records.VALUE_MAX_BYTES - 100), 10),  # a key that alone nearly fills a record
        (b"c", records.VALUE_MAX_BYTES - 500),  # a value that fits alone, not with its headers
    ],
)
def test_a_dead_letter_with_its_headers_fits_the_record_limit(key: bytes, value_bytes: int) -> None:
    """Review: the size check counted key and value, not the headers; a large key, repeated by the
    CloudEvents attributes, made a record the producer refuses, and the partition crash-looped."""
    origin = Origin(records.CLUSTER_EVENTS, 0, 5)
    out = outbox.dead_letter(
        key=key, value=b"v" * value_bytes, origin=origin, error_class="KeyMismatch", error="why", partition=0
    )
    size = len(out.key or b"") + len(out.value or b"") + sum(len(n) + len(v) for n, v in out.headers)
    assert size <= records.VALUE_MAX_BYTES
    headers = dict(out.headers)
    assert headers["origin-offset"] == b"5"
    if len(key) > 253:  # longer than any cluster name: not repeated in the attributes
        assert headers["ce_source"] == b"/preemptctl" and "ce_partitionkey" not in headers


def test_the_worker_names_its_signing_key_on_every_decision(tmp_path: Path) -> None:
    """The key id set up for the worker (--hmac-key-id) reaches the header of every decision it
    publishes, and each verifies against that key alone, as an actuator holding several keys
    checks it; outbox.decision taking a key id proves nothing if the worker never passes it."""
    import dataclasses

    from streams.common import signing
    from streams.kube import actuator

    key = b"worker-signing-key"
    p = Pipeline(tmp_path)
    p.setup = dataclasses.replace(p.setup, key=key, key_id="k1")
    p.produce(batches(_log(), per_record=7))
    asyncio.run(p.feed())
    sent = p.broker.messages(records.DECISIONS, 0)
    assert sent
    keyring = signing.Keyring({"k0": b"another-key", "k1": key})
    for m in sent:
        assert (signing.KEY_ID_HEADER, b"k1") in tuple(m.headers)
        actuator.verify(m.value, keys=keyring, key_id="k1")


def test_the_session_timeout_reaches_the_consumer_group(tmp_path: Path) -> None:
    from streams.pipeline import app

    built = app.build_app(
        kafka="127.0.0.1:1",
        store_dir=tmp_path,
        config=Config(),
        key=None,
        guarantee="exactly_once",
        session_timeout=17.0,
    )
    assert built.conf.broker_session_timeout == 17.0
    assert built.conf.broker_heartbeat_interval <= 17.0 / 3
    assert built.conf.producer_max_request_size == records.RECORD_MAX_BYTES


def test_a_signed_decision_names_its_key_in_a_header() -> None:
    """The worker's key id travels in a header (the actuator picks the key by it); the value is the
    record unchanged, so the chain and a replay do not depend on which key signed."""
    from schemas import chain
    from streams.common import signing

    record: Any = {"v": 1, "id": "c/1/p", "cluster": "c", "ts": "2026-01-01T00:00:00Z", "preemptor": "d/p"}
    signed = chain.seal(dict(record), chain.GENESIS, b"signing-key")
    sent = outbox.decision(signed, partition=0, key_id="k2")
    assert (signing.KEY_ID_HEADER, b"k2") in sent.headers
    assert sent.value == records.encode(signed)
    unsigned = outbox.decision(chain.seal(dict(record), chain.GENESIS), partition=0, key_id="k2")
    assert signing.KEY_ID_HEADER not in dict(unsigned.headers)
