"""What of each Kubernetes object the log keeps: exactly the fields a decision or an audit reads.

The source writes `project(obj)` of every object it sees, never the object whole:
env values, command lines and args, volumes, probes, container images, status
messages, most annotations (`kubectl.kubernetes.io/last-applied-configuration`
among them, which holds the whole manifest) and managedFields never reach Kafka,
where they would stay for the audit horizon. The projection is an allow-list
(`FIELDS`): a field not listed is not written, so a field Kubernetes adds
tomorrow is left out too.

The rule that keeps it correct: normalising the projection gives the engine the
same records as normalising the whole object (engine.objects), so every decision
is the same (tests/test_projection.py checks it as a property over generated
objects, and that no value of a field left out reaches the result). Labels are
kept whole: selectors (PDBs, quotas, pod groups, namespace selectors) may match any of them. Of the
annotations, only those the engine reads are kept.

docs/topics.md lists the fields (`paths()`; a test keeps them equal).

The worker projects what it folds too (fold.controller), whoever wrote the
event: its store, its snapshots and its explanations hold only these fields. A writer
that projects with this very list says so with HEADER = VERSION on its cluster-events
record, and the worker then takes its objects as they are (projecting again would give
the same: `project` is idempotent, tests/test_fold_projection.py). VERSION changes with
FIELDS: a record marked with another version is projected again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine import daemonset, toleration

# The allow-list's version: bump it whenever FIELDS or POD_CONDITIONS change what a
# projection of an object some writer of an earlier version could have written. The
# Namespace list was added under 1: no writer of 1 wrote Namespaces before it (the source
# did not watch them, and every other kind's list is unchanged), so every record declared
# 1 still equals its projection by this list, and stores and snapshots need no new pass.
VERSION = 1
# The cluster-events record header by which a writer declares its objects projected with
# FIELDS of VERSION (the value, as ASCII digits). Set it only when projecting with this list.
HEADER = "preemptctl-projection"
HEADER_VALUE = str(VERSION).encode()

# A spec node: True keeps the value whole; a mapping keeps those keys of a mapping (each
# by its own spec); each(spec) keeps each item of a list by `spec`; keys(...) keeps the
# named keys of a string map, and those that begin with one of `prefixes`.
Spec = Any


class _Each:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec


class _Keys:
    def __init__(self, *keys: str, prefixes: tuple[str, ...] = ()) -> None:
        self.keys = frozenset(keys)
        self.prefixes = prefixes


def each(spec: Spec) -> _Each:
    return _Each(spec)


def keys(*names: str, prefixes: tuple[str, ...] = ()) -> _Keys:
    return _Keys(*names, prefixes=prefixes)


_IDENTITY = {"name": True, "namespace": True, "uid": True, "resourceVersion": True}
_RESOURCES = {"requests": True, "limits": True}  # limits: the QoS class
_HOST_PORT = {"hostPort": True, "protocol": True, "hostIP": True}  # NodePorts (engine.constraints)

FIELDS: Mapping[str, Mapping[str, Spec]] = {
    "Pod": {
        "metadata": {
            **_IDENTITY,
            "creationTimestamp": True,
            "deletionTimestamp": True,
            "labels": True,
            "annotations": keys(daemonset.ALLOW_PREEMPTION),
            "ownerReferences": each({"kind": True, "name": True, "uid": True}),
        },
        "spec": {
            "nodeName": True,
            # The worker decides only for the schedulers a RESYNC names (fold.controller).
            "schedulerName": True,
            "priority": True,
            "priorityClassName": True,
            "preemptionPolicy": True,
            "terminationGracePeriodSeconds": True,
            "nodeSelector": True,
            "tolerations": each({"key": True, "operator": True, "value": True, "effect": True}),
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": True},
                # Required terms only (engine.constraints): preferred ones only score.
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": True},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": True},
            },
            "topologySpreadConstraints": each(
                {
                    "maxSkew": True,
                    "topologyKey": True,
                    "whenUnsatisfiable": True,
                    "labelSelector": True,
                    "minDomains": True,
                    "nodeAffinityPolicy": True,
                    "nodeTaintsPolicy": True,
                    "matchLabelKeys": True,
                }
            ),
            # Only what says a volume is one whose filters preemptctl does not evaluate
            # (engine.constraints.UNMODELLED_VOLUMES): no volume names, no other sources.
            "volumes": each(
                {
                    "persistentVolumeClaim": {"claimName": True},
                    "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": True}}},
                    "csi": {"driver": True},
                    "gcePersistentDisk": {"pdName": True},
                    "awsElasticBlockStore": {"volumeID": True},
                    "rbd": {"image": True},
                    "iscsi": {"iqn": True},
                }
            ),
            "resourceClaims": each({"name": True}),
            "overhead": True,
            "containers": each({"name": True, "resources": _RESOURCES, "ports": each(_HOST_PORT)}),
            "initContainers": each(
                {"name": True, "resources": _RESOURCES, "restartPolicy": True, "ports": each(_HOST_PORT)}
            ),
        },
        "status": {
            "phase": True,
            "nominatedNodeName": True,
            "startTime": True,
            "conditions": each({"type": True, "status": True, "reason": True, "lastTransitionTime": True}),
        },
    },
    "Node": {
        "metadata": {**_IDENTITY, "labels": True},
        "spec": {"unschedulable": True, "taints": each({"key": True, "value": True, "effect": True})},
        "status": {"allocatable": True, "capacity": True},
    },
    "PriorityClass": {
        "metadata": {**_IDENTITY, "annotations": keys(prefixes=toleration.PREFIXES)},
        "value": True,
        "globalDefault": True,
        "preemptionPolicy": True,
    },
    "PodDisruptionBudget": {
        "metadata": _IDENTITY,
        "spec": {"selector": True},
        "status": {"disruptionsAllowed": True, "disruptedPods": True},
    },
    "ElasticQuota": {
        "metadata": _IDENTITY,
        "spec": {"min": True, "max": True},
    },
    # Its labels, for pod (anti-)affinity terms' namespace selectors.
    "Namespace": {"metadata": {**_IDENTITY, "labels": True}},
}
# Only these pod conditions are read (scheduling state, an eviction under way).
POD_CONDITIONS = frozenset({"PodScheduled", "DisruptionTarget"})


def _take(value: Any, spec: Spec) -> Any:
    """`value` cut down to `spec`; None when nothing of it is kept."""
    if spec is True:
        return value
    if isinstance(spec, _Each):
        if not isinstance(value, list):
            return value if value is None else _invalid(value)
        return [_take(item, spec.spec) if isinstance(item, dict) else _invalid(item) for item in value]
    if isinstance(spec, _Keys):
        if not isinstance(value, dict):
            return _invalid(value)
        return {
            k: v
            for k, v in value.items()
            if k in spec.keys or (isinstance(k, str) and k.startswith(spec.prefixes) and spec.prefixes)
        }
    if not isinstance(value, dict):
        return _invalid(value)
    out = {}
    for key, sub in spec.items():
        if key in value:
            out[key] = _take(value[key], sub)
    return out


def _invalid(value: Any) -> Any:
    """A value of the wrong shape where a mapping or list belongs: kept as it is when it cannot
    carry anything (a number, a bool, null), so the worker refuses the object exactly as it
    would have refused the whole one; a string or anything else becomes a marker of its type."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return f"<{type(value).__name__} left out>"


