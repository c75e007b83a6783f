"""One parity question: a cluster's objects, a pending preemptor, and the profile that decides it.

A scenario is written against a reference instant (`now`): every timestamp in
it (start times, condition transitions, PDB disruptedPods) is shifted by the
harness so that the reference instant becomes the moment the cluster is created
on the real API server, and kube-scheduler's wall clock sees the same ages the
scenario meant. Two sources: the random generator (tests/parity/generate.py)
and the bundled conformance cases (`from_case`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

DEFAULT, TOLERATION = "default", "toleration"
# The namespaces every scenario's namespaced objects live in (reused, emptied between runs).
NAMESPACES = ("parity-a", "parity-b")
# The label the API server sets on every namespace, to its name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
IMAGE = "registry.k8s.io/pause:3.9"
# A label no node carries: pending pods nominated elsewhere stay pending, never bound.
NEVER_LABEL = "parity.preemptctl.io/never"
# The label on every PriorityClass a scenario creates, so cleaning up leaves the built-in ones.
CLASS_LABEL = "parity.preemptctl.io/class"
# User-defined PriorityClasses may not use the reserved system- prefix; a case's classes
# are created under this prefix instead (names matter only for their order).
CLASS_PREFIX = "c-"


@dataclass
class Scenario:
    name: str
    profile: str  # DEFAULT or TOLERATION: the kube-scheduler profile that decides
    now: str  # the instant every timestamp below is written against (RFC 3339)
    classes: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pdbs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)  # status included; bound, pending, terminal
    # Labels of the parity namespaces (NAMESPACES), besides the name label the API server sets.
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    terminating: set[str] = field(
        default_factory=set
    )  # "namespace/name": deleted (gracefully) after creation
    preemptor: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    # The generator's shapes in this cluster (host ports, pod (anti-)affinity, topology spread).
    tags: tuple[str, ...] = ()

    @property
    def preemptor_key(self) -> str:
        meta = self.preemptor["metadata"]
        return f"{meta['namespace']}/{meta['name']}"


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def render_time(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def shifted(obj: dict[str, Any], delta: float) -> dict[str, Any]:
    """A copy of a manifest with every time the scheduler reads moved by `delta` seconds."""
    out = copy.deepcopy(obj)
    status = out.get("status")
    if isinstance(status, dict):
        if status.get("startTime"):
            status["startTime"] = render_time(parse_time(status["startTime"]) + delta)
        for cond in status.get("conditions") or []:
            if cond.get("lastTransitionTime"):
                cond["lastTransitionTime"] = render_time(parse_time(cond["lastTransitionTime"]) + delta)
        disrupted = status.get("disruptedPods")
        if isinstance(disrupted, dict):
            status["disruptedPods"] = {k: render_time(parse_time(v) + delta) for k, v in disrupted.items()}
    return out


# ---- the bundled conformance cases --------------------------------------------------------


def _class_name(name: str) -> str:
    return CLASS_PREFIX + name


def _value_class(value: int) -> str:
    return f"{CLASS_PREFIX}value-{'m' if value < 0 else ''}{abs(value)}"


def from_case(path: Path, profile: str) -> Scenario | None:
    """A conformance case as a scenario; None when it is not one preemptor's default-flow question.

    What the API server would not take as written is translated so that it means the
    same: a priority without a class gets a class of that value (admission rejects a
    written priority), classes are renamed out of the reserved system- prefix, the
    namespaces become the parity ones (in the same order), uids are the server's,
    containers get an image, and a terminating pod is created and then deleted.
    """
    raw = yaml.safe_load(path.read_text())
    pre = raw.get("preemptor")
    pres = pre if isinstance(pre, list) else [pre]
    if len(pres) != 1 or raw.get("config"):
        return None
    objects = list(raw.get("objects") or [])
    kinds = ("Node", "Pod", "PriorityClass", "PodDisruptionBudget", "Namespace")
    if any(o.get("kind") not in kinds for o in objects):
        return None
    namespaces = sorted(
        {
            (o.get("metadata") or {}).get("namespace") or "default"
            for o in [*objects, *pres]
            if o.get("kind") in ("Pod", "PodDisruptionBudget")
        }
        | {o["metadata"]["name"] for o in objects if o.get("kind") == "Namespace"}
    )
    if len(namespaces) > len(NAMESPACES):
        return None
    ns_map = dict(zip(namespaces, NAMESPACES, strict=False))
    scenario = Scenario(
        name=raw.get("name") or path.stem, profile=profile, now=raw.get("now") or "2026-01-01T00:00:00Z"
    )
    scenario.origin = str(path)
    classes = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "PriorityClass"}
    values: set[int] = set()
    twins: dict[str, dict[str, Any]] = {}

    def pod(obj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        meta, spec = out.setdefault("metadata", {}), out.setdefault("spec", {})
        meta["name"] = dns_name(meta["name"])
        meta.pop("uid", None)
        meta.pop("resourceVersion", None)
        meta.pop("creationTimestamp", None)
        if meta.pop("deletionTimestamp", None):
            scenario.terminating.add(f"{ns_map[meta.get('namespace') or 'default']}/{meta['name']}")
        meta.pop("deletionGracePeriodSeconds", None)
        meta["namespace"] = ns_map[meta.get("namespace") or "default"]
        klass = spec.get("priorityClassName")
        written = spec.pop("priority", None)
        if klass and klass in classes:
            if written is not None and int(written) != int(classes[klass]["value"]):
                klass = None  # admission would refuse the pair: keep the written value
        elif klass:
            klass = None
        if klass:
            spec["priorityClassName"] = _class_name(klass)
            value = int(classes[klass]["value"])
        else:
            value = int(written or 0)
            values.add(value)
            spec["priorityClassName"] = _value_class(value)
        policy = spec.pop("preemptionPolicy", None)
        if policy and policy != (classes.get(klass or "") or {}).get(
            "preemptionPolicy", "PreemptLowerPriority"
        ):
            # Admission takes the policy from the class: a twin class carries the pod's own.
            twin = f"{spec['priorityClassName']}-{policy.lower()}"
            twins[twin] = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": twin},
                "value": value,
                "preemptionPolicy": policy,
            }
            spec["priorityClassName"] = twin
        for i, c in enumerate([*spec.get("initContainers", []), *spec.get("containers", [])]):
            c["name"] = dns_name(c.get("name") or f"c{i}")
            c.setdefault("image", IMAGE)
            resources = c.get("resources") or {}
            for r, q in (resources.get("requests") or {}).items():
                if "/" in r and not r.startswith("hugepages-"):
                    # An extended resource cannot be overcommitted: its limit must be its request.
                    resources.setdefault("limits", {})[r] = q
                    c["resources"] = resources
        if spec.get("overhead"):
            return out  # kept: a case with overhead is skipped below (RuntimeClass admission)
        return out

    for obj in objects:
        kind = obj.get("kind")
        if kind == "Node":
            node = copy.deepcopy(obj)
            node["metadata"].pop("uid", None)
            scenario.nodes.append(node)
        elif kind == "PriorityClass":
            pc = copy.deepcopy(obj)
            pc["metadata"] = {**pc["metadata"], "name": _class_name(pc["metadata"]["name"])}
            pc["metadata"].pop("uid", None)
            scenario.classes.append(pc)
        elif kind == "PodDisruptionBudget":
            pdb = copy.deepcopy(obj)
            pdb["metadata"].pop("uid", None)
            pdb["metadata"]["namespace"] = ns_map[pdb["metadata"].get("namespace") or "default"]
            disrupted = (pdb.get("status") or {}).get("disruptedPods")
            if disrupted:
                pdb["status"]["disruptedPods"] = {dns_name(k): v for k, v in disrupted.items()}
            scenario.pdbs.append(pdb)
        elif kind == "Pod":
            scenario.pods.append(pod(obj))
        elif kind == "Namespace":
            # Its labels go on the parity namespace it becomes; the name label is the server's.
            labels = dict(obj["metadata"].get("labels") or {})
            labels.pop(NAMESPACE_NAME_LABEL, None)
            scenario.namespace_labels[ns_map[obj["metadata"]["name"]]] = labels
    scenario.preemptor = pod(pres[0])
    if any(p["spec"].get("overhead") for p in [*scenario.pods, scenario.preemptor]):
        return None
    scenario.classes.extend(twins[name] for name in sorted(twins))
    for value in sorted(values):
        scenario.classes.append(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": _value_class(value)},
                "value": value,
            }
        )
    if sum(1 for c in scenario.classes if c.get("globalDefault")) > 1:
        return None
    return scenario


_UNSAFE = re.compile(r"[^a-z0-9.-]")


def dns_name(name: str) -> str:
    """An object name the API server accepts (RFC 1123: lower case, digits, '-' and '.')."""
    return _UNSAFE.sub("-", name.lower()).strip("-.") or "x"
