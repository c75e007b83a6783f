"""The chart installed by the real helm into the real kube-apiserver (testbed/cluster.py).

- as a dependency of an umbrella chart (no globals set, as Argo CD and Flux users start): it
  installs, with its values under the dependency's key;
- `helm install` without the actuator's mode creates nothing; dry-run then act is what the
  actuator's arguments say;
- `helm upgrade` with engine config changes the file the worker reads as --config, and the
  worker's pod template (so the StatefulSet rolls onto it); the worker's own config loading
  reads the new file as the new config.
- two releases in one namespace: each component of each release, with its own ServiceAccount's
  token and the Lease its Deployment names, leads (the project's LeaseElector), and none may touch
  the other release's Lease;
- two aliases of the chart in one umbrella release: what each alias's Deployments, StatefulSets,
  Services, NetworkPolicies and PodDisruptionBudgets select, asked of the API server, is its own
  pods only, and a drain's eviction of every pod goes through (one budget per pod);
- a PKCS12 keystore on the read-only root filesystem of the stored pod templates (tests/k8s/
  helm.py builds the filesystem from the mounts).

No kubelet or controller-manager runs: the objects are what the API server stored.
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import urllib.error
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client.exceptions import ApiException

from streams.common import options
from streams.kube import api as kube
from streams.kube import lease
from testbed import cluster
from tests.k8s.helm import (
    ALIAS_VALUES,
    CHART,
    HELM_TIMEOUT_S,
    SELECTING,
    cli,
    keystore,
    selector_of,
    start_with_keystore,
    umbrella,
)


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

    assert helm.names("/apis/apps/v1/namespaces/{ns}/deployments") == ["platform-source"]
    assert helm.names("/apis/apps/v1/namespaces/{ns}/statefulsets") == [
        "platform-actuator",
        "platform-worker",
    ]
    actuator = helm.get("/apis/apps/v1/namespaces/{ns}/statefulsets/platform-actuator")
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
        found = helm.get("/apis/apps/v1/namespaces/{ns}/statefulsets/pc-actuator")
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


# ---- many installs in one namespace -----------------------------------------------------------


def service_account_kubeconfig(helm: Helm, account: str, path: Path) -> Path:
    """A kubeconfig authenticating as `account` of the test namespace: a token from the API
    server's TokenRequest, as the kubelet mounts one into a pod (no controller-manager needed)."""
    token = helm.cluster.request(
        "POST",
        f"/api/v1/namespaces/{helm.namespace}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )["status"]["token"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {
                            "server": helm.cluster.url,
                            "certificate-authority": str(helm.cluster.ca_file),
                        },
                    }
                ],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": account}}],
                "current-context": "test",
            }
        )
    )
    return path


def deployment_args(helm: Helm, name: str) -> tuple[str, Any]:
    """(the pod template's ServiceAccount, its parsed args) of a stored Deployment or StatefulSet
    (the actuator is one since its ledger moved to a volume)."""
    kind = "statefulsets" if name.endswith("-actuator") else "deployments"
    pod = helm.get(f"/apis/apps/v1/namespaces/{{ns}}/{kind}/{name}")["spec"]["template"]["spec"]
    return pod["serviceAccountName"], cli().parse_args(pod["containers"][0]["args"])


async def test_two_releases_in_one_namespace_both_lead(helm: Helm, tmp_path: Path) -> None:
    for release in ("pc-a", "pc-b"):
        helm.install(release, CHART, "--set", "actuator.mode=dry-run")
    electors: dict[str, lease.LeaseElector] = {}
    apis = []
    try:
        for release in ("pc-a", "pc-b"):
            for component in ("source", "actuator"):
                account, args = deployment_args(helm, f"{release}-{component}")
                assert args.lease_namespace == helm.namespace
                config = service_account_kubeconfig(helm, account, tmp_path / f"{release}-{component}")
                api = await kube.connect(str(config))
                apis.append(api)
                electors[f"{release}-{component}"] = lease.LeaseElector(
                    api,
                    name=args.lease_name,
                    namespace=args.lease_namespace,
                    identity=f"{release}-{component}-0",
                    component=component,
                    lease_duration_s=args.lease_duration,
                    renew_deadline_s=args.renew_deadline,
                    retry_period_s=args.retry_period,
                )
        # Every one leads at once: four Leases, one holder each.
        for name, elector in electors.items():
            assert await elector.try_acquire_or_renew(), name
        assert all(e.is_leader() for e in electors.values())
        held = {
            item["metadata"]["name"]: item["spec"]["holderIdentity"]
            for item in helm.get("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases")["items"]
        }
        assert held == {f"{n}": f"{n}-0" for n in electors}
        # And neither release's identity may take the other's Lease (its Role names its own only).
        intruder = lease.LeaseElector(
            apis[0], name=electors["pc-b-source"].name, namespace=helm.namespace, identity="intruder"
        )
        with pytest.raises(ApiException) as refused:
            await intruder.try_acquire_or_renew()
        assert refused.value.status == 403
    finally:
        for elector in electors.values():
            await elector.release()
        await asyncio.gather(*(api.close() for api in apis))


