"""The chart as the real helm renders it, for every test of the chart (tests/k8s/test_deploy.py,
test_chart_*.py, and the monitoring and version tests that read the rendered objects).

- `values(**overrides)`, `DEFAULTS`, `EVERYTHING`: values.yaml, with `a__b=value` overrides;
- `helm_template`, `manifests`: `helm template` of the chart as release "pc" in "preemption",
  and its objects; `by_kind`, `container`: picking them apart;
- `cli()`: the real command line the rendered args are parsed with;
- `public_pem`: a fixed Ed25519 public key, as signing.publicKeys takes it;
- `umbrella`, `ALIAS_VALUES`, `SELECTING`, `selector_of`: the chart as a dependency of an
  umbrella chart, once per alias, and what selects each alias's pods;
- `keystore`, `start_with_keystore`: a PKCS12 keystore loaded on the filesystem a pod spec gives
  (its root read-only).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import importlib
import importlib.util
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from schemas import chain
from streams.cli import actuator as actuator_cli
from streams.cli import source as source_cli
from streams.kafka import connection
from testbed import cluster
from tests.support import tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "preemptctl"
RELEASE = {"Name": "pc", "Namespace": "preemption", "Service": "Helm"}
# `helm template` of this chart takes well under a second; a loaded machine gets far more.
HELM_TIMEOUT_S = 120


@functools.cache
def helm() -> str:
    try:
        return str(cluster.tool("helm"))
    except cluster.Unavailable as exc:
        tools.unavailable(str(exc))


def values(**overrides: Any) -> dict[str, Any]:
    """values.yaml with `a__b=value` overrides (the actuator's required mode defaults to dry-run here)."""
    merged: dict[str, Any] = copy.deepcopy(yaml.safe_load((CHART / "values.yaml").read_text()))
    merged["actuator"]["mode"] = "dry-run"
    for dotted, value in overrides.items():
        target = merged
        *parents, leaf = dotted.split("__")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return merged


def helm_template(
    chart_values: dict[str, Any] | None, *args: str, chart: Path = CHART
) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        file.write(yaml.safe_dump(chart_values or {}))
        file.flush()
        return subprocess.run(
            [helm(), "template", RELEASE["Name"], str(chart), "--namespace", RELEASE["Namespace"],
             "-f", file.name, *args],
            capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False,
        )  # fmt: skip


def manifests(chart_values: dict[str, Any], *args: str) -> list[dict[str, Any]]:
    rendered = helm_template(chart_values, *args)
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d is not None]


def public_pem(seed: int) -> str:
    """A fixed Ed25519 key's public key (PEM), as signing.publicKeys takes it."""
    private = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    return chain.public_pem(private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())).decode()


DEFAULTS = values()
EVERYTHING = values(
    signing={"enabled": True, "mode": "ed25519", "existingSecret": "preemptctl-keys", "keyIds": ["k1", "k2"],
             "activeKeyId": "k2", "publicKeys": {"k1": public_pem(1), "k2": public_pem(2)},
             "installId": "sched-prod"},
    actuator__maxDecisionAge=120,
    actuator__fetchMaxWaitMs=200,
    actuator__persistence={"size": "2Gi", "storageClassName": "fast-ssd"},
    lease={"durationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 2.5},
    actuator__mode="act",
    source__extraArgs=["--namespace=team-a"],
    source__schedulerName="batch",
    podAnnotations={"team": "sched"},
    nodeSelector={"pool": "system"},
    tolerations=[{"key": "system", "operator": "Exists"}],
    affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}},
    topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                "whenUnsatisfiable": "ScheduleAnyway"}],
    imagePullSecrets=[{"name": "registry-cred"}],
    image={"repository": "registry.example/preemptctl", "digest": "sha256:" + "ab" * 32,
           "pullPolicy": "Always"},
    serviceAccount={"annotations": {"team": "sched"}},
    worker__serviceAccount={
        "annotations": {"iam.gke.io/gcp-service-account": "pc@p.iam.gserviceaccount.com"}
    },
    fullnameOverride="sched",
    priorityClassName="preemptctl-critical",
    commonLabels={"cost-center": "platform"},
    config={"victimSelection": "minimal", "victimAction": "evict", "daemonset": {"maxVictims": 3}},
    logging={"level": "DEBUG", "format": "text"},
    podDisruptionBudget={"enabled": False, "maxUnavailable": 1},
)  # fmt: skip


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return cast(dict[str, Any], only)


def cli() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="preemptctl")
    sub = top.add_subparsers(dest="command")
    source_cli.register(sub)
    actuator_cli.register(sub)
    worker = importlib.util.find_spec("streams.cli.worker")
    if worker is not None:  # the worker's command line, where it exists
        importlib.import_module("streams.cli.worker").register(sub)
    return top


