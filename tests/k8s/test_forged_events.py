"""Issue 29, 2: the forged-priority attack on coredns, end to end on the real kube-apiserver.

`preemptctl source`, `worker` and `actuator` run as processes on the embedded broker, under their
own topic prefix and groups, the source and the actuator as the chart's ServiceAccounts. The cluster
holds a node filled by kube-system/coredns (system-cluster-critical, priority 2e9) and a real
pending pod of priority 10 whose nodeSelector matches no node. The attacker has the source's Kafka
rights: it copies the source's own record of the pending pod into one forged MODIFIED event that
raises its priority to 2000001000 and pins it (nodeSelector) to coredns's node, with a
resourceVersion ahead of the server's. The worker believes the log and decides to preempt coredns;
the signed decision reaches the actuator, which reads the live pods and refuses: coredns is not
written to, and the actuator's OUTCOME on the cluster's log says why. With the namespace deny-list
emptied, the check that holds is the live priorities' (10 is not above 2e9); by default, kube-system
is protected as well.
"""

from __future__ import annotations

import asyncio
import copy
import time
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from schemas import VERSION
from streams.kafka import reading
from streams.kafka import topics as kafka_topics
from testbed import cluster
from tests.k8s.commands import command, stop
from tests.k8s.real_api import get_pod

# Any 403 to a component during a test fails it (tests/k8s/conftest.py), as in test_real_api.py.
pytestmark = pytest.mark.usefixtures("no_component_is_forbidden")

ATTACK_TIMEOUT_S = 180.0  # a loaded machine: three processes, group joins on the embedded broker
POLL_S = 0.5
KEY = b"forged-events-test-hmac-key-0123456789"
FORGED_PRIORITY = 2_000_001_000  # what the attack wrote in the issue: above system-cluster-critical
COREDNS_PRIORITY = 2_000_000_000  # system-cluster-critical, set by admission
LIVE_PRIORITY = 10
COREDNS = ("kube-system", "coredns")
NODE_LABEL = "preemptctl.test/node"
# Admission taints a new node not-ready, and no node-lifecycle controller lifts it here.
NOT_READY = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def coredns(kube_cluster: cluster.TestCluster, ns: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A node of its own, full with kube-system/coredns running on it; both removed afterwards."""
    node = f"{ns}-node"
    kube_cluster.apply(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {NODE_LABEL: node}}}
    )
    capacity = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    status = {"status": {"capacity": capacity, "allocatable": capacity}}  # the kubelet's to write
    kube_cluster.request("PATCH", f"/api/v1/nodes/{node}/status", status)
    namespace, name = COREDNS
    _delete(kube_cluster, f"/api/v1/namespaces/{namespace}/pods/{name}")  # a rerun's, if left over
    dns = kube_cluster.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"k8s-app": "kube-dns"}},
        "spec": {
            "priorityClassName": "system-cluster-critical", "nodeName": node,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "coredns", "image": "registry.k8s.io/coredns/coredns:v1.12.0",
                            "resources": {"requests": {"cpu": "3500m", "memory": "70Mi"}}}],
        },
        "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z", "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]},
    })  # fmt: skip
    assert dns["spec"]["priority"] == COREDNS_PRIORITY
    try:
        yield node, dns
    finally:
        _delete(kube_cluster, f"/api/v1/namespaces/{namespace}/pods/{name}")
        _delete(kube_cluster, f"/api/v1/nodes/{node}")


def _delete(kube_cluster: cluster.TestCluster, path: str) -> None:
    try:
        kube_cluster.request("DELETE", path, gracePeriodSeconds="0")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise


def _pending(kube_cluster: cluster.TestCluster, ns: str) -> dict[str, Any]:
    """A real pending pod of priority LIVE_PRIORITY (its class's value) that fits no node."""
    low = f"{ns}-low"
    kube_cluster.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": low}, "value": LIVE_PRIORITY})  # fmt: skip
    pod = kube_cluster.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pending", "namespace": ns},
        "spec": {
            "priorityClassName": low, "nodeSelector": {NODE_LABEL: f"{ns}-nowhere"},
            "tolerations": [NOT_READY],
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
    })  # fmt: skip
    assert pod["spec"]["priority"] == LIVE_PRIORITY
    return pod


async def _records(bootstrap: str, topic: str) -> list[reading.Message]:
    return [m async for m in reading.read_all(bootstrap, topic)]


async def _eventually(check: Any, what: str, logs: Path) -> Any:
    deadline = time.monotonic() + ATTACK_TIMEOUT_S
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            tails = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(logs.glob("*.log"))
            )
            raise AssertionError(f"timed out: {what}\n{tails}")
        await asyncio.sleep(POLL_S)