def _selected(helm: Helm, selector: dict[str, str]) -> set[str]:
    query = urllib.parse.quote(",".join(f"{k}={v}" for k, v in sorted(selector.items())))
    found = helm.get(f"/api/v1/namespaces/{{ns}}/pods?labelSelector={query}")["items"]
    return {p["metadata"]["name"] for p in found}


def test_two_aliases_in_one_umbrella_keep_their_selectors_apart(helm: Helm, tmp_path: Path) -> None:
    chart = umbrella(
        tmp_path / "platform",
        {"sched-a": {**ALIAS_VALUES, "cluster": "a"}, "sched-b": {**ALIAS_VALUES, "cluster": "b"}},
    )
    helm.install("platform", chart)
    workloads = {
        **{d["metadata"]["name"]: d for d in helm.get("/apis/apps/v1/namespaces/{ns}/deployments")["items"]},
        **{d["metadata"]["name"]: d for d in helm.get("/apis/apps/v1/namespaces/{ns}/statefulsets")["items"]},
    }
    assert len(workloads) == 6
    # One running pod per workload, labelled by its template (no controller-manager or kubelet here).
    for name, workload in workloads.items():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        helm.cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-0", "namespace": helm.namespace, "labels": labels},
                "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "preemptctl"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
    collections = {
        "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
        "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
        "Service": "/api/v1/namespaces/{ns}/services",
        "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
        "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    }
    assert set(collections) == set(SELECTING)
    seen = 0
    for kind, collection in collections.items():
        for obj in helm.get(collection)["items"]:
            obj["kind"] = kind
            component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            own = obj["metadata"]["name"].rsplit("-", 1)[0] + f"-{component}-0"
            assert _selected(helm, selector_of(obj)) == {own}, (kind, obj["metadata"]["name"])
            seen += 1
    assert seen == 6 + 6 + 6 + 6  # workloads, Services, NetworkPolicies, budgets
    # A drain: the disruption controller's status on each budget, then every pod evicted.
    for budget in helm.get(collections["PodDisruptionBudget"])["items"]:
        name = budget["metadata"]["name"]
        helm.cluster.request(
            "PATCH",
            f"/apis/policy/v1/namespaces/{helm.namespace}/poddisruptionbudgets/{name}/status",
            {"status": {"observedGeneration": budget["metadata"]["generation"], "disruptionsAllowed": 1,
                        "currentHealthy": 1, "desiredHealthy": 0, "expectedPods": 1}},
        )  # fmt: skip
    for name in workloads:
        pod = f"{name}-0"
        try:
            helm.cluster.request(
                "POST",
                f"/api/v1/namespaces/{helm.namespace}/pods/{pod}/eviction",
                {"apiVersion": "policy/v1", "kind": "Eviction",
                 "metadata": {"name": pod, "namespace": helm.namespace}},
            )  # fmt: skip
        except urllib.error.HTTPError as exc:
            pytest.fail(f"evicting {pod}: {exc.code} {exc.read().decode()}")
    assert helm.get("/api/v1/namespaces/{ns}/pods")["items"] == [] or all(
        p["metadata"].get("deletionTimestamp") for p in helm.get("/api/v1/namespaces/{ns}/pods")["items"]
    )


def test_a_pkcs12_source_starts_on_its_read_only_root(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored pod templates (what the API server admitted, defaults filled in) give every
    component a writable /tmp, where the Kafka client writes a PKCS12 keystore's chain."""
    helm.install("pc", CHART, "--set", "actuator.mode=dry-run")
    store = keystore(tmp_path)
    for kind, name in (
        ("deployments", "pc-source"),
        ("statefulsets", "pc-actuator"),
        ("statefulsets", "pc-worker"),
    ):
        workload = helm.get(f"/apis/apps/v1/namespaces/{{ns}}/{kind}/{name}")
        scratch = tmp_path / name
        scratch.mkdir()
        assert start_with_keystore(workload, store, scratch, monkeypatch).ssl_context is not None, name
