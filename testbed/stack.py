"""The whole loop on a real control plane, for tests/e2e and benchmarks/e2e.py.

`ControlPlane`: kube-apiserver + etcd (testbed/cluster.py) with the chart's
RBAC, kube-scheduler v1.34.2 with both profiles of docs/deploy.md (preemptctl's,
DefaultPreemption off, and the default one), and kwok v0.7.0 faking every node
and the lifecycle of the pods bound to them (Running once bound, gone once
deleted). No kubelet, controller-manager or disruption controller runs: a test
sets a PDB's status itself.

`Stack`: preemptctl's source, worker and actuator as processes, exactly as
deployed (each its own command, the source and actuator with the chart's
ServiceAccount identities), on one broker, for one cluster name and one
namespace. Processes log to files in the stack's directory; `dump()` prints
their tails for a failing test.

Both are `testbed.lifecycle.Lifecycle`s: `with` starts them and stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from schemas import chain
from streams.brokers import process as process_mod
from streams.kafka import reading, topics
from testbed import cluster as cluster_mod
from testbed import lifecycle
from testbed import scheduler as scheduler_mod

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "preemptctl"
KWOK_VERSION = "0.7.0"
KWOK = cluster_mod.CACHE / f"kwok-v{KWOK_VERSION}"
PREEMPTCTL_SCHEDULER = str(scheduler_mod.PREEMPTCTL_PROFILE["schedulerName"])
# A component imports, connects, lists and joins its consumer group within this on a
# loaded 2-core machine (tansu's group join alone takes about half a session timeout).
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
# The log's clock: a pending preemptor due again is decided at the next event, so ticks
# this short keep a re-decision within a fraction of a second of kube-scheduler's backoff.
TICK_SECONDS = "0.5"
# The worker's signing key's id (its file's name in both the worker's and the actuator's dirs).
SIGNING_KEY_ID = "e2e"

T = TypeVar("T")


class Unavailable(cluster_mod.Unavailable):
    """kwok is not built (make kube-tools: deploy/kube/build-kwok.sh)."""


def kwok_binary() -> Path:
    if not KWOK.exists():
        raise Unavailable(f"{KWOK} not built (make kube-tools: deploy/kube/build-kwok.sh)")
    return KWOK


def wait_for(check: Callable[[], T | None], what: str, timeout_s: float, *, every_s: float = 0.2) -> T:
    """Poll `check` until it returns something truthy; AssertionError naming `what` past the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)


