"""The worker projects what it folds (issue 33 #3): whoever wrote cluster-events, its store, its
snapshots and its decisions hold only what the engine reads.

A producer that writes whole objects (an older source, any other writer) is modelled by the
bundled log dressed as a real API server holds its objects (streams.sim.apiserver), with a
secret-looking value in every field a decision does not read. What is checked is read back
the way an operator would: the store's entries decoded, the latest snapshot's chunks fetched,
checked and decoded, the published decisions.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import projection
from engine.config import Config
from fold import fleet
from fold.controller import Controller
from schemas import VERSION
from streams.kafka import topics
from streams.pipeline import snapshot, store
from streams.pipeline.setup import SnapshotPolicy
from streams.sim import apiserver, simulator, traces
from tests.support import busy_logs, flowgen, gen
from tests.support.memory_pipeline import CLUSTER, Pipeline, batches
from tests.support.unknown_fields import SECRET, objects_with_unknown_fields

SMALL_SNAPSHOTS = SnapshotPolicy(min_events=300, events_per_object=0)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _log(nodes: int = 40) -> list[dict[str, Any]]:
    return simulator.simulate(traces.basic(nodes), Config()).log


def _reference(events: list[Any]) -> list[dict[str, Any]]:
    return [dict(d) for d in fleet.fold(events, Config()).decisions]


def _stored(path: Path) -> list[bytes]:
    """The store's objects, read back (decoded values, not the RocksDB files)."""
    with store.Store(path) as kept:
        state = kept.state()
        assert state is not None
        return [orjson.dumps(orjson.loads(v)) for _, v in kept.entries()] + [orjson.dumps(state)]


def _snapshotted(p: Pipeline) -> tuple[snapshot.Manifest, list[bytes]]:
    """The latest snapshot's manifest, and its state and entries as decoded from its chunks."""
    manifest = asyncio.run(snapshot.latest(p.broker, 0))
    assert manifest is not None
    state, entries = asyncio.run(snapshot.load(p.broker, manifest))
    return manifest, [orjson.dumps(state)] + [orjson.dumps(orjson.loads(v)) for _, v in entries]


def _unread(values: list[bytes]) -> list[bytes]:
    return [v for v in values if SECRET.encode() in v]


# ---- the projection itself ---------------------------------------------------------------------


@SETTINGS
@given(
    st.one_of(gen.clusters(), flowgen.job_clusters(), flowgen.daemonset_clusters()).flatmap(
        lambda raw: st.sampled_from(raw["objects"])
    )
)
def test_projecting_twice_is_projecting_once(obj: dict[str, Any]) -> None:
    """The worker projects records not declared projected; one that was gets the same again."""
    whole = apiserver.dress(obj, secret=SECRET)
    once = projection.project(whole)
    assert projection.project(once) == once
    assert orjson.dumps(projection.project(once)) == orjson.dumps(once)  # key order too: same bytes


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects_with_unknown_fields())
def test_projecting_twice_is_projecting_once_with_unknown_fields(obj: dict[str, Any]) -> None:
    once = projection.project(obj)
    assert projection.project(once) == once


@SETTINGS
@given(busy_logs.busy_logs())
def test_the_controller_projecting_decides_as_on_projections(events: list[dict[str, Any]]) -> None:
    """Folding whole objects with `project` gives the decisions of folding them as they are and
    of folding their projections, byte for byte; and what it would store holds no unread value."""
    whole = apiserver.dress_log(events, secret=SECRET)
    projected = [
        {**e, "object": projection.project(e["object"])} if isinstance(e.get("object"), dict) else e
        for e in whole
    ]
    want = busy_logs.fold(Controller("c", Config()), whole)
    assert busy_logs.fold(Controller("c", Config()), projected) == want
    ctl = Controller("c", Config())
    got: list[Any] = []
    for e in whole:
        ready = ctl.step(e, project=True)
        got += ready.records
        assert not _unread([v for v in ready.dirty.values() if v is not None])
    assert orjson.dumps(got) == orjson.dumps(want)
    assert not _unread([orjson.dumps(p.raw) for p in ctl.cluster.pods.values()])


def test_the_header_says_projected_only_for_this_version() -> None:
    assert projection.declared([(projection.HEADER, str(projection.VERSION).encode())])
    assert not projection.declared([(projection.HEADER, str(projection.VERSION + 1).encode())])
    assert not projection.declared([("other", b"1")])
    assert not projection.declared([])


# ---- the worker ------------------------------------------------------------------------------


def test_a_whole_object_producer_leaves_no_unread_field_in_the_store_or_the_snapshots(
    tmp_path: Path,
) -> None:
    log = _log()
    whole = apiserver.dress_log(log, secret=SECRET)
    recs = batches(whole, per_record=10)
    assert SECRET.encode() in b"".join(v for _, v in recs)
    p = Pipeline(tmp_path / "store", snapshots=SMALL_SNAPSHOTS)
    p.produce(recs)
    asyncio.run(p.run())
    assert p.decisions() == _reference(log)  # the same as replay of the undressed log
    assert p.decisions() == _reference(whole)  # ... and of the dressed one
    assert not p.dead_letters()
    assert not _unread(_stored(tmp_path / "store" / "cluster-events-0"))
    manifest, decoded = _snapshotted(p)
    assert manifest.projection == projection.VERSION
    assert not _unread(decoded)
    assert not _unread([orjson.dumps(d) for d in p.decisions()])  # the explanations neither


