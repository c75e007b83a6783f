"""Fixtures for the Kubernetes-facing tests: a kmock API server with FakeApi behind it, a client, a broker.

The API server is per test (fresh objects and history); the embedded tansu
broker is per session, so tests that use it write to fresh topic names.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import kmock
import pytest
from kubernetes_asyncio import client

from streams.kube import api as kube
from tests.k8s.fakeapi import FakeApi


@pytest.fixture(scope="session")
def tansu(tansu_broker: str) -> str:
    """The session's embedded tansu (tests/conftest.py): one broker for every test folder."""
    return tansu_broker


@pytest.fixture(scope="session")
def kafka(kafka_broker: str) -> str:
    """The session's Apache Kafka (tests/conftest.py): one JVM for the whole run."""
    return kafka_broker


@pytest.fixture(
    params=[pytest.param("tansu", id="tansu"), pytest.param("kafka", id="kafka", marks=pytest.mark.kafka)]
)
def broker(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs once per broker; the value is the bootstrap address."""
    bootstrap: str = request.getfixturevalue(request.param)
    return bootstrap


async def _fake(*, elastic_quotas: bool) -> AsyncIterator[tuple[FakeApi, client.ApiClient]]:
    async with kmock.KubernetesScaffold() as handler, kmock.Server(handler) as server:
        fake = FakeApi(handler, elastic_quotas=elastic_quotas)
        api = kube.for_host(str(server.url))
        try:
            yield fake, api
        finally:
            await api.close()


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeApi, client.ApiClient]]:
    async for pair in _fake(elastic_quotas=True):
        yield pair


@pytest.fixture
async def served_without_quotas() -> AsyncIterator[tuple[FakeApi, client.ApiClient]]:
    async for pair in _fake(elastic_quotas=False):
        yield pair


def fresh_topic(stem: str) -> str:
    return f"test.{stem}.{uuid.uuid4().hex[:8]}"