@dataclass
class ControlPlane(lifecycle.Lifecycle):
    """kube-apiserver + etcd + kube-scheduler + kwok; `with ControlPlane() as cp:`."""

    cluster: cluster_mod.TestCluster = field(
        default_factory=lambda: cluster_mod.TestCluster(
            disable_admission=("TaintNodesByCondition",),
            extra_args=("--feature-gates=WatchList=false",),
        )
    )
    scheduler: scheduler_mod.KubeScheduler | None = None
    _kwok: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ControlPlane:
        # Missing tools are said before anything starts: nothing to stop then.
        kwok_binary()
        scheduler_mod.binary()
        return super().__enter__()

    def start(self) -> None:
        self.cluster.start()
        cluster_mod.install_chart(self.cluster, CHART)
        self._kwok = lifecycle.spawn(
            [kwok_binary(), f"--kubeconfig={self.cluster.kubeconfig('admin')}", "--manage-all-nodes=true"],
            self.cluster.root / "kwok.log",
            cwd=self.cluster.root,
        )
        self.scheduler = scheduler_mod.KubeScheduler(
            self.cluster, [scheduler_mod.PREEMPTCTL_PROFILE, scheduler_mod.DEFAULT_PROFILE]
        )
        self.scheduler.start()

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        kwok, self._kwok = self._kwok, None
        if kwok is not None:
            lifecycle.terminate(kwok, STOP_TIMEOUT_S)
        self.cluster.stop()

    # ---- objects --------------------------------------------------------------------

    def get(self, path: str) -> Any:
        try:
            return self.cluster.request("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return found

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        items: list[dict[str, Any]] = self.get(f"/api/v1/namespaces/{namespace}/pods{query}")["items"]
        return items

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.cluster.request("POST", _collection(obj), obj)
        return created

    def patch(self, obj: dict[str, Any], body: dict[str, Any], *, subresource: str = "") -> Any:
        path = (
            cluster_mod.api_path(obj)
            + f"/{obj['metadata']['name']}"
            + (f"/{subresource}" if subresource else "")
        )
        return self.cluster.request("PATCH", path, body)

    def delete(self, obj: dict[str, Any]) -> None:
        with contextlib.suppress(urllib.error.HTTPError):
            self.cluster.request("DELETE", cluster_mod.api_path(obj) + f"/{obj['metadata']['name']}")

    def ready_node(self, name: str) -> bool:
        node = self.get(f"/api/v1/nodes/{name}")
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def dump(self) -> str:
        parts = [f"--- {name} ---\n{self.cluster.log_tail(name, 15)}" for name in ("kwok", "kube-apiserver")]
        if self.scheduler is not None:
            parts.append(f"--- kube-scheduler ---\n{self.scheduler.log_tail(15)}")
        return "\n".join(parts)


def _collection(obj: dict[str, Any]) -> str:
    return cluster_mod.api_path(obj)


# ---- preemptctl --------------------------------------------------------------------------


COMPONENTS = ("source", "worker", "actuator")  # in the order they start


@dataclass
class Stack(lifecycle.Lifecycle):
    """source, worker and actuator for `cluster` (the record key) on `bootstrap`, watching `namespace`."""

    plane: ControlPlane
    bootstrap: str
    cluster: str
    namespace: str
    config: dict[str, Any] = field(default_factory=dict)  # the worker's engine config
    # Topics of its own on a shared broker: the session's Apache Kafka also serves the
    # integration tests, whose clusters this stack's worker must not decide (and sign) for.
    topic_prefix: str = ""
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="preemptctl-e2e-")))
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    generation: int = 0  # processes started so far: each start gets a fresh log name
    generations: dict[str, int] = field(default_factory=dict)  # component -> its current log's number

    def __post_init__(self) -> None:
        # Signed as deployed (Ed25519): the worker holds the private key, the actuator only the
        # public one, in a keys dir as the chart mounts its Secret (the file's name is the key id).
        private = chain.new_private_pem()
        (self.root / "worker-key").mkdir(exist_ok=True)
        (self.root / "worker-key" / SIGNING_KEY_ID).write_bytes(private)
        (self.root / "signing-keys").mkdir(exist_ok=True)
        (self.root / "signing-keys" / SIGNING_KEY_ID).write_bytes(chain.public_pem(private))

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        shutil.rmtree(self.root, ignore_errors=True)

    def argv(self, component: str) -> list[str]:
        broker = f"kafka://{self.bootstrap}"
        health = ["--health-port", str(self.ports[component]), "--health-host", "127.0.0.1"]
        if self.topic_prefix:
            health = [*health, "--topic-prefix", self.topic_prefix]
        if component == "source":
            return [
                "source", "--broker", broker, "--kubeconfig", str(self.plane.cluster.kubeconfig("source")),
                "--cluster", self.cluster, "--namespace", self.namespace,
                "--scheduler-name", PREEMPTCTL_SCHEDULER, "--tick-seconds", TICK_SECONDS, *health,
            ]  # fmt: skip
        if component == "worker":
            config = self.root / "engine.yaml"
            config.write_bytes(orjson.dumps(self.config))
            return [
                "worker", "--broker", broker, "--store-dir", str(self.root / "store"),
                "--group-id", f"e2e-worker-{self.cluster}", "--config", str(config),
                "--hmac-key-file", str(self.root / "worker-key" / SIGNING_KEY_ID), *health,
            ]  # fmt: skip
        return [
            "actuator", "--broker", broker, "--kubeconfig", str(self.plane.cluster.kubeconfig("actuator")),
            "--cluster", self.cluster, "--scheduler-name", PREEMPTCTL_SCHEDULER,
            "--group-id", f"e2e-actuator-{self.cluster}", "--identity", f"e2e-{self.cluster}",
            "--ledger-file", str(self.root / "actuator-ledger.jsonl"),  # as the chart runs it
            "--signing-keys-dir", str(self.root / "signing-keys"), *health,
        ]  # fmt: skip

    def start(self, *components: str) -> None:
        """Start `components` (all three, in order, when none is named), each ready before the next."""
        for component in components or COMPONENTS:
            self._start(component)

    def _start(self, component: str) -> None:
        self.ports[component] = process_mod.free_loopback_port()
        self.generation += 1
        self.generations[component] = self.generation
        process = lifecycle.spawn(
            [sys.executable, "-m", "streams.cli", *self.argv(component)],
            self.root / f"{component}-{self.generation}.log",
            start_new_session=True,
            env=dict(os.environ),
            cwd=self.root,  # the faust app writes its `<group>-data` folder in its working directory
        )
        self.processes[component] = process
        lifecycle.wait_ready(
            lambda: self._ready(component),
            component,
            START_TIMEOUT_S,
            children=[process],
            tail=self.dump,
            every_s=0.2,
            error=AssertionError,
        )

    def _ready(self, component: str) -> bool:
        try:
            url = f"http://127.0.0.1:{self.ports[component]}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def kill(self, component: str, sig: signal.Signals = signal.SIGKILL) -> None:
        lifecycle.terminate(self.processes.pop(component), STOP_TIMEOUT_S, sig=sig, group=True)

    def pause(self, component: str) -> None:
        os.killpg(self.processes[component].pid, signal.SIGSTOP)

    def resume(self, component: str) -> None:
        os.killpg(self.processes[component].pid, signal.SIGCONT)

    def stop(self) -> None:
        for component in ("source", "actuator", "worker"):
            if component in self.processes:
                with contextlib.suppress(ProcessLookupError):
                    self.resume(component)
                self.kill(component, signal.SIGTERM)

    def log(self, component: str) -> str:
        """What the component's current process has logged so far."""
        path = self.root / f"{component}-{self.generations[component]}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def dump(self) -> str:
        parts = []
        for log in sorted(self.root.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-25:]
            parts.append(f"--- {log.name} ---\n" + "\n".join(lines))
        return "\n".join(parts)

    # ---- what the pipeline wrote ----------------------------------------------------------

    def read(self, topic: str) -> list[Any]:
        """Every record of `topic` for this stack's cluster, decoded, in log order."""

        async def _read() -> list[Any]:
            out = []
            async for m in reading.read_all(self.bootstrap, topic):
                value = orjson.loads(m.value)
                if value.get("cluster") == self.cluster:
                    out.append(value)
            return out

        return asyncio.run(_read())

    @property
    def names(self) -> topics.Names:
        return topics.Names(self.topic_prefix) if self.topic_prefix else topics.DEFAULT_NAMES

    def decisions(self) -> list[dict[str, Any]]:
        return self.read(self.names.decisions)

    def evictions(self) -> list[dict[str, Any]]:
        return self.read(self.names.evictions)

    def events(self) -> list[dict[str, Any]]:
        return [e for batch in self.read(self.names.cluster_events) for e in batch["events"]]


@contextlib.contextmanager
def stack(plane: ControlPlane, bootstrap: str, cluster: str, namespace: str, **kw: Any) -> Iterator[Stack]:
    with contextlib.suppress(urllib.error.HTTPError):  # 409: another stack's namespace already
        plane.cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    with Stack(plane, bootstrap, cluster, namespace, **kw) as running:
        yield running
