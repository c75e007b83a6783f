"""The whole pipeline over SASL_SSL on a secured Apache Kafka, against a real kube-apiserver.

The source, the worker (exactly_once, faust's consumer included) and the actuator
run as processes, each as its own SCRAM user with exactly the ACLs of
streams.kafka.acls on a broker with the StandardAuthorizer (tests/support/secure_kafka.py),
and each with the chart's RBAC on the API server (tests/k8s/conftest.py). A
pending pod gets a lower-priority pod preempted, end to end. Then what a platform
team must be able to rely on:
- a pod whose env values, command line, args, volumes, probes, annotations and
  last-applied-configuration all hold a secret-looking value: the value is in no
  record of any topic (value, key or header);
- decisions are signed with Ed25519 (the default mode): the worker holds the
  private key, the actuator only the public one (a keys dir, as the chart mounts
  its Secret), so the actuator could not sign a decision itself;
- a principal without Write on decisions cannot write one; a writer of decisions
  without an accepted signing key (unsigned, or signed with a retired key) gets
  its record refused and dead-lettered, and the pod it names is not touched;
- no component logs a password, a store password or the signing key.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from schemas import chain
from streams.brokers.process import free_loopback_port
from streams.common import signing
from streams.kafka import acls, connection, reading, topics
from streams.sim import apiserver
from testbed import cluster
from tests.k8s.commands import command
from tests.support import secure_kafka as sk

SECRET = "zq9-s3cr3t-token"
PIPELINE_TIMEOUT_S = 120.0
POLL_S = 0.5
# Ed25519 (schemas.chain): the worker's private key; the actuator gets its public key only.
SIGNING_KEY = chain.new_private_pem()
RETIRED_KEY = chain.new_private_pem()


def _pod(
    name: str, ns: str, *, node: str | None, priority_class: str, cpu: str, label: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        "nodeSelector": {"preemptctl.test/node": label},
        # No node-lifecycle controller lifts the taint admission puts on a new node.
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}
        ],
    }
    status: dict[str, Any]
    if node:
        spec["nodeName"] = node
        status = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                  "conditions": [{"type": "PodScheduled", "status": "True"}]}  # fmt: skip
    else:
        status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                      "reason": "Unschedulable"}]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec,
            "status": status}  # fmt: skip


async def _records(kafka: connection.KafkaConfig, topic: str) -> list[reading.Message]:
    return [m async for m in reading.read_all(kafka, topic, read_committed=False)]


async def _eventually(check: Any, what: str, logs: Path, kafka: connection.KafkaConfig, cluster: str) -> Any:
    deadline = time.monotonic() + PIPELINE_TIMEOUT_S
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            # What each component said above DEBUG, and what the worker decided.
            tails = "\n".join(
                f"--- {p.name}\n"
                + "\n".join(
                    line for line in p.read_text(errors="replace").splitlines() if "DEBUG" not in line
                )[-2500:]
                for p in sorted(logs.glob("*.log"))
            )
            decided = [
                {k: v for k, v in orjson.loads(m.value).items() if k in ("outcome", "victims", "explanation")}
                for m in await _records(kafka, topics.DECISIONS)
                if m.key == cluster.encode()
            ]
            logged = [
                e.get("object")
                for m in await _records(kafka, topics.CLUSTER_EVENTS)
                if m.key == cluster.encode()
                for e in orjson.loads(m.value)["events"]
                if e.get("object", {}).get("kind") in ("Pod", "Node")
            ]
            raise AssertionError(f"timed out: {what}\ndecisions: {decided}\nlogged: {logged}\n{tails}")
        await asyncio.sleep(POLL_S)


@contextlib.asynccontextmanager
async def components(
    kafka: sk.SecureKafka,
    kube: cluster.TestCluster,
    tmp: Path,
    *,
    cluster_name: str,
    ns: str,
    groups: dict[str, str],
    ports: dict[str, int],
) -> AsyncIterator[None]:
    private = tmp / "worker-signing"  # the worker's Secret: its private key
    private.mkdir()
    (private / "k1").write_bytes(SIGNING_KEY)
    keys = tmp / "signing"  # the actuator's: public keys only, by key id
    keys.mkdir()
    (keys / "k1").write_bytes(chain.public_pem(SIGNING_KEY))
    props = {}
    for who in ("source", "worker", "actuator"):
        # The password itself is not in the file: it is read from a "mounted Secret" (a directory).
        secret_dir = tmp / f"{who}-user"
        secret_dir.mkdir()
        (secret_dir / "password").write_text(kafka.passwords[who])
        text = kafka.properties(who).replace(
            f"sasl.password={kafka.passwords[who]}", f"sasl.password=${{directory:{secret_dir}:password}}"
        )
        props[who] = tmp / f"{who}.properties"
        props[who].write_text(text)
    common = ("--bootstrap-server", kafka.sasl_bootstrap, "--no-create-topics")
    async with (
        command(
            "source", *common, "--kafka-config", str(props["source"]),
            "--kubeconfig", str(kube.kubeconfig("source")), "--cluster", cluster_name, "--namespace", ns,
            "--tick-seconds", "1", "--health-port", str(ports["source"]), "--health-host", "127.0.0.1",
            "--log-level", "DEBUG", log=tmp / "source.log",
        ),
        command(
            "worker", *common, "--kafka-config", str(props["worker"]), "--store-dir", str(tmp / "store"),
            "--group", groups["worker"], "--processing-guarantee", "exactly_once",
            "--hmac-key-file", str(private / "k1"), "--hmac-key-id", "k1",
            "--health-port", "0", "--health-host", "127.0.0.1", "--log-level", "debug",
            log=tmp / "worker.log",
        ),
        command(
            "actuator", *common, "--kafka-config", str(props["actuator"]),
            "--kubeconfig", str(kube.kubeconfig("actuator")), "--cluster", cluster_name,
            "--group-id", groups["actuator"], "--lag-group", groups["worker"], "--lag-interval-seconds", "1",
            "--signing-keys-dir", str(keys), "--any-scheduler",
            "--health-port", "0", "--health-host", "127.0.0.1", "--log-level", "DEBUG",
            log=tmp / "actuator.log",
        ),
    ):  # fmt: skip
        yield


async def test_the_pipeline_over_sasl_ssl_with_acls_projections_and_signatures(
    kube_cluster: cluster.TestCluster, secure_kafka: sk.SecureKafka, tmp_path: Path
) -> None:
    ns = f"s-{uuid.uuid4().hex[:8]}"
    cluster_name = f"secure-{ns}"
    groups = {"worker": f"worker-{ns}", "actuator": f"actuator-{ns}"}
    admin = secure_kafka.admin_config()
    await topics.ensure_topics(admin)
    grants = {
        "source": acls.required("source"),
        "worker": acls.required("worker", worker_group=groups["worker"]),
        "actuator": acls.required(
            "actuator", worker_group=groups["worker"], actuator_group=groups["actuator"]
        ),
    }
    for who, granted in grants.items():
        await sk.grant(admin, who, granted)

    # The cluster: one node full of pods, a pending pod of higher priority, a pod full of secrets.
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for name, value in ((f"{ns}-low", 100), (f"{ns}-high", 1000)):
        kube_cluster.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": name}, "value": value})  # fmt: skip
    node = f"{ns}-node"
    capacity = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    kube_cluster.apply({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": node, "labels": {"preemptctl.test/node": ns}}})  # fmt: skip
    # A node's status is the kubelet's to write: set through the status subresource.
    kube_cluster.request(
        "PATCH", f"/api/v1/nodes/{node}/status", {"status": {"capacity": capacity, "allocatable": capacity}}
    )
    victims = {
        name: kube_cluster.apply(_pod(name, ns, node=node, priority_class=f"{ns}-low", cpu="1500m", label=ns))
        for name in ("low-a", "low-b")
    }
    secretive = apiserver.dress(
        _pod("secretive", ns, node=node, priority_class=f"{ns}-high", cpu="10m", label=ns), secret=SECRET
    )
    held = kube_cluster.apply(secretive)
    assert SECRET in orjson.dumps(held).decode() and held["metadata"]["managedFields"]

    ports = {"source": free_loopback_port()}
    async with components(
        secure_kafka, kube_cluster, tmp_path, cluster_name=cluster_name, ns=ns, groups=groups, ports=ports
    ):
        # The pending pod comes once the node's pods are in the log (as a scheduler marks a pod
        # unschedulable only after trying the node as it is).
        await _eventually(lambda: _ready(ports["source"]), "the initial list", tmp_path, admin, cluster_name)
        kube_cluster.apply(_pod("high", ns, node=None, priority_class=f"{ns}-high", cpu="2", label=ns))

        async def acted() -> list[dict[str, Any]]:
            found = [orjson.loads(m.value) for m in await _records(admin, topics.EVICTIONS)]
            return [o for o in found if o.get("cluster") == cluster_name and o.get("result") == "done"]

        (outcome,) = await _eventually(acted, "an outcome for the preemption", tmp_path, admin, cluster_name)
        gone = outcome["victim"]["name"]
        assert gone in victims and outcome["action"] == "delete"
        status, pod = _get(kube_cluster, f"/api/v1/namespaces/{ns}/pods/{gone}")
        assert status == 404 or pod["metadata"].get("deletionTimestamp")

        # The decision the actuator acted on was signed by the worker, and names its key.
        decisions = [m for m in await _records(admin, topics.DECISIONS) if m.key == cluster_name.encode()]
        assert decisions and all((signing.KEY_ID_HEADER, b"k1") in m.headers for m in decisions)
        template = orjson.loads(decisions[-1].value)
        assert template["sig"].startswith(chain.ED25519)

        # A principal without Write on decisions cannot write one.
        rogue = secure_kafka.config("rogue")
        producer = rogue.producer()
        await connection.start(rogue, producer)
        try:
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(topics.DECISIONS, decisions[-1].value, key=cluster_name.encode())
        finally:
            await producer.stop()

        # A writer of decisions without an accepted key: refused, dead-lettered, nothing touched.
        spared = next(n for n in victims if n != gone)
        target = victims[spared]
        forged = {**template, "id": f"{cluster_name}/forged/1", "seq": template["seq"] + 1000,
                  "victims": [{"uid": target["metadata"]["uid"], "namespace": ns, "name": spared,
                               "node": node, "priority": 100, "action": "delete"}]}  # fmt: skip
        for field in ("sig", "hash", "prevHash"):
            forged.pop(field, None)
        unsigned = chain.seal(dict(forged), template["hash"])
        retired = chain.seal({**forged, "id": f"{cluster_name}/forged/2"}, template["hash"], RETIRED_KEY)
        producer = admin.producer()
        await connection.start(admin, producer)
        try:
            await producer.send_and_wait(topics.DECISIONS, orjson.dumps(unsigned), key=cluster_name.encode())
            await producer.send_and_wait(
                topics.DECISIONS, orjson.dumps(retired), key=cluster_name.encode(),
                headers=[(signing.KEY_ID_HEADER, b"k0")],
            )  # fmt: skip
        finally:
            await producer.stop()

        async def refused() -> list[bytes]:
            letters = await _records(admin, topics.DEAD_LETTER)
            ours = [m for m in letters if m.key == cluster_name.encode()]
            found = [dict(m.headers).get("error-class", b"") for m in ours]
            return found if len(found) >= 2 else []

        assert sorted(await _eventually(refused, "two dead letters", tmp_path, admin, cluster_name)) == [
            b"UnacceptedKey",
            b"UnsignedDecision",
        ]
        status, still = _get(kube_cluster, f"/api/v1/namespaces/{ns}/pods/{spared}")
        assert status == 200 and not still["metadata"].get("deletionTimestamp")

        # The secret is in no record of any topic: values, keys, headers.
        for topic in topics.DEFAULT_NAMES.all():
            for m in await _records(admin, topic):
                blob = b"".join([m.key or b"", m.value, *(k.encode() + v for k, v in m.headers)])
                assert SECRET.encode() not in blob, f"{topic}@{m.offset} holds the secret"
        # ... while the source did write the pod (its projection).
        events = [orjson.loads(m.value) for m in await _records(admin, topics.CLUSTER_EVENTS)
                  if m.key == cluster_name.encode()]  # fmt: skip
        written = [e["object"] for r in events for e in r["events"]
                   if e.get("object", {}).get("metadata", {}).get("name") == "secretive"]  # fmt: skip
        assert written and "env" not in written[-1]["spec"]["containers"][0]

    # No component logged a secret (at DEBUG).
    # The private key's body (its PEM lines between the armour).
    private_body = [line for line in SIGNING_KEY.decode().splitlines() if not line.startswith("-----")]
    assert private_body
    secrets = [*secure_kafka.passwords.values(), secure_kafka.pki.password, *private_body]
    for log in sorted(tmp_path.glob("*.log")):
        text = log.read_text(errors="replace")
        assert text, log
        for secret in secrets:
            assert secret not in text, f"{log.name} logs a secret"


async def _ready(port: int) -> bool:
    try:
        return int(await asyncio.to_thread(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{port}/readyz", timeout=2).status)) == 200  # fmt: skip
    except OSError:
        return False


def _get(kube: cluster.TestCluster, path: str) -> tuple[int, Any]:
    try:
        return 200, kube.request("GET", path)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return 404, None
        raise
