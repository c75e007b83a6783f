"""The chart installed by the real helm into the real kube-apiserver (tests/k8s/cluster.py).

- as a dependency of an umbrella chart (no globals set, as Argo CD and Flux users start): it
  installs, with its values under the dependency's key;
- `helm install` without the actuator's mode creates nothing; dry-run then act is what the
  actuator's arguments say;
- `helm upgrade` with engine config changes the file the worker reads as --config, and the
  worker's pod template (so the StatefulSet rolls onto it); the worker's own config loading
  reads the new file as the new config.

No kubelet or controller-manager runs: the objects are what the API server stored.
"""

from __future__ import annotations

import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.common import options
from tests.k8s import cluster
from tests.k8s.conftest import CHART
from tests.k8s.test_deploy import HELM_TIMEOUT_S, cli


class Helm:
    """The real helm against the test API server, as its admin, in one fresh namespace."""

    def __init__(self, kube_cluster: cluster.TestCluster) -> None:
        self.cluster = kube_cluster
        self.binary = str(cluster.tool("helm"))
        self.namespace = f"chart-{uuid.uuid4().hex[:8]}"
        self.releases: list[str] = []

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [
            self.binary,
            *args,
            "-n",
            self.namespace,
            "--kubeconfig",
            str(self.cluster.kubeconfig("admin")),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False)
        if ok:
            assert done.returncode == 0, f"{shlex.join(args)}: {done.stderr}"
        return done

    def install(
        self, release: str, chart: Path, *args: str, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = self("install", release, str(chart), "--create-namespace", *args, ok=ok)
        if done.returncode == 0:
            self.releases.append(release)
        return done

    def get(self, path: str) -> dict[str, Any]:
        found: dict[str, Any] = self.cluster.request("GET", path.format(ns=self.namespace))
        return found

    def names(self, collection: str) -> list[str]:
        items = self.cluster.request("GET", collection.format(ns=self.namespace))["items"]
        return sorted(i["metadata"]["name"] for i in items)

    def uninstall(self) -> None:
        for release in self.releases:
            self("uninstall", release, ok=False)


@pytest.fixture
def helm(kube_cluster: cluster.TestCluster) -> Iterator[Helm]:
    running = Helm(kube_cluster)
    try:
        yield running
    finally:
        running.uninstall()


def test_installs_as_a_dependency_of_an_umbrella_chart(helm: Helm, tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    umbrella = tmp_path / "platform"
    (umbrella / "templates").mkdir(parents=True)
    (umbrella / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [
                    {"name": "preemptctl", "version": chart["version"], "repository": f"file://{CHART}"}
                ],
            }
        )
    )
    # What a platform team writes: the subchart's values under its key, no globals at all.
    (umbrella / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "preemptctl": {
                    "actuator": {"mode": "dry-run"},
                    "kafka": {"bootstrapServers": "kafka.platform:9092"},
                }
            }
        )
    )
    built = subprocess.run(
        [helm.binary, "dependency", "build", str(umbrella)],
        capture_output=True,
        text=True,
        timeout=HELM_TIMEOUT_S,
    )
    assert built.returncode == 0, built.stderr
    assert [p.name for p in (umbrella / "charts").iterdir()] == [f"preemptctl-{chart['version']}.tgz"]
    lint = helm("lint", "--strict", str(umbrella))
    assert "0 chart(s) failed" in lint.stdout
    helm.install("platform", umbrella)

    assert helm.names("/apis/apps/v1/namespaces/{ns}/deployments") == ["platform-actuator", "platform-source"]
    assert helm.names("/apis/apps/v1/namespaces/{ns}/statefulsets") == ["platform-worker"]
    actuator = helm.get("/apis/apps/v1/namespaces/{ns}/deployments/platform-actuator")
    args = cli().parse_args(actuator["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.dry_run and args.bootstrap_server == "kafka.platform:9092"
    # Cluster-scoped RBAC carries the namespace: this release beside the session's own "pc".
    role = helm.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{helm.namespace}-platform-actuator")
    assert role["metadata"]["labels"]["helm.sh/chart"] == f"preemptctl-{chart['version']}"


def test_nothing_acts_until_the_mode_is_chosen(helm: Helm) -> None:
    refused = helm.install("pc", CHART, ok=False)
    assert refused.returncode != 0
    assert "actuator.mode must be chosen" in refused.stderr
    assert helm("status", "pc", ok=False).returncode != 0  # no release was recorded
    assert helm.names("/apis/apps/v1/namespaces/{ns}/deployments") == []

    def actuator_args() -> list[str]:
        found = helm.get("/apis/apps/v1/namespaces/{ns}/deployments/pc-actuator")
        return list(found["spec"]["template"]["spec"]["containers"][0]["args"])

    helm.install("pc", CHART, "--set", "actuator.mode=dry-run")
    assert cli().parse_args(actuator_args()).dry_run is True
    helm("upgrade", "pc", str(CHART), "--reset-then-reuse-values", "--set", "actuator.mode=act")
    assert cli().parse_args(actuator_args()).dry_run is False


def test_helm_upgrade_with_engine_config_changes_the_workers_config(helm: Helm, tmp_path: Path) -> None:
    helm.install("pc", CHART, "--set", "actuator.mode=dry-run")
    statefulset = "/apis/apps/v1/namespaces/{ns}/statefulsets/pc-worker"

    def worker_config() -> tuple[str, Any]:
        """The pod template's config checksum, and the config the worker loads from its --config,
        read from the mounted ConfigMap as the kubelet would place it."""
        worker = helm.get(statefulset)["spec"]["template"]
        (main,) = worker["spec"]["containers"]
        args = cli().parse_args(main["args"])
        mount = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}["engine"]
        volume = {v["name"]: v for v in worker["spec"]["volumes"]}["engine"]
        data = helm.get(f"/api/v1/namespaces/{{ns}}/configmaps/{volume['configMap']['name']}")["data"]
        relative = Path(args.config).relative_to(mount)
        file = tmp_path / relative
        file.write_text(data[str(relative)])
        return worker["metadata"]["annotations"]["preemptctl.io/config-checksum"], options.load_config(
            str(file)
        )

    before_checksum, before = worker_config()
    assert before.victim_selection == "kubernetes" and before.victim_action == "delete"
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "victimSelection": "minimal",
                    "victimAction": "evict",
                    "daemonset": {"maxVictims": 2},
                }
            }
        )
    )
    helm("upgrade", "pc", str(CHART), "--reset-then-reuse-values", "-f", str(engine))
    after_checksum, after = worker_config()
    assert (after.victim_selection, after.victim_action, after.daemonset.max_victims) == (
        "minimal",
        "evict",
        2,
    )
    assert after.hash() != before.hash()
    assert after_checksum != before_checksum  # a new pod template: the StatefulSet rolls the workers
    # The schema refuses a config the worker would refuse, before anything reaches the cluster.
    refused = helm(
        "upgrade",
        "pc",
        str(CHART),
        "--reset-then-reuse-values",
        "--set",
        "config.victimSelection=best",
        ok=False,
    )
    assert refused.returncode != 0 and "victimSelection" in refused.stderr
    assert worker_config()[0] == after_checksum
