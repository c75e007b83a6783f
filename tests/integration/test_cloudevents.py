"""CloudEvents on every topic of a `preemptctl run`, read by clients this project did not write.

`preemptctl run` plays the bundled example on a broker of its own, after two
records the worker must refuse (one not JSON, one batch with an event it cannot
fold). Then:
- aiokafka reads the three topics and the CloudEvents SDK's Kafka binding turns
  each message into a typed event whose id is the decision's (decision + victim
  uid for outcomes; the origin position for dead letters);
- the cluster-events log is copied to a second, empty broker and a fresh worker
  folds it there: decisions and dead letters come out with byte-identical
  headers (and values), because the headers are a pure function of the record;
- kcat, a client nobody here wrote, prints a worker's headers (on Apache Kafka:
  librdkafka cannot talk to the embedded tansu);
- examples/consumer.py reads the events through the SDK and says so.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from schemas import records
from streams.brokers import embedded
from streams.kafka import topics
from streams.sim import traces
from tests.integration import pipeline
from tests.support import audit_traces, tools

ROOT = Path(__file__).resolve().parents[2]
MAIN = "import sys; from streams.cli.main import main; sys.exit(main(sys.argv[1:]))"
# `run --until-idle` of the bundled example takes ~10 s; group joins on tansu add a few.
RUN_TIMEOUT_S = 120.0
# The replaying worker joins its group (about half the session timeout on tansu) and folds ~90 events.
REPLAY_TIMEOUT_S = 90.0
# A topic is read once a poll this long comes back empty (tansu reports end offsets short:
# docs/architecture.md §6).
EMPTY_POLL_MS = 1000
# kcat reads a topic of a few hundred records in well under a second.
KCAT_TIMEOUT_S = 30.0
# What the worker must refuse: bytes that are no record, and a batch whose only event has no object.
NOT_JSON = b"\x00not a record"
BAD_EVENT_TS = "2025-12-31T23:59:00Z"
BAD_BATCH = orjson.dumps(
    {
        "v": 1,
        "cluster": "poison",
        "events": [{"ts": BAD_EVENT_TS, "type": "ADDED", "object": {"kind": "Pod"}}],
    }
)
# The bundled example: 8 decisions (README), and the simulated actuator's outcomes.
EXAMPLE_DECISIONS = 8


@dataclass
class Recorded:
    run: str  # bootstrap of the broker `preemptctl run` used
    replay: str  # bootstrap of the broker a fresh worker re-derived the log on
    topics: dict[str, list[ConsumerRecord]]  # what aiokafka read from `run`'s broker


async def read(bootstrap: str, topic: str) -> list[ConsumerRecord]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        out: list[ConsumerRecord] = []
        while batch := await consumer.getmany(tp, timeout_ms=EMPTY_POLL_MS):
            out += batch[tp]
        return out
    finally:
        await consumer.stop()


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def preemptctl(*args: str, log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", MAIN, *args],
        cwd=cwd,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def replay(bootstrap: str, log: list[ConsumerRecord], want: dict[str, int], tmp: Path) -> None:
    """Copy the cluster-events log to an empty broker and let a fresh worker fold it there."""
    asyncio.run(topics.ensure_topics(bootstrap))
    asyncio.run(produce(bootstrap, records.CLUSTER_EVENTS, [(m.key, m.value) for m in log]))
    worker = preemptctl(
        "worker", "--broker", f"kafka://{bootstrap}", "--store-dir", str(tmp / "store"), "--health-port", "0",
        log=tmp / "replay-worker.log",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + REPLAY_TIMEOUT_S
        while [t for t, n in want.items() if len(asyncio.run(read(bootstrap, t))) < n]:
            assert worker.poll() is None, (tmp / "replay-worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the replaying worker did not re-derive the log in time"
            time.sleep(0.5)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    tmp = tmp_path_factory.mktemp("cloudevents")
    with (
        embedded.EmbeddedBroker(log_path=tmp / "tansu-run.log") as first,
        embedded.EmbeddedBroker(log_path=tmp / "tansu-replay.log") as second,
    ):
        asyncio.run(topics.ensure_topics(first.bootstrap))
        asyncio.run(
            produce(first.bootstrap, records.CLUSTER_EVENTS, [(b"default", NOT_JSON), (b"poison", BAD_BATCH)])
        )
        cwd = tmp / "run-cwd"
        cwd.mkdir()
        run = preemptctl("run", "--broker", first.url, "--until-idle", log=tmp / "run.log", cwd=cwd)
        assert run.wait(RUN_TIMEOUT_S) == 0, (tmp / "run.log").read_text()[-3000:]
        # Its store and faust's data live in a temporary directory: nothing is left where it ran.
        assert list(cwd.iterdir()) == []
        read_back = {
            t: asyncio.run(read(first.bootstrap, t))
            for t in (records.CLUSTER_EVENTS, records.DECISIONS, records.EVICTIONS, records.DEAD_LETTER)
        }
        want = {t: len(read_back[t]) for t in (records.DECISIONS, records.DEAD_LETTER)}
        replay(second.bootstrap, read_back[records.CLUSTER_EVENTS], want, tmp)
        yield Recorded(first.bootstrap, second.bootstrap, read_back)


def event(m: ConsumerRecord) -> BaseCloudEvent:
    """The CloudEvents SDK's reading of one Kafka message (binary content mode), validation included."""
    headers = {name: value for name, value in m.headers}
    return ce_kafka.from_binary(
        ce_kafka.KafkaMessage(headers=headers, key=m.key, value=m.value), JSONFormat(), CloudEvent
    )