def project(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `obj` a decision or an audit reads; `obj` itself is not changed.

    A kind preemptctl does not decide on keeps its identity only.
    """
    kind = obj.get("kind")
    out: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    spec = FIELDS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            out["metadata"] = _take(meta, _IDENTITY)
        return out
    for key, sub in spec.items():
        if key in obj:
            out[key] = _take(obj[key], sub)
    if kind == "Pod":
        status = out.get("status")
        conditions = status.get("conditions") if isinstance(status, dict) else None
        if isinstance(status, dict) and isinstance(conditions, list):
            status["conditions"] = [
                c for c in conditions if not isinstance(c, dict) or c.get("type") in POD_CONDITIONS
            ]
    return out


def paths(kind: str) -> list[str]:
    """The kept fields of `kind` as dotted paths (`spec.containers[].resources.requests`), for docs."""

    def walk(spec: Spec, prefix: str) -> list[str]:
        if spec is True:
            return [prefix]
        if isinstance(spec, _Each):
            return walk(spec.spec, prefix + "[]")
        if isinstance(spec, _Keys):
            named = [f"{prefix}[{k}]" for k in sorted(spec.keys)]
            return named + [f"{prefix}[{p}*]" for p in spec.prefixes]
        return [p for key, sub in spec.items() for p in walk(sub, f"{prefix}.{key}" if prefix else key)]

    kept = ["apiVersion", "kind", *walk(FIELDS[kind], "")]
    if kind == "Pod":
        kept = [
            f"{p} ({', '.join(sorted(POD_CONDITIONS))} only)" if p.startswith("status.conditions[]") else p
            for p in kept
        ]
    return kept


def reads_pod_annotation(key: str) -> bool:
    """Is this Pod annotation one the engine reads (kept by the projection)?"""
    kept = FIELDS["Pod"]["metadata"]["annotations"]
    assert isinstance(kept, _Keys)
    return key in kept.keys or key.startswith(kept.prefixes)


def declared(headers: Iterable[tuple[str, bytes]]) -> bool:
    """Do a record's headers declare its objects projected with this FIELDS (HEADER = VERSION)?"""
    return any(k == HEADER and v == HEADER_VALUE for k, v in headers)