@pytest.mark.parametrize("protected", ["kube-system", ""], ids=["default-deny-list", "no-deny-list"])
async def test_a_forged_priority_does_not_get_coredns_deleted(
    kube_cluster: cluster.TestCluster,
    ns: str,
    coredns: tuple[str, dict[str, Any]],
    tansu: str,
    tmp_path: Path,
    protected: str,
) -> None:
    node, dns = coredns
    pending = _pending(kube_cluster, ns)
    prefix = f"test.forged.{uuid.uuid4().hex[:8]}."
    names = kafka_topics.Names(prefix)
    await kafka_topics.ensure_topics(tansu, kafka_topics.topic_specs(names=names))
    key_file = tmp_path / "k1"  # the key id the actuator accepts: the file's name
    key_file.write_bytes(KEY)
    kafka = ("--broker", f"kafka://{tansu}", "--topic-prefix", prefix, "--no-create-topics")
    common = ("--health-port", "0", "--health-host", "127.0.0.1")
    async with (
        command(
            "source", *kafka, *common, "--kubeconfig", str(kube_cluster.kubeconfig("source")),
            "--cluster", ns, "--namespace", f"{ns},kube-system", "--tick-seconds", "1",
            log=tmp_path / "source.log",
        ) as source,
        command(
            "worker", *kafka, *common, "--store-dir", str(tmp_path / "store"), "--group", f"worker-{ns}",
            "--hmac-key-file", str(key_file), "--hmac-key-id", "k1", log=tmp_path / "worker.log",
        ) as worker,
        command(
            "actuator", *kafka, *common, "--kubeconfig", str(kube_cluster.kubeconfig("actuator")),
            "--cluster", ns, "--group-id", f"actuator-{ns}", "--hmac-key-file", str(key_file),
            "--protected-namespaces", protected, "--any-scheduler", log=tmp_path / "actuator.log",
        ) as actuator,
    ):  # fmt: skip

        async def pending_logged() -> dict[str, Any] | None:
            """The source's own latest record of the pending pod: the attacker's template."""
            for m in reversed(await _records(tansu, names.cluster_events)):
                if m.key != ns.encode():
                    continue
                for event in reversed(orjson.loads(m.value)["events"]):
                    meta = (event.get("object") or {}).get("metadata") or {}
                    if meta.get("uid") == pending["metadata"]["uid"]:
                        return dict(event)
            return None

        template = await _eventually(pending_logged, "the source to log the pending pod", tmp_path)
        assert template["object"]["spec"]["priority"] == LIVE_PRIORITY
        # The worker has the cluster's real state; it decides nothing for the pod (it fits nowhere).
        forged = copy.deepcopy(template)
        forged["type"] = "MODIFIED"
        forged["object"]["spec"]["priority"] = FORGED_PRIORITY
        forged["object"]["spec"]["nodeSelector"] = {NODE_LABEL: node}
        # Newer than anything the server has written: the worker folds it, and ignores the real
        # updates that follow (an object event is applied only when its version moved on).
        meta = forged["object"]["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1_000_000)
        producer = AIOKafkaProducer(bootstrap_servers=tansu, acks="all")  # the source's rights suffice
        await producer.start()
        try:
            batch = {"v": VERSION, "cluster": ns, "events": [forged]}
            await producer.send_and_wait(names.cluster_events, orjson.dumps(batch), key=ns.encode())
        finally:
            await producer.stop()

        dns_uid = dns["metadata"]["uid"]

        async def decided_and_refused() -> tuple[dict[str, Any], dict[str, Any]] | None:
            """The worker's decision to take coredns, and the actuator's OUTCOME for it."""
            decisions = {
                d["id"]: d
                for d in (orjson.loads(m.value) for m in await _records(tansu, names.decisions))
                if d.get("cluster") == ns and d.get("outcome") == "preempt"
                and any(v["uid"] == dns_uid for v in d["victims"])
            }  # fmt: skip
            for m in await _records(tansu, names.cluster_events):
                if m.key != ns.encode():
                    continue
                for event in orjson.loads(m.value)["events"]:
                    outcome = event.get("outcome") or {}
                    if event.get("type") == "OUTCOME" and outcome.get("decisionId") in decisions:
                        return decisions[outcome["decisionId"]], outcome
            return None

        decision, outcome = await _eventually(
            decided_and_refused, "a decision taking coredns, and its OUTCOME", tmp_path
        )
        # The attack reached the worker: it decided for the forged priority, on coredns's node.
        assert decision["preemptor"] == f"{ns}/pending" and decision["node"] == node
        assert decision["preemptorUid"] == pending["metadata"]["uid"]
        # The actuator refused it whole: no nomination, coredns untouched, and the OUTCOME says why.
        assert outcome["nomination"] == "error" and outcome["victims"] == {dns_uid: "error"}
        if protected:
            assert outcome["message"] == "refused: victims in protected namespace(s) kube-system"
        else:
            assert outcome["message"] == (
                f"victim kube-system/coredns has priority {COREDNS_PRIORITY}, "
                f"not below the preemptor's {LIVE_PRIORITY}"
            )
        (written,) = [
            o for o in (orjson.loads(m.value) for m in await _records(tansu, names.evictions))
            if o["decisionId"] == decision["id"]
        ]  # fmt: skip
        assert written["result"] == "error" and written["message"].endswith("no victim was touched")
        for process, name in ((actuator, "actuator"), (worker, "worker"), (source, "source")):
            assert process.returncode is None, f"{name} exited"
        await stop(actuator, tmp_path / "actuator.log")

    # coredns was not written to at all: there, not terminating, not marked; the live preemptor
    # kept its priority and was not nominated.
    held = get_pod(kube_cluster, *COREDNS)
    assert held is not None and held["metadata"]["uid"] == dns_uid
    assert not held["metadata"].get("deletionTimestamp")
    assert all(c["type"] != "DisruptionTarget" for c in held["status"].get("conditions") or ())
    live = get_pod(kube_cluster, ns, "pending")
    assert live is not None and live["spec"]["priority"] == LIVE_PRIORITY
    assert not (live.get("status") or {}).get("nominatedNodeName")
    actuator_writes = [
        f"{e['verb']} {e['requestURI']}" for e in kube_cluster.audit()
        if e["user"].get("uid") in ("actuator-a", "actuator-b") and e["verb"] not in ("get", "list", "watch")
        and e.get("objectRef", {}).get("resource") == "pods"
        and e["objectRef"].get("namespace") in (ns, "kube-system")
    ]  # fmt: skip
    assert actuator_writes == []