def test_each_topic_reads_as_typed_cloudevents_whose_ids_match_the_decisions(recorded: Recorded) -> None:
    decisions = [orjson.loads(m.value) for m in recorded.topics[records.DECISIONS]]
    events = [event(m) for m in recorded.topics[records.DECISIONS]]
    assert len(events) == EXAMPLE_DECISIONS
    assert [e.get_id() for e in events] == [d["id"] for d in decisions]
    assert {e.get_type() for e in events} == {"io.preemptctl.decision.v1"}
    assert [e.get_subject() for e in events] == [d["preemptor"] for d in decisions]
    assert [e.get_data() for e in events] == decisions  # the value is still the plain record

    ids = {d["id"] for d in decisions}
    outcomes = recorded.topics[records.EVICTIONS]
    assert outcomes
    for m in outcomes:
        outcome, ce = orjson.loads(m.value), event(m)
        assert outcome["decisionId"] in ids
        assert ce.get_id() == f"{outcome['decisionId']}/{outcome['victim']['uid']}"
        assert (ce.get_type(), ce.get_extension("partitionkey")) == (
            "io.preemptctl.eviction.v1",
            m.key.decode(),
        )

    dead = {e.get_id(): e for e in map(event, recorded.topics[records.DEAD_LETTER])}
    assert set(dead) == {"preemption.cluster-events/0/0", "preemption.cluster-events/0/1/0"}
    undecodable, bad_event = dead["preemption.cluster-events/0/0"], dead["preemption.cluster-events/0/1/0"]
    assert undecodable.get_datacontenttype() == "application/octet-stream"
    assert undecodable.get_data() == NOT_JSON.decode()  # the SDK hands valid UTF-8 over as text
    assert (
        bad_event.get_time() is not None and bad_event.get_time().isoformat() == "2025-12-31T23:59:00+00:00"
    )
    assert bad_event.get_source() == "/preemptctl/clusters/poison"


def test_replaying_the_log_gives_byte_identical_headers(recorded: Recorded) -> None:
    for topic in (records.DECISIONS, records.DEAD_LETTER):
        first = [(m.key, m.value, list(m.headers)) for m in recorded.topics[topic]]
        again = [(m.key, m.value, list(m.headers)) for m in asyncio.run(read(recorded.replay, topic))]
        assert again == first, topic
        assert all(
            ("ce_time" in dict(h)) == (topic == records.DECISIONS or v != NOT_JSON) for _, v, h in first
        )


def test_kcat_reads_the_headers_a_worker_writes_on_apache_kafka(kafka_broker: str, tmp_path: Path) -> None:
    """kcat (librdkafka) cannot talk to tansu 0.6, so this reads a worker's decisions on Apache Kafka."""
    kcat = tools.need("kcat", "kcat")
    cluster = f"kcat-{uuid.uuid4().hex[:8]}"
    result = audit_traces.simulate(pipeline.with_cluster(traces.example(), cluster))
    asyncio.run(pipeline.produce(kafka_broker, cluster, result.log, per_record=7))
    worker = pipeline.start_worker(kafka_broker, tmp_path / "store", f"test-{cluster}")
    try:
        written = asyncio.run(pipeline.wait_for_decisions(kafka_broker, cluster, len(result.decisions)))
    finally:
        pipeline.stop(worker)
    assert [d["id"] for d in written] == [d["id"] for d in result.decisions]
    printed = subprocess.run(
        [
            kcat,
            "-C",
            "-b",
            kafka_broker,
            "-t",
            records.DECISIONS,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%k\\t%h\\n",
        ],
        capture_output=True,
        timeout=KCAT_TIMEOUT_S,
        check=True,
    ).stdout.decode()
    ours = [line.split("\t", 1)[1] for line in printed.splitlines() if line.startswith(f"{cluster}\t")]
    # kcat prints headers as name=value,name=value (none of these values holds a comma).
    headers = [dict(pair.split("=", 1) for pair in line.split(",")) for line in ours]
    assert [h["ce_id"] for h in headers] == [d["id"] for d in result.decisions]
    for h, d in zip(headers, result.decisions, strict=True):
        # The cluster-events log it was folded from: its first record's offset and fingerprint.
        assert re.fullmatch(r"\d+-[0-9a-f]{32}", h.pop("preemptctl-incarnation", "")), h
        assert h == {
            "ce_specversion": "1.0",
            "ce_id": d["id"],
            "ce_source": f"/preemptctl/clusters/{cluster}",
            "ce_type": "io.preemptctl.decision.v1",
            "ce_time": d["ts"],
            "ce_subject": d["preemptor"],
            "ce_dataschema": "https://preemptctl.dev/schemas/v1/decisions.json",
            "ce_partitionkey": cluster,
            "content-type": "application/json",
        }


def test_the_example_consumer_reads_them_as_cloudevents(recorded: Recorded) -> None:
    run = subprocess.run(
        [
            sys.executable, str(ROOT / "examples" / "consumer.py"), "--broker", f"kafka://{recorded.run}",
            "--decisions", "--from-beginning", "--idle-exit", "2",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=True,
    )  # fmt: skip
    lines = run.stdout.splitlines()
    decision = orjson.loads(recorded.topics[records.DECISIONS][0].value)
    head = (
        f"io.preemptctl.decision.v1 decision {decision['id']}: {decision['preemptor']} {decision['outcome']}"
    )
    assert any(line.startswith(head) for line in lines), lines
    evictions = [line for line in lines if line.startswith("io.preemptctl.eviction.v1 eviction ")]
    assert len(evictions) == len(recorded.topics[records.EVICTIONS])
    assert f"consumed {len(lines)} valid, 0 rejected" in run.stderr
