"""`preemptctl source` as a process: kubeconfig, topics, probes, signals.

The command runs in a child process against the kmock API server (through a
kubeconfig file) and the embedded broker, is watched through its /readyz and
/metrics, and is stopped with SIGTERM, as a kubelet would. `preemptctl actuator`
runs as two such processes against a real API server in tests/k8s/test_real_api.py
(the Lease failover with one frozen). The helpers are tests/k8s/commands.py's.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from kubernetes_asyncio import client

from streams.brokers import process as process_mod
from tests.k8s import objects
from tests.k8s.cluster_events import read_topic
from tests.k8s.commands import command, kubeconfig, metric, ready, stop, until
from tests.k8s.fakeapi import FakeApi


async def test_source_command(served: tuple[FakeApi, client.ApiClient], tansu: str, tmp_path: Path) -> None:
    fake, api = served
    fake.create("nodes", objects.node("n1"))
    fake.create("pods", objects.pod("a", node="n1"))
    port = process_mod.free_loopback_port()
    config = kubeconfig(tmp_path, api)
    async with command(
        "source", "--broker", f"kafka://{tansu}", "--kubeconfig", str(config), "--cluster", "cmd-test",
        "--health-port", str(port), "--health-host", "127.0.0.1", "--tick-seconds", "0.2",
    ) as process:  # fmt: skip
        await until(lambda: ready(port), "source ready", process)
        assert await metric(port, "preemptctl_source_records_total") >= 3  # RESYNC, n1, a
        fake.create("pods", objects.pod("b", node="n1"))
        _, raw = await read_topic(
            tansu,
            "preemption.cluster-events",
            lambda evs: "b" in {e.get("object", {}).get("metadata", {}).get("name") for e in evs},
        )
        stderr = await stop(process)
    ours = [orjson.loads(v) for k, v in raw if k == b"cmd-test"]
    assert ours[0]["events"][0]["type"] == "RESYNC"
    assert "initial list written: 2 objects" in stderr
