"""No silent failure (issue 19): every poison record, revoke and restart ends in progress or a loud exit.

On the in-memory broker (tests/support/memory_pipeline.py), each finding of issue 19 that
needs no real broker has its scenario here, compared with `replay` of the same
records (the deterministic reference); the property at the end folds adversarial
records with a restart between every two and asks for byte-identical decisions.
The findings that need Apache Kafka are in tests/chaos/test_chaos.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from engine.config import Config
from fold import fleet
from fold.controller import BadEvent
from schemas import VERSION, records
from streams.kafka import logio, topics
from streams.kafka.memory import MemoryBroker
from streams.pipeline import checkpoint, outbox, recovery, snapshot, store, worker
from streams.pipeline import partitions as partitions_mod
from streams.pipeline import setup as setup_mod
from streams.pipeline.checkpoint import Stalled
from streams.pipeline.partitions import Partitions
from streams.sim import simulator, traces
from tests.support import mixed_logs
from tests.support.memory_pipeline import Pipeline, batches

SMALL_SNAPSHOTS = setup_mod.SnapshotPolicy(min_events=50, events_per_object=0)
TS = "2026-01-01T00:00:00Z"


def _log(nodes: int = 12, cluster: str | None = None) -> list[dict[str, Any]]:
    trace = traces.basic(nodes)
    if cluster is not None:
        trace = [dict(e, cluster=cluster) for e in trace]
    return simulator.simulate(trace, Config()).log


def _replayed(broker: MemoryBroker, partition: int = 0) -> list[bytes]:
    """`replay` of the partition's records: what the worker must have published, byte for byte."""
    events = logio.events_of(broker.messages(records.CLUSTER_EVENTS, partition), topic=records.CLUSTER_EVENTS)
    return [records.encode(d) for d in fleet.fold(events, Config()).decisions]


def _published(broker: MemoryBroker, partition: int = 0) -> list[bytes]:
    return [m.value for m in broker.messages(records.DECISIONS, partition)]


def _nest(depth: int) -> str:
    """A value nested `depth` lists deep, as a placeholder `_record` writes out (orjson would refuse)."""
    return f"@@nest-{depth}@@"


def _number(text: str) -> str:
    """A JSON number written as is (orjson refuses integers beyond 64 bits), as a placeholder."""
    return f"@@num-{text}@@"


def _write(value: Any) -> bytes:
    """JSON of `value`, the placeholders of `_nest` and `_number` written out as what they stand for."""

    def expand(m: re.Match[bytes]) -> bytes:
        if m[1] == b"nest":
            return b"[" * int(m[2]) + b"1" + b"]" * int(m[2])
        return m[2]

    return re.sub(rb'"@@(nest|num)-([0-9eE+.-]+)@@"', expand, orjson.dumps(value))


def _pod(name: str, extra: Any = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"{name}-uid", "resourceVersion": "1"},
        "spec": {"priority": 0, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Pending"},
    }
    if extra is not None:
        pod["spec"]["extra"] = extra
    return pod


def _record(cluster: str, events: list[Any], key: bytes | None = None) -> tuple[bytes | None, bytes]:
    value = _write({"v": VERSION, "cluster": cluster, "events": events})
    return (cluster.encode() if key is None else key), value


def _counter(name: str) -> float:
    return sum(
        s.value for m in REGISTRY.collect() if m.name == name for s in m.samples if s.name.endswith("_total")
    )


# ---- 1: an event nested too deep to encode is dead-lettered, the partition goes on ----------------


def test_an_event_too_deep_to_encode_is_dead_lettered_by_reference(tmp_path: Path) -> None:
    """Issue 19 #1: its dead letter's encoding raised, the agent restarted on it forever."""
    log = _log()
    recs = batches(log, per_record=7)
    deep = {"ts": TS, "type": "ADDED", "object": {"kind": "Pod", "metadata": _nest(300)}}
    p = Pipeline(tmp_path)
    p.produce([recs[0], _record("default", [log[0], deep, log[1]]), *recs[1:]])
    asyncio.run(p.feed())
    assert not p.fatal
    assert _published(p.broker) == _replayed(p.broker)
    (dead,) = p.dead_letters()
    headers = dict(dead.headers)
    assert headers["value-omitted"] == b"unencodable" and headers["origin-index"] == b"1"
    assert orjson.loads(dead.value)["origin"] == {
        "topic": records.CLUSTER_EVENTS,
        "partition": 0,
        "offset": 1,
        "index": 1,
    }


def test_a_dead_letter_that_cannot_be_built_becomes_a_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = outbox.dead_letter
    calls: list[bytes | None] = []

    def failing_once(**kwargs: Any) -> outbox.Outgoing:
        calls.append(kwargs["value"])
        if len(calls) == 1:
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "a header that does not encode")
        return real(**kwargs)

    monkeypatch.setattr(outbox, "dead_letter", failing_once)
    p = Pipeline(tmp_path)
    p.produce([(b"default", b"not json"), *batches(_log(), per_record=7)])
    asyncio.run(p.feed())
    assert not p.fatal
    (dead,) = p.dead_letters()
    assert dict(dead.headers)["error"] == b"UnicodeEncodeError while dead-lettering"
    assert calls == [b"not json", None]  # the fallback carries a reference, not the bytes
    assert _published(p.broker) == _replayed(p.broker)


