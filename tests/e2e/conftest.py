"""Fixtures for the end-to-end tests: one control plane and one preemptctl stack per session.

The control plane (kube-apiserver + etcd + kube-scheduler + kwok) and the stack on
its own embedded tansu are started once; each test works in the stack's namespace
on nodes of its own (a label and a nodeSelector per test), so tests do not share
capacity. The Apache Kafka case runs a second stack, in its own namespace, on the
session's Kafka.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streams.brokers import embedded
from testbed import cluster as cluster_mod
from testbed import scheduler as scheduler_mod
from testbed import stack as stack_mod
from tests.e2e.waits import KAFKA_NAMESPACE, NAMESPACE
from tests.support import tools

# Victims are evicted (policy/v1 Eviction) in the tansu stack, so a PDB is honoured by the
# API server (the PDB liveness case); the Kafka stack deletes them, kube-scheduler's way.
TANSU_CONFIG = {"victimAction": "evict"}


@pytest.fixture(scope="session")
def plane() -> Iterator[stack_mod.ControlPlane]:
    try:
        cluster_mod.prerequisites()
        cluster_mod.tool("helm"), cluster_mod.tool("kubectl")
        scheduler_mod.binary()
        stack_mod.kwok_binary()
    except cluster_mod.Unavailable as exc:
        tools.unavailable(f"no control plane: {exc}")
    with stack_mod.ControlPlane() as running:
        yield running


@pytest.fixture(scope="session")
def e2e_tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of the e2e stack's own: no other test's records or consumer groups on it."""
    with embedded.EmbeddedBroker(log_path=tmp_path_factory.mktemp("e2e-tansu") / "tansu.log") as tansu:
        yield tansu.bootstrap


@pytest.fixture(scope="session")
def loop(plane: stack_mod.ControlPlane, e2e_tansu: str) -> Iterator[stack_mod.Stack]:
    with stack_mod.stack(plane, e2e_tansu, "e2e", NAMESPACE, config=TANSU_CONFIG) as running:
        yield running


@pytest.fixture(scope="session")
def kafka_loop(plane: stack_mod.ControlPlane, kafka_broker: str) -> Iterator[stack_mod.Stack]:
    """The same loop on the session's Apache Kafka, deleting victims (the default action)."""
    with stack_mod.stack(
        plane, kafka_broker, "e2e-kafka", KAFKA_NAMESPACE, topic_prefix="e2e-kafka.preemption."
    ) as running:
        yield running
