"""Fixtures for the Kubernetes-facing tests: a real kube-apiserver, a kmock API server, a broker.

The real API server (testbed/cluster.py) is per session, with the chart
installed; tests use fresh namespaces and names. The kmock server (FakeApi) is
per test and serves the faults a real server will not produce on demand. The
embedded tansu broker is per session, so tests that use it write to fresh topics.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import kmock
import pytest
from kubernetes_asyncio import client

from streams.kube import api as kube
from testbed import cluster
from tests.k8s.fakeapi import FakeApi
from tests.k8s.helm import CHART
from tests.support import tools


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


# ---- the real API server ---------------------------------------------------------------


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[cluster.TestCluster]:
    """etcd + kube-apiserver for the session, with the chart installed (helm template | kubectl
    apply --server-side, as the admin), so every component identity has exactly the chart's RBAC.

    Skips, saying why, when a prerequisite is missing (make kube-tools installs them all); fails
    instead under `make test` (tests/support/tools.py).
    """
    try:
        cluster.prerequisites()
        cluster.tool("helm"), cluster.tool("kubectl")
    except cluster.Unavailable as exc:
        tools.unavailable(f"no real API server: {exc}")
    with cluster.TestCluster() as running:
        print(
            f"\nkube-apiserver v{cluster.KUBE_VERSION} ready in {running.started_in_s:.1f}s at {running.url}"
        )
        cluster.install_chart(running, CHART)
        yield running


@pytest.fixture
async def as_actuator(kube_cluster: cluster.TestCluster) -> AsyncIterator[client.ApiClient]:
    """An ApiClient authenticated as the chart's actuator ServiceAccount."""
    api = await kube.connect(str(kube_cluster.kubeconfig("actuator")))
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
async def as_source(kube_cluster: cluster.TestCluster) -> AsyncIterator[client.ApiClient]:
    """An ApiClient authenticated as the chart's source ServiceAccount."""
    api = await kube.connect(str(kube_cluster.kubeconfig("source")))
    try:
        yield api
    finally:
        await api.close()


COMPONENT_USERS = {user for name, (user, _, _) in cluster.IDENTITIES.items() if name != "admin"}


@pytest.fixture
def no_component_is_forbidden(kube_cluster: cluster.TestCluster) -> Iterator[None]:
    """A 403 to any component identity during the test fails it: the chart's RBAC must cover the code
    (test_real_api.py and test_forged_events.py use it for every test)."""
    before = len(kube_cluster.audit())
    yield
    forbidden = [
        f"{e['user']['username']} {e['verb']} {e['requestURI']}"
        for e in kube_cluster.audit()[before:]
        if e["user"]["username"] in COMPONENT_USERS and e.get("responseStatus", {}).get("code") == 403
    ]
    assert not forbidden, f"RBAC refused a component: {forbidden}"


@pytest.fixture
def ns(kube_cluster: cluster.TestCluster) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name