def test_a_record_that_can_be_neither_folded_nor_dead_lettered_stops_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliver 1: never a loop that looks healthy. The store keeps what was committed before."""

    def broken(**kwargs: Any) -> outbox.Outgoing:
        raise RuntimeError("a bug in the dead-letter path")

    log = _log()
    recs = batches(log, per_record=7)
    p = Pipeline(tmp_path)
    p.produce(recs[:3])
    asyncio.run(p.run())
    before = _counter("preemptctl_worker_stalls")
    monkeypatch.setattr(outbox, "dead_letter", broken)
    p.produce([(b"default", b"not json"), *recs[3:]])
    asyncio.run(p.feed())
    (exc,) = p.fatal
    assert isinstance(exc, Stalled) and "offset 3" in str(exc)
    assert _counter("preemptctl_worker_stalls") == before + 1
    with store.Store(tmp_path / "cluster-events-0") as kept:
        state = kept.state()
        assert state is not None and state["position"] == 2  # nothing after the stall counts


# ---- 2: a valid object too deep to store is rejected with its event, the store stays writable ------


def test_an_object_too_deep_to_store_is_rejected_and_the_store_stays_writable(tmp_path: Path) -> None:
    """Issue 19 #2: the object was folded, then "store write failed" at every commit."""
    log = _log()
    recs = batches(log, per_record=7)
    deep = {"ts": TS, "type": "ADDED", "object": _pod("deep", _nest(records.MAX_OBJECT_DEPTH))}
    failures = _counter("preemptctl_worker_store_write_failures")
    p = Pipeline(tmp_path)
    p.produce([recs[0], _record("default", [deep]), *recs[1:]])
    asyncio.run(p.feed())
    assert not p.fatal
    assert _counter("preemptctl_worker_store_write_failures") == failures
    (dead,) = p.dead_letters()
    assert dict(dead.headers)["error-class"] == b"ObjectTooDeep"
    assert _published(p.broker) == _replayed(p.broker)
    with store.Store(tmp_path / "cluster-events-0") as kept:
        state = kept.state()
        assert state is not None and state["position"] == len(recs)


def test_the_deepest_object_the_store_can_write_is_taken() -> None:
    def parsed(depth: int) -> Any:
        return orjson.loads(_write(_pod("p", _nest(depth))))

    assert records.encode_object(parsed(records.MAX_OBJECT_DEPTH - 2))  # the pod's own levels: 2
    with pytest.raises(records.ObjectTooDeep):
        records.encode_object(parsed(records.MAX_OBJECT_DEPTH - 1))


def test_a_store_that_cannot_be_written_stops_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(self: store.Store, *args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.Store, "write", full_disk)
    p = Pipeline(tmp_path)
    p.produce(batches(_log(), per_record=1))  # a commit per record: more than STORE_WRITE_ATTEMPTS
    monkeypatch.setattr(checkpoint, "CHECKPOINT_MAX_RECORDS", 1)
    asyncio.run(p.feed())
    (exc,) = p.fatal
    assert isinstance(exc, Stalled) and "store writes failed in a row" in str(exc)


# ---- 3: a revoked worker continues in memory only when nobody published since --------------------


def _paused_pair(
    tmp_path: Path,
) -> tuple[list[tuple[bytes, bytes]], int, MemoryBroker, Pipeline, Pipeline, list[float]]:
    """A log in two halves, and workers A and B at least once on one broker, with A's clock."""
    recs = batches(_log(20), per_record=5)
    broker = MemoryBroker()
    a = Pipeline(tmp_path / "a", broker=broker, transactional=False)
    b = Pipeline(tmp_path / "b", broker=broker, transactional=False)
    return recs, len(recs) // 2, broker, a, b, [0.0]


async def _opened(parts: Partitions) -> None:
    while parts.opening:
        await asyncio.gather(*parts.opening.values())


