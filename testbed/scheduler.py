"""A real kube-scheduler v1.34.2 against the test API server (testbed/cluster.py).

The binary is built by deploy/kube/build-scheduler.sh (make kube-tools): plain
kube-scheduler v1.34.2 with scheduler-plugins' PreemptionToleration registered,
so one binary serves the end-to-end tests (tests/e2e, a profile with
DefaultPreemption off for preemptctl beside the default one) and the parity
tests (tests/parity: DefaultPreemption, and PreemptionToleration in its place).
A profile that does not enable the plugin is plain kube-scheduler.

`KubeScheduler(cluster, profiles)` writes a KubeSchedulerConfiguration with the
given profiles, leader election off (one scheduler per test control plane) and
a serving port of its own, runs the binary as the cluster's admin, and waits
for /healthz. Its log is kept in the cluster's directory for failures.
"""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from streams.brokers.process import free_loopback_port
from testbed import cluster as cluster_mod
from testbed import lifecycle

PLUGINS_VERSION = "0.34.7"
SCHEDULER = cluster_mod.CACHE / f"kube-scheduler-v{cluster_mod.KUBE_VERSION}-plugins-v{PLUGINS_VERSION}"
# Ready in ~1 s on idle cores; a loaded CI machine gets far more before the start counts as failed.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0

# The profile docs/deploy.md gives for the pods preemptctl decides for: kube-scheduler
# filters, scores and binds them, and DefaultPreemption (its only PostFilter) is off, so
# preemptctl is their one decider.
PREEMPTCTL_PROFILE: dict[str, Any] = {
    "schedulerName": "preemptctl-scheduler",
    "plugins": {"postFilter": {"disabled": [{"name": "DefaultPreemption"}]}},
}
DEFAULT_PROFILE: dict[str, Any] = {"schedulerName": "default-scheduler"}
# scheduler-plugins' PreemptionToleration in DefaultPreemption's place, exactly as its README
# (pkg/preemptiontoleration/README.md, v0.34.7) enables it; its args default through the
# scheme the build registers (MinCandidateNodesPercentage 10, Absolute 100, as DefaultPreemption).
TOLERATION_PROFILE: dict[str, Any] = {
    "schedulerName": "toleration-scheduler",
    "plugins": {
        "postFilter": {
            "enabled": [{"name": "PreemptionToleration"}],
            "disabled": [{"name": "DefaultPreemption"}],
        }
    },
}


class Unavailable(cluster_mod.Unavailable):
    """The kube-scheduler binary is not built (make kube-tools builds it)."""


def binary() -> Path:
    if not SCHEDULER.exists():
        raise Unavailable(f"{SCHEDULER} not built (make kube-tools: deploy/kube/build-scheduler.sh)")
    return SCHEDULER


@dataclass
class KubeScheduler(lifecycle.Lifecycle):
    """`with KubeScheduler(cluster, [profiles]) as s:` runs kube-scheduler until the block ends."""

    cluster: cluster_mod.TestCluster
    profiles: list[dict[str, Any]] = field(default_factory=lambda: [DEFAULT_PROFILE])
    name: str = "kube-scheduler"
    extra_args: tuple[str, ...] = ()
    port: int = 0
    _process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.cluster.root / f"{self.name}.log"

    def start(self) -> None:
        program = binary()
        root = self.cluster.root
        config = root / f"{self.name}-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.cluster.kubeconfig("admin"))},
                    "leaderElection": {"leaderElect": False},
                    "profiles": self.profiles,
                }
            )
        )
        self.port = free_loopback_port()
        self._process = lifecycle.spawn(
            [
                program,
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={root / (self.name + '-certs')}",
                *self.extra_args,
            ],
            self.log_path,
            cwd=root,
        )
        lifecycle.wait_ready(
            self._healthy, self.name, START_TIMEOUT_S, children=[self._process], tail=self.log_tail
        )

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            lifecycle.terminate(process, STOP_TIMEOUT_S)

    def _healthy(self) -> bool:
        # The serving certificate is the scheduler's own self-signed one.
        context = ssl._create_unverified_context()
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}/healthz", context=context, timeout=5
            ) as response:
                return bool(response.read() == b"ok")
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        return lifecycle.log_tail(self.log_path, lines)