# ---- an umbrella chart ----------------------------------------------------------------------


SELECTING = ("Deployment", "StatefulSet", "Service", "NetworkPolicy", "PodDisruptionBudget")


def umbrella(root: Path, aliases: Mapping[str, Mapping[str, Any]]) -> Path:
    """An umbrella chart with this chart as a dependency once per alias (each under
    `condition: <alias>.enabled`), the aliases' values as given; `helm dependency build` done."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (root / "templates").mkdir(parents=True)
    (root / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [
                    {
                        "name": "preemptctl",
                        "alias": alias,
                        "version": chart["version"],
                        "repository": f"file://{CHART}",
                        "condition": f"{alias}.enabled",
                    }
                    for alias in aliases
                ],
            }
        )
    )
    (root / "values.yaml").write_text(yaml.safe_dump({k: dict(v) for k, v in aliases.items()}))
    built = subprocess.run(
        [helm(), "dependency", "build", str(root)], capture_output=True, text=True, timeout=HELM_TIMEOUT_S
    )
    assert built.returncode == 0, built.stderr
    return root


ALIAS_VALUES = {"actuator": {"mode": "dry-run"}, "kafka": {"bootstrapServers": "kafka.platform:9092"}}


def selector_of(doc: dict[str, Any]) -> dict[str, str]:
    spec = doc["spec"]
    if doc["kind"] == "Service":
        return dict(spec["selector"])
    if doc["kind"] == "NetworkPolicy":
        return dict(spec["podSelector"]["matchLabels"])
    return dict(spec["selector"]["matchLabels"])


# ---- a PKCS12 keystore on a read-only root filesystem --------------------------------------


def image_workdir() -> str:
    (workdir,) = [
        line.split()[1]
        for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
        if line.startswith("WORKDIR ") and not line.startswith("WORKDIR /src")
    ]
    return workdir


def writable_paths(pod: dict[str, Any], main: dict[str, Any], claims: list[dict[str, Any]]) -> list[str]:
    """Where the container can write: its mounts of emptyDirs and claims not mounted readOnly (the
    root filesystem is read-only, which the test asserts)."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or ()}
    claimed = {c["metadata"]["name"] for c in claims}
    return [
        m["mountPath"]
        for m in main.get("volumeMounts") or ()
        if not m.get("readOnly") and ("emptyDir" in volumes.get(m["name"], {}) or m["name"] in claimed)
    ]


def keystore(directory: Path) -> Path:
    """A PKCS12 keystore with a client key and its self-signed certificate, password "changeit"."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "preemptctl-source")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    )  # fmt: skip
    path = directory / "keystore.p12"
    path.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"client", key, cert, None, serialization.BestAvailableEncryption(b"changeit")
        )
    )
    return path


def start_with_keystore(
    workload: dict[str, Any], store: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> connection.KafkaConfig:
    """What the component does at start with a PKCS12 keystore in its client properties, on the
    filesystem its pod spec gives it: the root read-only, writable only where an emptyDir or a
    volume claim is mounted. tempfile looks where Python looks ($TMPDIR, $TEMP, $TMP from the
    container's env, /tmp, /var/tmp, /usr/tmp, the working directory), each mapped into `scratch`:
    a writable mount to a directory, anything else under a regular file, where nothing can be
    created (by any user, root too)."""
    main = container(workload)
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    writable = writable_paths(
        workload["spec"]["template"], main, workload["spec"].get("volumeClaimTemplates") or []
    )
    readonly = scratch / "read-only-root"
    readonly.write_text("")

    def on_pod(path: str) -> str:
        if any(path == w or path.startswith(w.rstrip("/") + "/") for w in writable):
            mapped = scratch / "mounts" / path.lstrip("/")
            mapped.mkdir(parents=True, exist_ok=True)
            return str(mapped)
        return str(readonly / path.lstrip("/"))

    env = {e["name"]: e.get("value") for e in main.get("env") or ()}
    candidates = [v for k in ("TMPDIR", "TEMP", "TMP") if (v := env.get(k))]
    candidates += ["/tmp", "/var/tmp", "/usr/tmp", main.get("workingDir") or image_workdir()]
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [on_pod(c) for c in candidates])
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches the directory it found
    try:
        props = {
            "security.protocol": "SSL",
            "ssl.keystore.location": str(store),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.password": "changeit",
        }
        return connection.parse(props, bootstrap="kafka.kafka.svc:9093")
    finally:
        monkeypatch.setattr(tempfile, "tempdir", None)