@pytest.mark.parametrize("transactional", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_paused_worker_given_its_partition_back_publishes_nothing_twice(
    tmp_path: Path, transactional: bool
) -> None:
    """Issue 19 #3: A is paused and revoked, B takes the partition, publishes and leaves; A returns."""
    log = _log(20)
    recs = batches(log, per_record=5)
    third = len(recs) // 3
    broker = MemoryBroker()
    a = Pipeline(tmp_path / "a", broker=broker, transactional=transactional)
    b = Pipeline(tmp_path / "b", broker=broker, transactional=transactional)

    async def scenario() -> None:
        pa = Partitions(a.setup, on_fatal=a.fatal.append)
        a.produce(recs[:third])
        await pa.assign([0])
        await _opened(pa)
        await pa.revoke([0])  # A's session ran out while it was paused
        b.produce(recs[third : 2 * third])
        pb = Partitions(b.setup, on_fatal=b.fatal.append)
        await pb.assign([0])
        await _opened(pb)  # B folds and publishes what A has not seen
        await pb.close()  # ... and leaves: the partition goes back to A
        a.produce(recs[2 * third :])
        await pa.assign([0])
        for m in broker.messages(records.CLUSTER_EVENTS):
            await pa.handle(0, m.offset, m.key, m.value)
        await pa.close()

    asyncio.run(scenario())
    assert not a.fatal and not b.fatal
    assert _published(broker) == _replayed(broker)  # none lost, none doubled, same bytes


@pytest.mark.parametrize("transactional", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_worker_given_its_partition_back_untouched_continues_in_memory(
    tmp_path: Path, transactional: bool
) -> None:
    recs = batches(_log(20), per_record=5)
    p = Pipeline(tmp_path, transactional=transactional)

    async def scenario() -> None:
        parts = Partitions(p.setup, on_fatal=p.fatal.append)
        p.produce(recs[: len(recs) // 2])
        await parts.assign([0])
        await _opened(parts)
        kept = parts.workers[0]
        await parts.revoke([0])
        await parts.assign([0])  # nobody owned it meanwhile
        await _opened(parts)
        assert parts.workers[0] is kept
        p.produce(recs[len(recs) // 2 :])
        for m in p.broker.messages(records.CLUSTER_EVENTS):
            await parts.handle(0, m.offset, m.key, m.value)
        await parts.close()

    resumed = _counter("preemptctl_worker_resumed")
    asyncio.run(scenario())
    assert _counter("preemptctl_worker_resumed") == resumed + 1
    assert _published(p.broker) == _replayed(p.broker)


# ---- 4, 5: cluster names, one rule everywhere; prefix-free store keys -----------------------------


def test_a_cluster_whose_name_prefixes_another_keeps_its_own_objects_after_a_restart(tmp_path: Path) -> None:
    """Issue 19 #4: `obj/a/` matched cluster `a/b`'s keys: after a restart `a` decided on `a/b`'s nodes."""
    small, large = _log(8, "a"), _log(30, "a/b")
    p = Pipeline(tmp_path)
    first = [*batches(large, cluster="a/b", per_record=50), *batches(small[: len(small) // 2], cluster="a")]
    p.produce(first)
    asyncio.run(p.run())  # the store now holds both clusters
    p.produce(batches(small[len(small) // 2 :], cluster="a"))
    asyncio.run(p.run())  # restored from the store, then folds a's rest
    assert _published(p.broker) == _replayed(p.broker)
    with store.Store(tmp_path / "cluster-events-0") as kept:
        nodes_of_a = {o["metadata"]["name"] for o in kept.objects("a") if o["kind"] == "Node"}
        assert nodes_of_a == _node_names(small)


def _node_names(log: list[dict[str, Any]]) -> set[str]:
    return {e["object"]["metadata"]["name"] for e in log if e.get("object", {}).get("kind") == "Node"}


def _old_layout(path: Path, clusters: dict[str, list[dict[str, Any]]]) -> None:
    """A store as the old code wrote it: `obj/<cluster>/<Kind>/<key>`, the name unescaped, no layout."""
    from rocksdict import Options, Rdict

    from fold.controller import Controller

    db = Rdict(str(path), Options(raw_mode=True))
    states = {}
    for name, log in clusters.items():
        ctl = Controller(name, Config())
        dirty: dict[str, bytes | None] = {}
        for e in log:
            dirty.update(ctl.step(e).dirty)
        for key, value in dirty.items():
            if value is not None:
                db[f"obj/{name}/{key}".encode()] = value
        states[name] = ctl.state()
    db[b"meta/state"] = orjson.dumps({"position": 0, "fingerprint": "", "clusters": states})
    db.close()


def test_an_old_layout_store_is_migrated_when_its_clusters_can_be_told_apart(tmp_path: Path) -> None:
    a, b = _log(8, "a"), _log(9, "b/c")
    path = tmp_path / "s"
    path.mkdir()
    _old_layout(path, {"a": a, "b/c": b})
    with store.Store(path) as s:
        s.migrated()
        assert {o["metadata"]["name"] for o in s.objects("b/c") if o["kind"] == "Node"} == _node_names(b)
        state = s.state()
        assert state is not None and state["layout"] == store.LAYOUT


def test_an_old_layout_store_of_prefix_sharing_clusters_is_discarded(tmp_path: Path) -> None:
    a, ab = _log(8, "a"), _log(9, "a/b")
    path = tmp_path / "s"
    path.mkdir()
    _old_layout(path, {"a": a, "a/b": ab})
    with store.Store(path) as s, pytest.raises(store.Unmigratable):
        s.migrated()


def test_an_empty_cluster_name_is_rejected_by_every_stage(tmp_path: Path) -> None:
    """Issue 19 #5: key b"" gave decision ids "/4/uid" in the worker and "default/4/uid" in replay."""
    log = _log()
    p = Pipeline(tmp_path)
    p.produce([_record("", log[:40]), *batches(log, per_record=9)])
    asyncio.run(p.feed())
    (dead,) = p.dead_letters()
    assert dict(dead.headers)["error"] == b"empty cluster name"
    assert _published(p.broker) == _replayed(p.broker)
    with pytest.raises(BadEvent, match="empty cluster name"):
        fleet.Fleet(Config()).step(dict(log[0], cluster=""))


@pytest.mark.parametrize("name", ["", "x" * 254, "é" * 127, "a\nb", "tab\there"])
def test_invalid_cluster_names(name: str) -> None:
    assert records.cluster_problem(name)


@pytest.mark.parametrize("name", ["a", "a/b", "a%2Fb", "arn:aws:eks:eu-west-1:1:cluster/prod", "x" * 253])
def test_valid_cluster_names_get_prefix_free_keys(name: str) -> None:
    assert records.cluster_problem(name) is None
    others = ["a", "a/b", "a%2Fb", "a%", "a/"]
    for other in others:
        if other != name:
            assert not store.cluster_prefix(other).startswith(store.cluster_prefix(name))


# ---- 6: a garbage snapshot manifest is passed over ----------------------------------------------------


@pytest.mark.parametrize("with_store", [True, False], ids=["store", "no-store"])
def test_garbage_snapshot_manifests_are_passed_over(tmp_path: Path, with_store: bool) -> None:
    """Issue 19 #6: a garbage record under the manifest key kept the partition offline for good."""
    log = _log(30)
    recs = batches(log, per_record=10)
    p = Pipeline(tmp_path, snapshots=SMALL_SNAPSHOTS)
    p.produce(recs[: len(recs) // 2])
    asyncio.run(p.run())
    good = asyncio.run(snapshot.latest(p.broker, 0))
    assert good is not None
    manifest = dict(good.to_json())
    for garbage in (
        b"not json",
        b"[]",
        orjson.dumps({**manifest, "position": "x"}),
        orjson.dumps({**manifest, "chunks": [{"offset": -1, "sha256": "0"}]}),
        orjson.dumps({**manifest, "partition": 5}),
    ):
        p.broker.append(topics.SNAPSHOTS, 0, snapshot.manifest_key(0), garbage)
    assert asyncio.run(snapshot.latest(p.broker, 0)) == good
    if not with_store:
        shutil.rmtree(tmp_path / "cluster-events-0")
    p.produce(recs[len(recs) // 2 :])
    asyncio.run(p.feed())
    assert not p.fatal
    assert _published(p.broker) == _replayed(p.broker)


def test_a_snapshot_whose_state_does_not_decode_falls_back_to_the_previous(tmp_path: Path) -> None:
    log = _log(30)
    recs = batches(log, per_record=10)
    p = Pipeline(tmp_path, snapshots=SMALL_SNAPSHOTS)
    p.produce(recs[: len(recs) // 2])
    asyncio.run(p.run())
    good = asyncio.run(snapshot.latest(p.broker, 0))
    assert good is not None
    # A manifest whose one chunk has the right key and digest but is not zlib: a writer's bug.
    junk = b"\x00garbage"
    position = good.position + 1
    offset = p.broker.append(topics.SNAPSHOTS, 0, snapshot.chunk_key(0, position, 0), junk)
    bad = snapshot.Manifest(
        0, position, (snapshot.Chunk(offset, hashlib.sha256(junk).hexdigest()),), good.alone()
    )
    p.broker.append(topics.SNAPSHOTS, 0, snapshot.manifest_key(0), orjson.dumps(bad.to_json()))
    shutil.rmtree(tmp_path / "cluster-events-0")
    skipped = _counter("preemptctl_worker_unreadable_snapshots")
    p.produce(recs[len(recs) // 2 :])
    asyncio.run(p.feed())
    assert not p.fatal
    assert _counter("preemptctl_worker_unreadable_snapshots") == skipped + 1
    assert _published(p.broker) == _replayed(p.broker)


# ---- 9: tombstones and oversized envelopes -------------------------------------------------------------


def test_a_record_without_value_is_dead_lettered(tmp_path: Path) -> None:
    """Issue 19 #9: a key with no value crashed the processing loop (len(None))."""
    p = Pipeline(tmp_path)
    recs = batches(_log(), per_record=9)

    async def scenario() -> None:
        parts = Partitions(p.setup, on_fatal=p.fatal.append)
        await parts.assign([0])
        await parts.handle(0, 0, b"default", None)  # as faust hands a tombstone over
        for n, (key, value) in enumerate(recs, 1):
            await parts.handle(0, n, key, value)
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal
    (dead,) = p.dead_letters()
    assert dead.value == b"" and dict(dead.headers)["error"] == b"the record has no value (a tombstone)"
    assert len(p.decisions()) == len(fleet.fold(_log(), Config()).decisions)


def test_a_record_with_too_many_events_is_dead_lettered_whole(tmp_path: Path) -> None:
    """Issue 19 #9: 100,000 invalid events cost ~10 s and 100,000 dead letters."""
    p = Pipeline(tmp_path)
    log = _log()
    many = [{"ts": TS, "type": "BOGUS"}] * (records.MAX_EVENTS_PER_RECORD + 1)
    p.produce([_record("default", many), *batches(log, per_record=9)])
    asyncio.run(p.feed())
    (dead,) = p.dead_letters()
    assert dict(dead.headers)["error-class"] == b"DecodeError" and "origin-index" not in dict(dead.headers)
    assert _published(p.broker) == _replayed(p.broker)


# ---- the property: adversarial records, restarts between them, decisions byte-identical to replay ----

CLUSTERS = ("default", "a", "a/b", "a%2Fb", "", "a/")


def _adversarial_event(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["deep", "deep-object", "huge-number", "quantity", "long-name", "junk"]))
    if kind == "deep":
        return draw(st.sampled_from([_nest(300), {"ts": TS, "type": "TICK", "x": _nest(260)}]))
    if kind == "deep-object":
        return {"ts": TS, "type": "ADDED", "object": _pod("deep", _nest(draw(st.integers(250, 400))))}
    if kind == "huge-number":
        pod = _pod("huge")
        pod["spec"]["priority"] = _number(draw(st.sampled_from(["1" + "0" * 30, "-1e400", "1e308", "2e63"])))
        return {"ts": TS, "type": "ADDED", "object": pod}
    if kind == "quantity":
        pod = _pod("q")
        quantity = draw(
            st.sampled_from(["1e20000000", "1e999999999", "9" * 70, "8Ei", "-1e-200", _number("1e25")])
        )
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = quantity
        return {"ts": TS, "type": "ADDED", "object": pod}
    if kind == "long-name":
        pod = _pod("n")
        pod["metadata"]["uid"] = "u" * draw(st.sampled_from([254, 5000]))
        return {"ts": TS, "type": "ADDED", "object": pod}
    return draw(st.sampled_from(mixed_logs.garbage(TS)))


@st.composite
def adversarial_records(draw: st.DrawFn) -> list[tuple[bytes | None, bytes]]:
    """Records of good logs for clusters with prefix-sharing and invalid names, with poison in between."""
    logs = {c: iter(draw(mixed_logs.good_logs())) for c in draw(st.sets(st.sampled_from(CLUSTERS)))}
    out: list[tuple[bytes | None, bytes]] = []
    for _ in range(draw(st.integers(1, 10))):
        shape = draw(st.sampled_from(["good", "good", "mixed", "bytes", "tombstone", "wrong-key"]))
        if shape == "bytes":
            out.append(
                (b"a", draw(st.sampled_from([b"\xff\xfe\x00", b'{"v":1,"cluster":"a","events":[\xff]}'])))
            )
            continue
        if shape == "tombstone":
            out.append((draw(st.sampled_from([b"a", b"", None])), b""))
            continue
        if not logs:
            continue
        cluster = draw(st.sampled_from(sorted(logs)))
        events: list[Any] = [e for _, e in zip(range(draw(st.integers(0, 8))), logs[cluster], strict=False)]
        if shape == "mixed":
            for _ in range(draw(st.integers(1, 3))):
                events.insert(draw(st.integers(0, len(events))), _adversarial_event(draw))
        key, value = _record(cluster, events)
        out.append((b"other" if shape == "wrong-key" else key, value))
    return out


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(recs=adversarial_records(), lose_store=st.lists(st.booleans(), min_size=10, max_size=10))
def test_adversarial_records_with_restarts_between_give_the_replayed_decisions(
    tmp_path_factory: pytest.TempPathFactory, recs: list[tuple[bytes | None, bytes]], lose_store: list[bool]
) -> None:
    """Acceptance: no event of any shape, size or nesting, in any place, stops a partition."""
    p = Pipeline(tmp_path_factory.mktemp("store"), snapshots=SMALL_SNAPSHOTS)
    for n, rec in enumerate(recs):
        p.produce([rec])
        if lose_store[n % len(lose_store)]:
            shutil.rmtree(p.store_dir / "cluster-events-0", ignore_errors=True)  # the pod lost its disk
        asyncio.run(p.run())  # a restart: open from the store or a snapshot, fold to the end, close
        assert not p.fatal, p.fatal
    assert _published(p.broker) == _replayed(p.broker)


# ---- 7: a partition that exists but that no worker of the group owns ------------------------------


def _member(topic: str, partitions: list[int]) -> tuple[str, str, str, bytes, bytes]:
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    assignment = ConsumerProtocolMemberAssignment(0, [(topic, partitions)], b"").encode()
    return ("m", "c", "/127.0.0.1", b"", assignment)


def test_unowned_partitions_are_those_in_no_members_assignment() -> None:
    from streams.kafka import ownership

    topic = records.CLUSTER_EVENTS
    group = [(0, "g", "Stable", "consumer", "faust", [_member(topic, [0, 2]), _member("other", [1])])]
    assert ownership.unowned_of({0, 1, 2, 3}, group, group="g", topic=topic) == {1, 3}
    assert ownership.unowned_of(
        {0, 1}, [(0, "g", "Stable", "consumer", "faust", [])], group="g", topic=topic
    ) == {
        0,
        1,
    }
    rebalancing = [(0, "g", "PreparingRebalance", "consumer", "faust", [])]
    assert ownership.unowned_of({0}, rebalancing, group="g", topic=topic) is None
    # Every member left (a consumer whose logins are refused never rejoins): nobody owns them.
    left = [(0, "g", "Empty", "consumer", "", [])]
    assert ownership.unowned_of({0, 1}, left, group="g", topic=topic) == {0, 1}
    # Never joined (how tansu describes a group before its first member): unknown.
    assert ownership.unowned_of({0}, [(0, "g", "Empty", "", "", [])], group="g", topic=topic) is None


def test_an_unowned_partition_makes_the_worker_unready_then_stops_it(tmp_path: Path) -> None:
    """Issue 19 #7: the topic re-created under the group left every worker ready with nothing to do."""
    from streams.common.health import Health

    p = Pipeline(tmp_path)
    health = Health("worker")
    parts = Partitions(p.setup, health=health, on_fatal=p.fatal.append)
    asyncio.run(parts.assign([]))  # the assignment after the topic was deleted
    assert health.ready
    parts.owners_seen(None, now=0.0)  # rebalancing: nothing to say yet
    assert health.ready
    parts.owners_seen({0}, now=1.0)  # the topic is back, its partition in nobody's assignment
    assert not health.ready and not p.fatal
    parts.owners_seen({0}, now=1.0 + partitions_mod.UNOWNED_GRACE_S - 1)
    assert not p.fatal
    parts.owners_seen({0}, now=1.0 + partitions_mod.UNOWNED_GRACE_S)
    (exc,) = p.fatal
    assert isinstance(exc, Stalled) and "no owner in the group" in str(exc)


def test_an_owned_partition_again_makes_the_worker_ready(tmp_path: Path) -> None:
    from streams.common.health import Health

    p = Pipeline(tmp_path)
    health = Health("worker")
    parts = Partitions(p.setup, health=health, on_fatal=p.fatal.append)
    asyncio.run(parts.assign([]))
    parts.owners_seen({0}, now=1.0)
    parts.owners_seen(set(), now=2.0)  # another worker took it
    parts.owners_seen({0}, now=2.0 + partitions_mod.UNOWNED_GRACE_S)  # a new episode starts here
    assert not p.fatal and not health.ready


def test_a_process_that_did_not_run_for_a_session_timeout_folds_nothing_before_its_next_assignment(
    tmp_path: Path,
) -> None:
    """At least once has no fencing: resumed, A's consumer still hands it records B has folded."""
    recs, half, broker, a, b, now = _paused_pair(tmp_path)

    async def scenario() -> None:
        pa = Partitions(a.setup, on_fatal=a.fatal.append, session_timeout_s=6.0, clock=lambda: now[0])
        a.produce(recs[:half])
        await pa.assign([0])
        for m in broker.messages(records.CLUSTER_EVENTS):
            await pa.handle(0, m.offset, m.key, m.value)
        now[0] += 30.0  # SIGSTOP: the group moves on without A
        b.produce(recs[half:])
        pb = Partitions(b.setup, on_fatal=b.fatal.append)
        await pb.assign([0])
        await _opened(pb)
        await pb.close()
        for m in broker.messages(records.CLUSTER_EVENTS)[half:]:  # what A's consumer fetches on waking
            await pa.handle(0, m.offset, m.key, m.value)
        assert not pa.workers
        await pa.assign([0])  # the rebalance gives the partition back
        await _opened(pa)
        await pa.close()

    asyncio.run(scenario())
    assert _published(broker) == _replayed(broker)


def test_the_group_lag_counts_an_offset_committed_past_the_end_as_nothing_done() -> None:
    """Issue 19 #7: after the topic was re-created the group's old offset hid the new log's lag."""
    from aiokafka import TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    from streams.kafka import lag

    topic = records.CLUSTER_EVENTS
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

    class Admin:
        async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
            return [{"topic": topic, "error_code": 0, "partitions": [{"partition": 0}, {"partition": 1}]}]

        async def list_consumer_group_offsets(self, group: str, partitions: Any) -> dict[Any, Any]:
            # Partition 0: committed on the old topic, far past the new log's end. 1: caught up.
            return {tps[0]: OffsetAndMetadata(5000, ""), tps[1]: OffsetAndMetadata(40, "")}

    class Consumer:
        async def end_offsets(self, partitions: Any) -> dict[Any, int]:
            return {tps[0]: 120, tps[1]: 40}

        async def beginning_offsets(self, partitions: Any) -> dict[Any, int]:
            return {tps[0]: 0, tps[1]: 0}

    measured = asyncio.run(lag.measure(Admin(), Consumer(), group="g", topic=topic))  # type: ignore[arg-type]
    assert measured == {0: 120, 1: 0}


def test_an_assignment_during_a_revoke_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on Kafka: a worker resumed after a pause revoked its partition itself while the
    rebalance assigned it again; the assignment opened a second store on the same directory."""
    monkeypatch.setattr(partitions_mod, "REOPEN_ATTEMPTS", 1)
    recs = batches(_log(20), per_record=5)
    p = Pipeline(tmp_path)
    p.produce(recs)
    slow = asyncio.Event()

    async def scenario() -> None:
        parts = Partitions(p.setup, on_fatal=p.fatal.append)
        await parts.assign([0])
        await _opened(parts)
        real = parts._output_ends

        async def output_ends(partition: int) -> tuple[int, ...]:
            await slow.wait()  # the revoke is reading the output ends when the assignment comes
            return await real(partition)

        monkeypatch.setattr(parts, "_output_ends", output_ends)
        revoking = asyncio.create_task(parts.revoke([0]))
        await asyncio.sleep(0.01)
        assigning = asyncio.create_task(parts.assign([0]))
        await asyncio.sleep(0.01)
        slow.set()
        await asyncio.gather(revoking, assigning)
        await _opened(parts)
        for m in p.broker.messages(records.CLUSTER_EVENTS):
            await parts.handle(0, m.offset, m.key, m.value)
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal, p.fatal
    assert _published(p.broker) == _replayed(p.broker)


def test_a_revoke_right_after_a_pause_keeps_nothing_in_memory(tmp_path: Path) -> None:
    """The rebalance may reach a resumed worker before any record does: its revoke would read
    output ends that already hold the other worker's records, and take them for its own."""
    recs, half, broker, a, b, now = _paused_pair(tmp_path)

    async def scenario() -> None:
        pa = Partitions(a.setup, on_fatal=a.fatal.append, session_timeout_s=6.0, clock=lambda: now[0])
        a.produce(recs[:half])
        await pa.assign([0])
        await _opened(pa)
        now[0] += 30.0  # paused; the group moves on
        b.produce(recs[half:])
        pb = Partitions(b.setup, on_fatal=b.fatal.append)
        await pb.assign([0])
        await _opened(pb)
        await pb.close()
        await pa.revoke([0])  # resumed: the rebalance comes first
        assert not pa.suspended
        await pa.assign([0])
        await _opened(pa)
        for m in broker.messages(records.CLUSTER_EVENTS):
            await pa.handle(0, m.offset, m.key, m.value)
        await pa.close()

    asyncio.run(scenario())
    assert _published(broker) == _replayed(broker)


def _recreate(broker: MemoryBroker, topic: str = records.CLUSTER_EVENTS) -> None:
    """The topic deleted and created again: a new log from offset 0."""
    from streams.kafka.memory import _Log

    broker._logs[(topic, 0)] = _Log()


@pytest.mark.parametrize("revoked", [True, False], ids=["revoked-and-given-back", "held-throughout"])
def test_a_cluster_events_topic_recreated_under_the_worker_is_folded_from_its_start(
    tmp_path: Path, revoked: bool
) -> None:
    """Seen on Kafka: given the re-created topic's partition back, the worker took its old position
    for the new log's and skipped every record below it."""
    old, new = _log(8, "old"), _log(20, "new")
    p = Pipeline(tmp_path)

    async def scenario() -> None:
        parts = Partitions(p.setup, on_fatal=p.fatal.append)
        p.produce(batches(old, cluster="old", per_record=3))
        await parts.assign([0])
        await _opened(parts)
        if revoked:
            await parts.revoke([0])
        _recreate(p.broker)
        p.produce(batches(new, cluster="new", per_record=3))
        if revoked:
            await parts.assign([0])
        else:
            await parts.check_logs()  # the periodic check beside the ownership one
        await _opened(parts)
        for m in p.broker.messages(records.CLUSTER_EVENTS):
            await parts.handle(0, m.offset, m.key, m.value)
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal
    published_new = [v for v in _published(p.broker) if orjson.loads(v)["cluster"] == "new"]
    assert published_new == _replayed(p.broker)


def test_a_busy_event_loop_is_not_taken_for_a_stopped_process() -> None:
    """faust heartbeats from its consumer thread: a loop busy for 30 s keeps its membership, and
    closing its partitions then would leave them closed with no rebalance to reopen them."""
    from streams.pipeline.pauses import Pauses

    now = [0.0]
    pauses = Pauses(clock=lambda: now[0], start=False)
    for _ in range(60):  # the thread keeps waking while the loop is busy
        now[0] += 0.5
        pauses.tick()
    assert not pauses.stopped(0.0, at_least=6.0)
    now[0] += 20.0  # SIGSTOP: nothing runs
    assert pauses.stopped(0.0, at_least=6.0)  # the loop asks before the thread woke up
    pauses.tick()
    now[0] += 0.5
    pauses.tick()
    assert pauses.stopped(25.0, at_least=6.0)
    assert not pauses.stopped(51.0, at_least=6.0)  # that stop ended before `since`


def test_a_worker_whose_loop_was_busy_keeps_its_partitions(tmp_path: Path) -> None:
    from streams.pipeline.pauses import Pauses

    recs = batches(_log(20), per_record=5)
    p = Pipeline(tmp_path)
    p.produce(recs)
    now = [0.0]
    pauses = Pauses(clock=lambda: now[0], start=False)

    async def scenario() -> None:
        parts = Partitions(
            p.setup, on_fatal=p.fatal.append, session_timeout_s=6.0, pauses=pauses, clock=lambda: now[0]
        )
        await parts.assign([0])
        await _opened(parts)
        for _ in range(60):
            now[0] += 0.5
            pauses.tick()
        for m in p.broker.messages(records.CLUSTER_EVENTS):
            await parts.handle(0, m.offset, m.key, m.value)
        assert 0 in parts.workers
        await parts.close()

    asyncio.run(scenario())
    assert _published(p.broker) == _replayed(p.broker)


def test_a_broker_that_does_not_report_assignments_says_nothing_about_ownership() -> None:
    """The embedded tansu describes members without their assignments: that is not "nobody owns it"
    (every worker on it was taken for orphaned, then stopped)."""
    from streams.kafka import ownership

    silent = [(0, "g", "Stable", "consumer", "", [("m", "c", "/127.0.0.1", b"", b"")])]
    assert ownership.unowned_of({0}, silent, group="g", topic=records.CLUSTER_EVENTS) is None


def test_after_a_pause_the_group_kept_the_partitions_are_reopened(tmp_path: Path) -> None:
    """A broker may keep a paused member (tansu did, in test_prometheus): no rebalance comes, and
    the partitions closed at the wake-up must not stay closed."""
    recs = batches(_log(20), per_record=5)
    half = len(recs) // 2
    p = Pipeline(tmp_path)
    now = [0.0]

    async def scenario() -> None:
        parts = Partitions(p.setup, on_fatal=p.fatal.append, session_timeout_s=6.0, clock=lambda: now[0])
        p.produce(recs[:half])
        await parts.assign([0])
        await _opened(parts)
        now[0] += 30.0  # paused
        await parts.tick()  # woke up: closed
        assert not parts.workers and not parts.opening
        for _ in range(22):  # the commit timer ticks on; no rebalance comes
            now[0] += 0.5
            await parts.tick()
        assert not parts.workers and not parts.opening  # 11 s: not yet
        for _ in range(4):
            now[0] += 0.5
            await parts.tick()  # two session timeouts without a rebalance: ours after all
        await _opened(parts)
        assert 0 in parts.workers
        p.produce(recs[half:])
        for m in p.broker.messages(records.CLUSTER_EVENTS):
            await parts.handle(0, m.offset, m.key, m.value)
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal
    assert _published(p.broker) == _replayed(p.broker)


@pytest.mark.parametrize("kafka_says", ["away", "answers"])
def test_opening_while_kafka_is_away_is_retried_without_counting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kafka_says: str
) -> None:
    """Issue 20: a partition's reopen attempts count only while Kafka answers. Opening fails
    three times REOPEN_ATTEMPTS in a row: while Kafka does not answer (Setup.unreachable gives a
    reason) the worker waits it out and then folds everything once; while Kafka answers, the
    same failures end in the fatal exit after REOPEN_ATTEMPTS tries, as before."""
    from aiokafka.errors import KafkaConnectionError

    monkeypatch.setattr(partitions_mod, "REOPEN_BACKOFF_S", 0.0)
    monkeypatch.setattr(partitions_mod, "REOPEN_BACKOFF_MAX_S", 0.0)
    outage = 3 * partitions_mod.REOPEN_ATTEMPTS
    p = Pipeline(tmp_path)
    p.produce(batches(_log(20), per_record=5))
    failed = [0]
    real_open = recovery.open

    async def open_(*, partition: int, setup: setup_mod.Setup) -> worker.PartitionWorker:
        if failed[0] < outage:
            failed[0] += 1
            raise KafkaConnectionError("connection refused")
        return await real_open(partition=partition, setup=setup)

    async def unreachable() -> str | None:
        return "connection refused" if kafka_says == "away" and failed[0] < outage else None

    monkeypatch.setattr(recovery, "open", open_)
    p.setup = dataclasses.replace(p.setup, unreachable=unreachable)
    asyncio.run(p.feed())
    if kafka_says == "away":
        assert not p.fatal and failed[0] == outage
        assert _published(p.broker) == _replayed(p.broker)
    else:
        (fatal,) = p.fatal
        assert "could not be opened" in str(fatal) and failed[0] == partitions_mod.REOPEN_ATTEMPTS
