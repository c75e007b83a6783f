"""Objects as a real API server holds them: everything a decision does not read, added to a lean object.

The simulator's and the bench's objects carry only what decisions read. A real
pod also carries its env, command line and args, volumes, probes, images, the
`kubectl.kubernetes.io/last-applied-configuration` annotation (the whole
manifest again), status messages and container statuses; a real node its
images, addresses and conditions. `dress` adds those, deterministically (a
function of the object's name), so that:
- `bench pipeline` measures folding the log the source used to write (whole
  objects) against the one it writes (engine.projection's);
- tests put a secret-looking `secret` value into every one of those fields and
  look for it in every record of every topic (none may hold it).
What `dress` adds never changes what a decision reads: it only fills fields the
projection leaves out (tests/test_projection.py checks both).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

# Typical sizes of a production pod: a service's env, a sidecar, the usual volumes.
ENV_VARS = 20
NODE_IMAGES = 40


def _filler(name: str, what: str, secret: str) -> str:
    """A value for a field the log must not hold: the secret when given, else a plausible one."""
    if secret:
        return f"{secret}-{what}"
    return hashlib.sha256(f"{name}/{what}".encode()).hexdigest()[:24]


def _container_extras(owner: str, container: Mapping[str, Any], secret: str) -> dict[str, Any]:
    name = f"{owner}/{container.get('name', 'c')}"
    return {
        "image": f"registry.example.com/team/{_filler(name, 'image', secret)}:1.2.3",
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/server", f"--token={_filler(name, 'command', secret)}"],
        "args": ["--listen=:8080", f"--db-password={_filler(name, 'args', secret)}"],
        "env": [{"name": f"VAR_{i}", "value": _filler(name, f"env-{i}", secret)} for i in range(ENV_VARS)]
        + [
            {
                "name": "API_KEY",
                "valueFrom": {
                    "secretKeyRef": {"name": _filler(name, "secret-ref", secret), "key": "api-key"}
                },
            },
        ],
        "envFrom": [{"configMapRef": {"name": _filler(name, "env-from", secret)}}],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "volumeMounts": [
            {"name": "config", "mountPath": f"/etc/{_filler(name, 'mount-path', secret)}", "readOnly": True},
            {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
        "livenessProbe": {
            "exec": {"command": ["check", _filler(name, "probe", secret)]},
            "periodSeconds": 10,
        },
        "readinessProbe": {"httpGet": {"path": f"/ready?key={_filler(name, 'ready', secret)}", "port": 8080}},
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", _filler(name, "pre-stop", secret)]}}},
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def _pod(obj: dict[str, Any], secret: str) -> None:
    meta = obj.setdefault("metadata", {})
    name = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
    spec = obj.setdefault("spec", {})
    lean = copy.deepcopy(obj)
    lean.get("metadata", {}).pop("annotations", None)
    annotations = meta.setdefault("annotations", {})
    annotations["kubectl.kubernetes.io/last-applied-configuration"] = orjson.dumps(
        {**lean, "secret": _filler(name, "last-applied", secret)}
    ).decode()
    annotations["example.com/deploy-token"] = _filler(name, "annotation", secret)
    meta["generateName"] = f"{meta.get('name', 'pod')}-"
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or ():
            if isinstance(container, dict):
                for key, value in _container_extras(name, container, secret).items():
                    container.setdefault(key, value)
    spec.setdefault("volumes", [
        {"name": "config", "configMap": {"name": _filler(name, "config-map", secret)}},
        {"name": "creds", "secret": {"secretName": _filler(name, "volume-secret", secret)}},
        {"name": "data", "hostPath": {"path": f"/srv/{_filler(name, 'host-path', secret)}"}},
        {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
    ])  # fmt: skip
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("securityContext", {"fsGroup": 2000})
    spec.setdefault("hostname", _filler(name, "hostname", secret))
    status = obj.setdefault("status", {})
    conditions = status.setdefault("conditions", [])
    if isinstance(conditions, list):
        for c in conditions:
            if isinstance(c, dict):
                c.setdefault("message", _filler(name, "condition-message", secret))
        conditions.append({"type": "Ready", "status": "True", "message": _filler(name, "ready", secret)})
    status.setdefault("message", _filler(name, "status-message", secret))
    status["podIP"], status["hostIP"] = "10.1.2.3", "10.0.0.1"
    status["qosClass"] = "Burstable"
    status["containerStatuses"] = [
        {
            "name": c.get("name", "c"),
            "image": f"registry.example.com/team/app:{_filler(name, 'status-image', secret)}",
            "imageID": f"sha256:{_filler(name, 'image-id', secret)}",
            "ready": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        }
        for c in spec.get("containers") or ()
        if isinstance(c, dict)
    ]


def _node(obj: dict[str, Any], secret: str) -> None:
    meta = obj.setdefault("metadata", {})
    name = str(meta.get("name", ""))
    meta.setdefault("annotations", {})["node.alpha.kubernetes.io/ttl"] = "0"
    meta["annotations"]["example.com/bootstrap-token"] = _filler(name, "node-annotation", secret)
    spec = obj.setdefault("spec", {})
    spec.setdefault("podCIDR", "10.244.0.0/24")
    spec.setdefault("providerID", f"aws:///{_filler(name, 'provider-id', secret)}")
    status = obj.setdefault("status", {})
    status["addresses"] = [
        {"type": "InternalIP", "address": "10.0.0.1"},
        {"type": "Hostname", "address": name},
    ]
    status["conditions"] = [
        {"type": t, "status": "False", "message": _filler(name, f"node-{t}", secret)}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    status["images"] = [
        {
            "names": [f"registry.example.com/{_filler(name, f'img-{i}', secret)}:v{i}"],
            "sizeBytes": 10_000_000 + i,
        }
        for i in range(NODE_IMAGES)
    ]
    status["nodeInfo"] = {
        "kernelVersion": "6.1.0",
        "kubeletVersion": "v1.34.2",
        "machineID": _filler(name, "machine", secret),
    }


def _other(obj: dict[str, Any], secret: str) -> None:
    meta = obj.setdefault("metadata", {})
    name = str(meta.get("name", ""))
    annotations = meta.setdefault("annotations", {})
    annotations["kubectl.kubernetes.io/last-applied-configuration"] = _filler(name, "last-applied", secret)
    if obj.get("kind") == "PriorityClass":
        obj.setdefault("description", _filler(name, "description", secret))
    if obj.get("kind") == "Namespace":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj.setdefault("status", {"phase": "Active"})
    if obj.get("kind") == "PodDisruptionBudget":
        obj.setdefault("status", {}).setdefault("conditions", [
            {"type": "DisruptionAllowed", "status": "True", "message": _filler(name, "pdb-message", secret)}
        ])  # fmt: skip


def dress(obj: Mapping[str, Any], *, secret: str = "") -> dict[str, Any]:
    """A copy of `obj` as the API server would hold it (a tombstone or a TICK object stays as it is)."""
    out = copy.deepcopy(dict(obj))
    if not isinstance(out.get("metadata"), dict) or set(out) <= {"apiVersion", "kind", "metadata"}:
        return out  # a tombstone: the source writes only the identity
    kind = out.get("kind")
    if kind == "Pod":
        _pod(out, secret)
    elif kind == "Node":
        _node(out, secret)
    elif kind in ("PriorityClass", "PodDisruptionBudget", "ElasticQuota", "Namespace"):
        _other(out, secret)
    return out


def dress_log(events: list[dict[str, Any]], *, secret: str = "") -> list[dict[str, Any]]:
    """Every event's object dressed (RESYNC and TICK carry none)."""
    return [{**e, "object": dress(e["object"], secret=secret)} if isinstance(e.get("object"), dict) else e
            for e in events]  # fmt: skip
