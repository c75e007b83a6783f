"""Fixtures of the fault-injection suite: a fresh Apache Kafka per scenario, and the seeds to run.

Each scenario gets its own broker (a scenario kills brokers, pauses workers and
deletes records, so it shares nothing). `CHAOS_SEEDS` (default 1) says how many
seeds each seeded scenario runs: `make test` runs one, `make chaos` more.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from streams.brokers import kafka_local
from streams.kafka import topics

# Seeds per seeded scenario unless CHAOS_SEEDS says otherwise: bounded for `make test`.
DEFAULT_SEEDS = 1


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        count = int(os.environ.get("CHAOS_SEEDS", DEFAULT_SEEDS))
        metafunc.parametrize("seed", range(count), ids=[f"seed{s}" for s in range(count)])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.kafka)
            item.add_marker(pytest.mark.chaos)


@pytest.fixture
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kafka_local.LocalKafka]:
    """A fresh single-node Kafka with the preemptctl topics (one partition each)."""
    log = tmp_path_factory.mktemp("kafka") / "kafka.log"
    with kafka_local.LocalKafka(log_path=log) as broker:
        asyncio.run(topics.ensure_topics(broker.bootstrap))
        yield broker


@pytest.fixture
def kafka4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kafka_local.LocalKafka]:
    """A fresh Kafka whose topics have four partitions: four clusters, two workers."""
    log = tmp_path_factory.mktemp("kafka") / "kafka.log"
    with kafka_local.LocalKafka(log_path=log) as broker:
        asyncio.run(topics.ensure_topics(broker.bootstrap, topics.topic_specs(partitions=4)))
        yield broker
