"""Brokers for the integration tests: the embedded tansu and a real Apache Kafka.

Both are started once per session (tansu in ~0.05 s, Kafka in ~2.5 s) and yield a
bootstrap string. Tests take `broker` to run on both, or one of `tansu_broker` /
`kafka_broker` for what only that broker does. Everything that needs Kafka carries
the `kafka` marker, so `pytest -m "not kafka"` runs without Java or Maven.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streams import broker as broker_mod
from streams import kafka_local


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marked here rather than per test, so a new test cannot forget it: every test
    # in this folder needs a broker, and any that asks for Kafka needs the JVM.
    for item in items:
        if "tests/integration/" not in item.nodeid.replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.integration)
        if "kafka_broker" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of an embedded tansu shared by the session (in-memory storage)."""
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with broker_mod.EmbeddedBroker(log_path=log) as tansu:
        yield tansu.bootstrap


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a single-node KRaft Apache Kafka shared by the session."""
    log = tmp_path_factory.mktemp("kafka") / "kafka.log"
    with kafka_local.LocalKafka(log_path=log) as kafka:
        yield kafka.bootstrap


@pytest.fixture(
    params=[
        pytest.param("tansu", id="tansu"),
        pytest.param("kafka", id="kafka", marks=pytest.mark.kafka),
    ]
)
def broker(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs once per broker; the value is the bootstrap address."""
    bootstrap: str = request.getfixturevalue(f"{request.param}_broker")
    return bootstrap
