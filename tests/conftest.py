"""Session-wide brokers: the embedded tansu and a real Apache Kafka, one of each per test run.

Both yield a bootstrap string; `secure_kafka` is a third, a secured Apache Kafka
(SASL_SSL, mTLS, ACLs: tests/support/secure_kafka.py). Every test that needs Kafka ends up marked `kafka`
(tests/integration/conftest.py), so `pytest -m "not kafka"` runs without a JVM.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streams.brokers import embedded, kafka_local
from tests.support import secure_kafka as secure_kafka_mod
from tests.support import tools


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marked here rather than per test, so a new test cannot forget it: anything that
    # asks for Kafka (directly or through another fixture) needs the JVM.
    for item in items:
        if "tests/integration/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.integration)
        if {"kafka_broker", "secure_kafka"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of an embedded tansu shared by the session (in-memory storage)."""
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with embedded.EmbeddedBroker(log_path=log) as tansu:
        yield tansu.bootstrap


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a single-node KRaft Apache Kafka shared by the session."""
    log = tmp_path_factory.mktemp("kafka") / "kafka.log"
    with kafka_local.LocalKafka(log_path=log) as kafka:
        yield kafka.bootstrap


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[secure_kafka_mod.SecureKafka]:
    """A secured Apache Kafka shared by the session: SASL_SSL (SCRAM, PLAIN) and mTLS listeners,
    the StandardAuthorizer, no ACL granted (each test grants what it runs under, per principal)."""
    root = tmp_path_factory.mktemp("secure-kafka")
    try:
        running = secure_kafka_mod.start(root, log_path=root / "kafka.log")
    except secure_kafka_mod.ToolMissing as exc:
        tools.unavailable(str(exc))
    try:
        yield running
    finally:
        running.broker.stop()
