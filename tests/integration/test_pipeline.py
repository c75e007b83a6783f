"""The pipeline end to end on real brokers: the embedded tansu and Apache Kafka.

Each scenario computes the expected decision log offline (replay --simulate,
the deterministic reference) and requires the worker, through the broker, to
produce exactly that log: byte-identical records, no decision lost or doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from engine.config import Config
from fold import fleet
from schemas import records
from streams.brokers import embedded
from streams.brokers.process import free_loopback_port
from streams.kafka import topics as kafka_topics
from streams.sim import simulator, traces
from streams.sim.run import Run, start_worker, stop_worker
from tests.integration import pipeline


def _cluster() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def _expected(trace: list[dict[str, Any]], cluster: str) -> fleet.Result:
    return simulator.simulate(pipeline.with_cluster(trace, cluster), Config())


def test_examples_1_to_4_through_run(broker: str, tmp_path: Path) -> None:
    """`preemptctl run`'s loop on each broker: the seed's four stories, identical to replay --simulate."""
    cluster = _cluster()
    trace = pipeline.with_cluster(traces.example(), cluster)
    asyncio.run(pipeline.produce(broker, cluster, []))  # creates the topics before the worker subscribes
    worker = start_worker(["--bootstrap-server", broker], tmp_path, None, None)
    try:
        run = Run(kafka=broker, trace=trace, config=Config(), key=None)
        asyncio.run(run.play(until_idle=True, decisions_out=tmp_path / "d.jsonl"))
    finally:
        stop_worker(worker)
    want = _expected(traces.example(), cluster).decisions
    assert (tmp_path / "d.jsonl").read_bytes() == b"".join(orjson.dumps(d) + b"\n" for d in want)
    # The log run wrote to cluster-events, read back from the topic, replays to the same decisions.
    from streams.kafka import logio

    written = [
        e for e in logio.read_events(f"kafka://{broker}/preemption.cluster-events") if e["cluster"] == cluster
    ]
    assert fleet.fold(written, Config()).decisions == want
    story = [
        (
            d["preemptor"],
            d["outcome"],
            d.get("node"),
            sorted((v["name"], bool(v.get("terminating"))) for v in d["victims"]),
        )
        for d in run.decisions
    ]
    assert story == [
        ("default/ex1-c", "preempt", "ex1-node", [("ex1-a", False), ("ex1-b", False)]),
        ("default/ex1-d", "unschedulable", None, []),  # C's nomination holds the room (Example 1)
        ("default/ex2-c", "preempt", "ex2-node", [("ex2-a", False), ("ex2-b", False)]),
        (
            "default/ex2-e",
            "preempt",
            "ex2-node",
            [("ex2-a", True), ("ex2-b", True)],
        ),  # takes over (Example 2)
        ("default/ex2-c", "unschedulable", None, []),
        (
            "default/ex3-c",
            "preempt",
            "ex3-node-1",
            [("ex3-a", False), ("ex3-b", False)],
        ),  # D fits elsewhere (Example 3)
        ("default/ex4-c", "preempt", "ex4-node", [("ex4-a", False), ("ex4-b", False)]),
        ("default/ex4-f", "unschedulable", None, []),  # a lower priority cannot take over (Example 4)
    ]


def test_basic_200_nodes_one_decision_per_preemptor(broker: str, tmp_path: Path) -> None:
    cluster = _cluster()
    expected = _expected(traces.basic(200), cluster)
    asyncio.run(pipeline.produce(broker, cluster, expected.log, per_record=100))
    worker = pipeline.start_worker(broker, tmp_path / "store", f"g-{cluster}")
    try:
        got = asyncio.run(pipeline.wait_for_decisions(broker, cluster, len(expected.decisions)))
    finally:
        pipeline.stop(worker)
    assert got == expected.decisions
    preempts = [d for d in got if d["outcome"] == "preempt"]
    assert len(preempts) == 200 == len({d["preemptor"] for d in preempts})
    assert len({d["node"] for d in preempts}) == 200
    victims = [v["uid"] for d in preempts for v in d["victims"]]
    assert len(victims) == 600 == len(set(victims))
    assert all(len(d["victims"]) == 3 and {v["node"] for v in d["victims"]} == {d["node"]} for d in preempts)


def test_replay_of_the_topic_reproduces_the_decisions(tansu_broker: str, tmp_path: Path) -> None:
    cluster = _cluster()
    expected = _expected(traces.example(), cluster)
    asyncio.run(pipeline.produce(tansu_broker, cluster, expected.log, per_record=7))
    worker = pipeline.start_worker(tansu_broker, tmp_path / "store", f"g-{cluster}")
    try:
        got = asyncio.run(pipeline.wait_for_decisions(tansu_broker, cluster, len(expected.decisions)))
    finally:
        pipeline.stop(worker)
    from streams.kafka import logio

    log = [
        e
        for e in logio.read_events(f"kafka://{tansu_broker}/preemption.cluster-events")
        if e["cluster"] == cluster
    ]
    assert fleet.fold(log, Config()).decisions == got == expected.decisions


def test_duplicate_delivery_changes_nothing(tansu_broker: str, tmp_path: Path) -> None:
    cluster = _cluster()
    expected = _expected(traces.basic(30), cluster)
    rnd = random.Random(7)
    noisy: list[dict[str, Any]] = []
    for e in expected.log:
        noisy.append(e)
        if "object" in e and rnd.random() < 0.10:
            noisy.append(e)  # the same watch event delivered twice
    asyncio.run(pipeline.produce(tansu_broker, cluster, noisy, per_record=5))
    worker = pipeline.start_worker(tansu_broker, tmp_path / "store", f"g-{cluster}")
    try:
        got = asyncio.run(pipeline.wait_for_decisions(tansu_broker, cluster, len(expected.decisions)))
    finally:
        pipeline.stop(worker)
    # Sequence numbers count events, so duplicates shift ids; the decisions themselves are unchanged.
    strip = ("id", "seq", "prevHash", "hash")
    assert [{k: v for k, v in d.items() if k not in strip} for d in got] == [
        {k: v for k, v in d.items() if k not in strip} for d in expected.decisions
    ]


def _kill_mid_trace(
    bootstrap: str,
    tmp_path: Path,
    *,
    lose_store: bool,
    guarantee: str = "at_least_once",
    read_committed: bool = False,
) -> tuple[list[dict[str, Any]], fleet.Result]:
    """Half the log in, SIGKILL the worker as soon as decisions flow, the rest in, restart."""
    cluster = _cluster()
    expected = _expected(traces.basic(80), cluster)
    half = len(expected.log) // 2
    asyncio.run(pipeline.produce(bootstrap, cluster, expected.log[:half], per_record=2))
    store = tmp_path / "store"
    group = f"g-{cluster}"
    worker = pipeline.start_worker(bootstrap, store, group, guarantee=guarantee)
    try:
        partial = asyncio.run(
            pipeline.wait_for_decisions(bootstrap, cluster, 1, settle=False, read_committed=read_committed)
        )
        pipeline.stop(worker, kill=True)
        assert 0 < len(partial) < len(expected.decisions)
        if lose_store:
            shutil.rmtree(store)
        asyncio.run(pipeline.produce(bootstrap, cluster, expected.log[half:], per_record=2))
        worker = pipeline.start_worker(bootstrap, store, group, guarantee=guarantee)
        got = asyncio.run(
            pipeline.wait_for_decisions(
                bootstrap, cluster, len(expected.decisions), read_committed=read_committed
            )
        )
    finally:
        pipeline.stop(worker)
    return got, expected


@pytest.mark.parametrize("lose_store", [False, True], ids=["sigkill", "sigkill-and-lost-store"])
def test_worker_killed_mid_trace_loses_and_doubles_nothing(
    tansu_broker: str, tmp_path: Path, lose_store: bool
) -> None:
    got, expected = _kill_mid_trace(tansu_broker, tmp_path, lose_store=lose_store)
    assert [d["id"] for d in got] == [d["id"] for d in expected.decisions]
    assert got == expected.decisions


def test_poison_input_goes_to_dead_letter_and_the_flow_continues(tansu_broker: str, tmp_path: Path) -> None:
    cluster = _cluster()
    expected = _expected(traces.example(), cluster)
    garbage = b"\xff\x00 not json"
    unknown = orjson.dumps(
        {"v": 1, "cluster": cluster, "events": [{"ts": "2026-01-01T00:00:00Z", "type": "EXPLODED"}]}
    )
    no_meta = orjson.dumps(
        {
            "v": 1,
            "cluster": cluster,
            "events": [
                {"ts": "2026-01-01T00:00:00Z", "type": "ADDED", "object": {"kind": "Pod", "spec": {}}}
            ],
        }
    )
    asyncio.run(pipeline.produce(tansu_broker, cluster, [], raw=[garbage, unknown]))
    asyncio.run(pipeline.produce(tansu_broker, cluster, expected.log, per_record=10))
    worker = pipeline.start_worker(tansu_broker, tmp_path / "store", f"g-{cluster}")
    try:
        asyncio.run(pipeline.produce(tansu_broker, cluster, [], raw=[no_meta]))
        got = asyncio.run(pipeline.wait_for_decisions(tansu_broker, cluster, len(expected.decisions)))
        dead = asyncio.run(pipeline.dead_letters(tansu_broker, cluster))
    finally:
        pipeline.stop(worker)
    # Rejected input takes no sequence number: the decisions are exactly those of the clean log.
    assert got == expected.decisions
    assert len(dead) == 3
    # A record that does not decode goes whole; a bad event goes alone, its record's index in a header.
    assert dead[0][0] == garbage and "origin-index" not in dead[0][1]
    assert dead[1][0] == b'{"ts":"2026-01-01T00:00:00Z","type":"EXPLODED"}'
    assert dead[1][1]["origin-index"] == b"0"
    for _, headers in dead:
        assert headers["origin-topic"] == b"preemption.cluster-events"
        assert headers["origin-partition"] == b"0" and headers["origin-offset"].isdigit()
        assert headers["error-class"] and headers["error"]
    assert b"without metadata.name" in dead[2][1]["error"]


def test_exactly_once_on_kafka_hides_duplicates_from_read_committed(
    kafka_broker: str, tmp_path: Path
) -> None:
    got, expected = _kill_mid_trace(
        kafka_broker, tmp_path, lose_store=False, guarantee="exactly_once", read_committed=True
    )
    assert [d["id"] for d in got] == [d["id"] for d in expected.decisions]
    assert got == expected.decisions


def test_a_record_near_the_size_limit_is_published(broker: str) -> None:
    """Producer max request size, topic max.message.bytes and the value limit agree
    (records.RECORD_MAX_BYTES).

    faust's default producer limit (1,000,000 bytes) refused such a record.
    """
    from streams.kafka import deadletter
    from streams.kafka.reading import PartitionReader
    from streams.pipeline import outbox

    value = b"x" * (records.VALUE_MAX_BYTES - 1000)
    record = outbox.dead_letter(
        key=b"big",
        value=value,
        origin=deadletter.Origin(records.CLUSTER_EVENTS, 0, 1),
        error_class="E",
        error="big",
        partition=0,
    )

    async def scenario() -> bytes:
        await kafka_topics.ensure_topics(broker)
        producer = outbox.new_producer(broker)
        await producer.start()
        try:
            box = outbox.KafkaOutbox(producer, transactional=False, owns_producer=False)
            await box.send(record)
            (offset,) = await box.flush()
        finally:
            await producer.stop()
        async with PartitionReader(broker) as reader:
            got = await reader.at(records.DEAD_LETTER, 0, offset)
        assert got is not None
        return got.value

    assert asyncio.run(scenario()) == value


def test_bounds_end_while_the_log_keeps_growing(broker: str) -> None:
    """A live cluster never lets cluster-events go quiet: a partition must still open.

    `bounds` once read past the reported end until the log went quiet (the embedded broker
    reports the end short by its last batch); with a source writing every 0.1 s it never
    returned, and the worker never opened its partition.
    """
    from streams.kafka.reading import PartitionReader

    writing = asyncio.Event()

    async def keep_writing(producer: AIOKafkaProducer) -> None:
        i = 0
        while True:
            await producer.send_and_wait(records.CLUSTER_EVENTS, b'{"i": %d}' % i, key=b"k", partition=0)
            i += 1
            if i == 20:
                writing.set()
            await asyncio.sleep(0.02)

    async def scenario() -> tuple[int, int, list[int]]:
        await kafka_topics.ensure_topics(broker)
        producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
        await producer.start()
        writer = asyncio.create_task(keep_writing(producer))
        try:
            await writing.wait()
            async with PartitionReader(broker) as reader:
                # Bounded: the old reader was still reading when these ran out.
                before = (await asyncio.wait_for(reader.bounds(records.CLUSTER_EVENTS, 0), 20))[1]
                start, end = await asyncio.wait_for(reader.bounds(records.CLUSTER_EVENTS, 0), 20)
                read = [m.offset async for m in reader.read(records.CLUSTER_EVENTS, 0, start, end)]
            return before, end, read
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            await producer.stop()

    before, end, read = asyncio.run(scenario())
    assert 20 <= before <= end  # every record acknowledged before the call is inside the bounds
    assert read[-1] == end - 1  # and the bounds are what a read gets


def test_the_tables_are_never_on_the_metrics_port(tansu_broker: str, tmp_path: Path) -> None:
    """The table views are the cluster's whole inventory: not on the port Prometheus (and whatever
    the NetworkPolicy admits) reaches, only on --tables-port, bound to 127.0.0.1."""
    cluster = _cluster()
    expected = _expected(traces.basic(3), cluster)
    asyncio.run(pipeline.produce(tansu_broker, cluster, expected.log))
    health, views = free_loopback_port(), free_loopback_port()
    worker = pipeline.start_worker(
        tansu_broker, tmp_path / "store", f"g-{cluster}",
        extra=["--health-port", str(health), "--health-host", "127.0.0.1", "--tables-port", str(views)],
    )  # fmt: skip
    try:
        asyncio.run(pipeline.wait_for_decisions(tansu_broker, cluster, len(expected.decisions)))

        def status(port: int, path: str) -> int:
            try:
                return int(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert status(health, "/metrics") == 200
        for path in ("/partitions", f"/clusters/{cluster}/pods", f"/clusters/{cluster}/nodes"):
            assert status(health, path) == 404, path
            assert status(views, path) == 200, path
        bound = {c.laddr for c in psutil_connections(worker.pid) if c.status == "LISTEN"}
        assert ("127.0.0.1", views) in bound and ("0.0.0.0", views) not in bound
    finally:
        pipeline.stop(worker)


def psutil_connections(pid: int) -> list[Any]:
    """The process's listening sockets, from /proc (no psutil needed): (laddr, status) pairs."""
    import collections

    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    Conn = collections.namedtuple("Conn", "laddr status")
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes and fields[3] == "0A":  # 0A: LISTEN
            host_hex, port_hex = fields[1].split(":")
            host = ".".join(str(int(host_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
            found.append(Conn((host, int(port_hex, 16)), "LISTEN"))
    return found


def test_two_installs_on_one_broker_keep_apart(tansu_broker: str, tmp_path: Path) -> None:
    """--topic-prefix and --group: a second install folds its own topics in its own group, and
    writes nothing to the first's (nor the first to its)."""
    cluster = _cluster()
    expected = _expected(traces.basic(5), cluster)
    layout = kafka_topics.Layout(names=kafka_topics.Names(f"b{uuid.uuid4().hex[:6]}.preemption."))
    names = layout.names
    asyncio.run(kafka_topics.ensure_topics(tansu_broker, layout.specs()))
    asyncio.run(
        pipeline.produce(tansu_broker, cluster, expected.log, topic=names.cluster_events, create=False)
    )
    worker = pipeline.start_worker(
        tansu_broker, tmp_path / "store", f"b-{cluster}", extra=["--topic-prefix", names.prefix]
    )
    try:
        got = asyncio.run(
            pipeline.wait_for_decisions(tansu_broker, cluster, len(expected.decisions), topic=names.decisions)
        )
    finally:
        pipeline.stop(worker)
    assert got == expected.decisions
    assert asyncio.run(pipeline.decisions(tansu_broker, cluster)) == []  # none in preemption.decisions


def test_a_worker_started_before_its_broker_waits_unready_then_folds(tmp_path: Path) -> None:
    """Kafka down at start (not up yet, or restarting): the worker stays up, live and unready,
    saying why, instead of exiting for its supervisor to restart it; once a broker answers on
    that address it creates its topics and folds."""
    port, health = free_loopback_port(), free_loopback_port()
    bootstrap = f"127.0.0.1:{port}"
    cluster = _cluster()
    expected = _expected(traces.basic(3), cluster)
    worker = pipeline.start_worker(
        bootstrap, tmp_path / "store", f"g-{cluster}",
        extra=["--health-port", str(health), "--health-host", "127.0.0.1", "--bootstrap-timeout", "1"],
    )  # fmt: skip

    def status(path: str) -> int:
        try:
            return int(urllib.request.urlopen(f"http://127.0.0.1:{health}{path}", timeout=5).status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    try:
        log = tmp_path / "store.log"
        deadline = time.monotonic() + pipeline.DECISIONS_TIMEOUT_S
        while log.read_text(errors="replace").count("trying again") < 2:  # two tries, both refused
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        assert (status("/livez"), status("/readyz")) == (200, 503)
        assert f"cannot reach Kafka at {bootstrap} over PLAINTEXT" in log.read_text()
        with embedded.EmbeddedBroker(port=port, log_path=tmp_path / "tansu.log") as broker:
            asyncio.run(pipeline.produce(broker.bootstrap, cluster, expected.log))
            got = asyncio.run(pipeline.wait_for_decisions(broker.bootstrap, cluster, len(expected.decisions)))
            assert got == expected.decisions
            assert worker.poll() is None
    finally:
        pipeline.stop(worker)