def test_a_record_declared_projected_is_taken_as_it_is(tmp_path: Path) -> None:
    """The source's records carry the header: the worker spends nothing projecting them again.
    (So a writer must set it only when it projects with the same list: docs/topics.md.)"""
    log = _log(10)
    whole = apiserver.dress_log(log, secret=SECRET)
    p = Pipeline(tmp_path / "store")
    for key, value in batches(whole, per_record=10):
        p.broker.append(topics.CLUSTER_EVENTS, 0, key, value, ((projection.HEADER, projection.HEADER_VALUE),))
    asyncio.run(p.run())
    assert p.decisions() == _reference(log)
    assert _unread(_stored(tmp_path / "store" / "cluster-events-0"))  # trusted: kept as written


def _whole_store_and_snapshots(monkeypatch: pytest.MonkeyPatch, p: Pipeline, recs: Any) -> None:
    """What a worker before this change left: whole objects in its store and snapshots, no marker."""
    with monkeypatch.context() as m:
        m.setattr(projection, "declared", lambda headers: True)  # it folded objects as written
        m.setattr(store, "_marked", lambda state: orjson.dumps({**state, "layout": store.LAYOUT}))
        p.produce(recs)
        asyncio.run(p.run())
    manifest, decoded = _snapshotted(p)
    assert manifest.projection is None and _unread(decoded)
    assert _unread(_stored(p.store_dir / "cluster-events-0"))


def test_an_old_store_of_whole_objects_is_projected_on_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log()
    whole = apiserver.dress_log(log, secret=SECRET)
    recs = batches(whole, per_record=10)
    p = Pipeline(tmp_path / "store", snapshots=SMALL_SNAPSHOTS)
    half = len(recs) // 2
    _whole_store_and_snapshots(monkeypatch, p, recs[:half])
    old = {int(m.key.split(b"/")[3]) for m in p.broker.messages(topics.SNAPSHOTS) if b"/chunk/" in m.key}
    published = len(p.decisions())
    written = len(p.broker.messages(topics.SNAPSHOTS))
    p.reads.clear()
    p.produce(recs[half:])
    asyncio.run(p.run())
    # Re-projected, not rebuilt: the log before the store's position was not read again.
    assert min(s for t, s in p.reads if t == topics.CLUSTER_EVENTS) > 0
    assert p.decisions() == _reference(log)
    assert len(p.decisions()) > published
    assert not _unread(_stored(tmp_path / "store" / "cluster-events-0"))
    # The first snapshot after it names no whole one as its previous, and tombstones their chunks.
    manifest, decoded = _snapshotted(p)
    assert manifest.projected and (manifest.previous is None or manifest.previous.projected)
    assert not _unread(decoded)
    compacted = {m.key: m.value for m in p.broker.messages(topics.SNAPSHOTS)}  # what compaction keeps
    live = {int(k.split(b"/")[3]) for k, v in compacted.items() if v and k != snapshot.manifest_key(0)}
    assert live <= {manifest.position, manifest.previous and manifest.previous.position}
    assert old and not live & old
    # Every manifest written since names no snapshot of whole objects as its fallback.
    since = [snapshot.parse_manifest(m.value) for m in p.broker.messages(topics.SNAPSHOTS)[written:]
             if m.key == snapshot.manifest_key(0)]  # fmt: skip
    assert since and all(m and (m.previous is None or m.previous.projected) for m in since)


def test_an_old_snapshot_of_whole_objects_is_projected_as_it_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log()
    whole = apiserver.dress_log(log, secret=SECRET)
    recs = batches(whole, per_record=10)
    p = Pipeline(tmp_path / "store", snapshots=SMALL_SNAPSHOTS)
    half = len(recs) // 2
    _whole_store_and_snapshots(monkeypatch, p, recs[:half])
    shutil.rmtree(p.store_dir)  # a new node: the snapshot is all there is
    p.reads.clear()
    p.produce(recs[half:])
    asyncio.run(p.run())
    assert min(s for t, s in p.reads if t == topics.CLUSTER_EVENTS) > 0  # from the snapshot on
    assert p.decisions() == _reference(log)
    assert not _unread(_stored(tmp_path / "store" / "cluster-events-0"))
    manifest, decoded = _snapshotted(p)
    assert manifest.projected and not _unread(decoded)


def test_dead_letters_keep_the_bytes_as_written(tmp_path: Path) -> None:
    """The dead-letter topic keeps what was rejected unchanged (its own retention: docs/topics.md)."""
    pod = apiserver.dress(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "p-uid", "resourceVersion": "1"},
            "spec": {"containers": "not a list"},
            "status": {"phase": "Pending"},
        },
        secret=SECRET,
    )
    event = {"ts": "2026-01-01T00:00:00Z", "type": "ADDED", "object": pod}
    value = orjson.dumps({"v": VERSION, "cluster": CLUSTER, "events": [event]})
    p = Pipeline(tmp_path / "store")
    p.produce([(CLUSTER.encode(), value)])
    asyncio.run(p.run())
    (dead,) = p.dead_letters()
    assert orjson.loads(dead.value) == event


def test_the_source_declares_its_records_projected() -> None:
    from streams.kafka.sink import MemorySink
    from streams.kube.publisher import Publisher

    async def scenario() -> tuple[tuple[str, bytes], ...]:
        sink = MemorySink()
        publisher = Publisher(sink, cluster=CLUSTER)
        task = asyncio.create_task(publisher.run())
        try:
            await publisher.put({"ts": "2026-01-01T00:00:00Z", "type": "TICK"})
            await sink.wait_for(lambda recs: bool(recs), timeout=10)
        finally:
            task.cancel()
        return sink.records[0].headers

    assert projection.declared(asyncio.run(scenario()))
