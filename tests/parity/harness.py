"""Run one scenario against the real kube-scheduler and against preemptctl, on the same objects.

For each scenario, on one long-lived kube-apiserver + etcd (testbed/cluster.py):

1. the objects are written (classes, nodes, PDBs and their status, pods and their
   status, terminating pods deleted with a grace period no kubelet will end, the
   preemptor last), each kind's writes in parallel;
2. everything is read back: these objects, defaulted and admitted by the API
   server, are what both deciders get;
3. preemptctl decides on them (the engine, as the worker calls it);
4. a fresh kube-scheduler starts (its informers list exactly these objects
   before it schedules anything), decides for the preemptor and is stopped;
   its answer is read from the preemptor's status and the scheduler's log
   (`--v=2`: the node it chose and each victim it preempted);
5. everything is deleted for the next scenario.

Pending pods other than the preemptor are nominated pods whose only role is to
count on their node: they are given a node selector no node matches and a
PriorityClass twin with preemptionPolicy Never, so the scheduler can neither bind
them nor preempt for them (neither decider reads those fields of another pod).
"""

from __future__ import annotations

import contextlib
import copy
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine import cluster as cluster_mod
from engine import flows, timeutil
from engine.config import Config
from engine.decision import Decision
from testbed import cluster as k8s
from testbed import scheduler as scheduler_mod
from tests.parity import api as api_mod
from tests.parity.scenario import (
    CLASS_LABEL,
    DEFAULT,
    NAMESPACE_NAME_LABEL,
    NAMESPACES,
    NEVER_LABEL,
    TOLERATION,
    Scenario,
    parse_time,
    shifted,
)

PROFILES = {DEFAULT: scheduler_mod.DEFAULT_PROFILE, TOLERATION: scheduler_mod.TOLERATION_PROFILE}
SCHEDULER_NAMES = frozenset(p["schedulerName"] for p in PROFILES.values())
# A terminating pod's grace period: no kubelet ends it, so it stays terminating for the run.
GRACE_S = 3600
# kube-scheduler decides in ~0.1 s once its informers have synced; a loaded CI machine gets
# far more before a missing answer counts as a failure (the scheduler's log is then shown).
VERDICT_TIMEOUT_S = 120.0
POLL_S = 0.02
# The Priority admission plugin reads PriorityClasses from an informer: a pod naming a class
# created a moment ago can be refused (403, "no PriorityClass with name ...") until the
# informer has it; a loaded machine has seen that. Tried again until then, within this long.
CLASS_VISIBLE_S = 30.0
NOT_ELIGIBLE_TERMINATING = "not eligible due to a terminating pod on the nominated node"
_TARGET = re.compile(r'"the target node for the preemption is determined" node="([^"]*)" pod="([^"]*)"')
# The synchronous path logs with the scheduling cycle's logger (a pod= key first), the
# asynchronous one from its goroutine (no pod= key).
_VICTIM = re.compile(
    r'"Preemptor Pod preempted victim Pod"(?: pod="[^"]*")? preemptor="([^"]*)" victim="([^"]*)"'
)
_GONE = re.compile(r'"Victim Pod is already deleted" preemptor="([^"]*)" victim="([^"]*)"')
_ASYNC_DONE = re.compile(r'"Async Preemption finished completely" preemptor="([^"]*)"')
_ASYNC_START = re.compile(
    r'"Start the preemption asynchronously" preemptor="[^"]*" node="[^"]*" numVictims=(\d+)'
)


@dataclass
class Verdict:
    """One decider's answer, reduced to what both can state."""

    outcome: str
    node: str | None = None
    victims: tuple[str, ...] = ()
    detail: str = ""

    def same(self, other: Verdict) -> bool:
        if self.outcome != other.outcome:
            return False
        if self.outcome == "preempt":  # where a pod fits is scoring's business, not preemption's
            return self.node == other.node and sorted(self.victims) == sorted(other.victims)
        return True

    def __str__(self) -> str:
        if self.outcome == "preempt":
            return f"preempt on {self.node}: {sorted(self.victims)}"
        return self.outcome + (f" ({self.node})" if self.node else "")


@dataclass
class Run:
    scenario: Scenario
    objects: list[dict[str, Any]]  # everything read back, kind and apiVersion filled in
    preemptor: dict[str, Any]
    now: float  # preemptctl's instant: the scenario's reference instant, shifted
    kube_now: float  # when kube-scheduler had answered (its clock is past `now`)
    kube: Verdict
    preemptctl: Verdict
    decision: Decision
    log: str = field(repr=False, default="")


def _list(api: api_mod.Api, path: str, kind: str, api_version: str) -> list[dict[str, Any]]:
    items = api.call("GET", path)["items"]
    for item in items:
        item["kind"], item["apiVersion"] = kind, api_version
        item["metadata"].pop("managedFields", None)
    return list(items)


class Harness:
    """Scenarios one after another on one control plane; `run(scenario)` answers each."""

    def __init__(self, control: k8s.TestCluster) -> None:
        self.control = control
        self.api = api_mod.Api(control)
        for ns in NAMESPACES:
            with contextlib.suppress(api_mod.ApiError):
                self.api.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        self.clean()

    def close(self) -> None:
        self.api.close()

    # ---- writing ------------------------------------------------------------------------

    def clean(self) -> None:
        calls: list[tuple[str, str]] = [
            ("DELETE", "/api/v1/nodes"),
            ("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses?labelSelector={CLASS_LABEL}"),
        ]
        for ns in NAMESPACES:
            calls.append(("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0"))
            calls.append(("DELETE", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"))
        self.api.each(calls)

    def _write(self, s: Scenario, delta: float) -> dict[str, Any]:
        api = self.api
        classes = {c["metadata"]["name"]: copy.deepcopy(c) for c in s.classes}
        pods = [shifted(p, delta) for p in s.pods]
        preemptor = shifted(s.preemptor, delta)
        profile_name = PROFILES[s.profile]["schedulerName"]
        preemptor["spec"]["schedulerName"] = profile_name
        preemptor.setdefault("status", {}).pop("conditions", None)
        for pod in pods:
            if pod["spec"].get("nodeName"):
                continue
            spec = pod["spec"]
            spec.setdefault("schedulerName", profile_name)
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), NEVER_LABEL: "true"}
            klass = spec.get("priorityClassName")
            if klass and klass in classes:
                twin = f"{klass}-never"
                if twin not in classes:
                    base = classes[klass]
                    classes[twin] = {
                        "apiVersion": "scheduling.k8s.io/v1",
                        "kind": "PriorityClass",
                        "metadata": {"name": twin},
                        "value": base["value"],
                        "preemptionPolicy": "Never",
                    }
                spec["priorityClassName"] = twin
                spec.pop("preemptionPolicy", None)
        for pc in classes.values():
            pc["metadata"] = {
                **pc["metadata"],
                "labels": {**(pc["metadata"].get("labels") or {}), CLASS_LABEL: "1"},
            }
        api.each(("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", pc) for pc in classes.values())
        # The parity namespaces get this scenario's labels, and lose any a previous one set.
        for ns in NAMESPACES:
            held = api.call("GET", f"/api/v1/namespaces/{ns}")["metadata"].get("labels") or {}
            wanted: dict[str, str | None] = dict(s.namespace_labels.get(ns, {}))
            wanted.update({k: None for k in held if k not in wanted and k != NAMESPACE_NAME_LABEL})
            if any(held.get(k) != v for k, v in wanted.items()):
                api.call("PATCH", f"/api/v1/namespaces/{ns}", {"metadata": {"labels": wanted}})
        api.each(("POST", "/api/v1/nodes", n) for n in s.nodes)
        pdbs = [shifted(p, delta) for p in s.pdbs]
        api.each(
            (
                "POST",
                f"/apis/policy/v1/namespaces/{p['metadata']['namespace']}/poddisruptionbudgets",
                {k: v for k, v in p.items() if k != "status"},
            )
            for p in pdbs
        )
        api.each(
            (
                "PATCH",
                f"/apis/policy/v1/namespaces/{p['metadata']['namespace']}/poddisruptionbudgets/"
                f"{p['metadata']['name']}/status",
                {"status": _pdb_status(p.get("status") or {})},
            )
            for p in pdbs
            if p.get("status")
        )
        everyone = [*pods, preemptor]
        api.map(
            lambda p: _admitted(
                api,
                f"/api/v1/namespaces/{p['metadata']['namespace']}/pods",
                {k: v for k, v in p.items() if k != "status"},
            ),
            everyone,
        )
        api.each(
            (
                "PATCH",
                f"/api/v1/namespaces/{p['metadata']['namespace']}/pods/{p['metadata']['name']}/status",
                {"status": p["status"]},
            )
            for p in everyone
            if p.get("status")
        )
        api.each(
            (
                "DELETE",
                f"/api/v1/namespaces/{key.split('/')[0]}/pods/{key.split('/')[1]}",
                {"gracePeriodSeconds": GRACE_S},
            )
            for key in sorted(s.terminating)
        )
        return preemptor

    def _read(self) -> list[dict[str, Any]]:
        api = self.api
        out = _list(
            api, "/apis/scheduling.k8s.io/v1/priorityclasses", "PriorityClass", "scheduling.k8s.io/v1"
        )
        out += _list(api, "/api/v1/nodes", "Node", "v1")
        for ns in NAMESPACES:
            namespace = api.call("GET", f"/api/v1/namespaces/{ns}")
            namespace["kind"], namespace["apiVersion"] = "Namespace", "v1"
            namespace["metadata"].pop("managedFields", None)
            out.append(namespace)
            out += _list(api, f"/api/v1/namespaces/{ns}/pods", "Pod", "v1")
            out += _list(
                api,
                f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
                "PodDisruptionBudget",
                "policy/v1",
            )
        return out

    # ---- deciding -----------------------------------------------------------------------

    def run(self, s: Scenario) -> Run:
        try:
            return self._run(s)
        finally:
            self.clean()

    def _run(self, s: Scenario) -> Run:
        began = float(int(time.time()))
        delta = began - parse_time(s.now)
        written = self._write(s, delta)
        objects = self._read()
        key = (written["metadata"]["namespace"], written["metadata"]["name"])
        preemptor = next(
            o
            for o in objects
            if o["kind"] == "Pod" and (o["metadata"]["namespace"], o["metadata"]["name"]) == key
        )
        decision = decide(objects, preemptor, now=began)
        ours = Verdict(
            decision.outcome,
            decision.node if decision.outcome in ("preempt", "fits") else None,
            tuple(v.key for v in decision.victims),
            decision.reason,
        )
        kube, log, kube_now = self._kube(s, preemptor)
        return Run(s, objects, preemptor, began, kube_now, kube, ours, decision, log)

    def _kube(self, s: Scenario, preemptor: dict[str, Any]) -> tuple[Verdict, str, float]:
        meta = preemptor["metadata"]
        who = f"{meta['namespace']}/{meta['name']}"
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        profiles = [PROFILES[DEFAULT], PROFILES[TOLERATION]]
        with scheduler_mod.KubeScheduler(self.control, profiles, extra_args=("--v=2",)) as running:
            deadline = time.monotonic() + VERDICT_TIMEOUT_S
            while True:
                pod = self.api.call("GET", path)
                log = running.log_path.read_text(errors="replace")
                verdict = _verdict(pod, log, who, asynchronous=s.profile == DEFAULT)
                if verdict is not None:
                    return verdict, log, time.time()
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"no answer from kube-scheduler for {who} in {VERDICT_TIMEOUT_S:g}s:\n{log[-3000:]}"
                    )
                time.sleep(POLL_S)


def _pdb_status(status: dict[str, Any]) -> dict[str, Any]:
    """The status the disruption controller would write: every required field present."""
    allowed = int(status.get("disruptionsAllowed") or 0)
    out = {
        "disruptionsAllowed": allowed,
        "currentHealthy": int(status.get("currentHealthy", allowed)),
        "desiredHealthy": int(status.get("desiredHealthy", 0)),
        "expectedPods": int(status.get("expectedPods", allowed)),
        "observedGeneration": 1,
    }
    if status.get("disruptedPods"):
        out["disruptedPods"] = status["disruptedPods"]
    return out


def _verdict(pod: dict[str, Any], log: str, who: str, *, asynchronous: bool) -> Verdict | None:
    """kube-scheduler's answer for `who`, once it has given one (and finished preempting)."""
    if pod["spec"].get("nodeName"):
        return Verdict("fits", pod["spec"]["nodeName"])
    status = pod.get("status") or {}
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled is None or scheduled.get("status") != "False" or scheduled.get("reason") != "Unschedulable":
        return None  # not tried yet, or a scheduler error it will retry
    targets = [m.group(1) for m in _TARGET.finditer(log) if m.group(2) == who]
    message = str(scheduled.get("message") or "")
    if not targets:
        outcome = "wait" if NOT_ELIGIBLE_TERMINATING in message else "unschedulable"
        return Verdict(outcome, detail=message)
    mine = [line for line in log.splitlines() if f'"{who}"' in line]
    if asynchronous:
        victims = _asynchronous_victims(mine, who)
        if victims is None:
            return None  # victims still being preempted
    else:
        victims = _synchronous_victims(mine, who)
    if len(set(targets)) > 1:
        raise RuntimeError(
            f"kube-scheduler preempted for {who} on several nodes: {targets}\n" + "\n".join(mine)
        )
    return Verdict("preempt", targets[0], tuple(victims), message)


def _synchronous_victims(lines: list[str], who: str) -> list[str]:
    """PreemptionToleration preempts inside the scheduling cycle: the first attempt's victims are
    logged between its target line and its "Unable to schedule pod" line."""
    victims: list[str] = []
    seen_target = False
    for line in lines:
        if _TARGET.search(line):
            if seen_target:
                break
            seen_target = True
        elif seen_target and "Unable to schedule pod" in line:
            break
        elif seen_target and (m := _VICTIM.search(line) or _GONE.search(line)) and m.group(1) == who:
            victims.append(m.group(2))
    return sorted(victims)


def _asynchronous_victims(lines: list[str], who: str) -> list[str] | None:
    """DefaultPreemption preempts in a goroutine per attempt. The preemptor's own status update can
    bring it back before the first goroutine is done, and it then decides again on the same state;
    each attempt must name as many victims, and together they name the victims."""
    started = [int(m.group(1)) for line in lines if (m := _ASYNC_START.search(line))]
    finished = sum(1 for line in lines if _ASYNC_DONE.search(line))
    if not started or finished < len(started):
        return None
    victims = {
        m.group(2)
        for line in lines
        if (m := _VICTIM.search(line) or _GONE.search(line)) and m.group(1) == who
    }
    if any(n != len(victims) for n in started):
        raise RuntimeError(
            f"kube-scheduler's attempts for {who} preempted different pods:\n" + "\n".join(lines)
        )
    return sorted(victims)


def decide(objects: list[dict[str, Any]], preemptor: dict[str, Any], *, now: float) -> Decision:
    """preemptctl's answer on the objects as read back: folded as the worker folds watch events."""
    cluster = cluster_mod.Cluster()
    for obj in objects:
        cluster.apply("ADDED", obj)
    pod = cluster.pods[preemptor["metadata"]["uid"]]
    return flows.decide(cluster, [pod], now=int(now) * timeutil.SECOND, config=Config())


@contextlib.contextmanager
def harness(control: k8s.TestCluster) -> Iterator[Harness]:
    h = Harness(control)
    try:
        yield h
    finally:
        h.close()


def _admitted(api: api_mod.Api, path: str, body: dict[str, Any]) -> Any:
    """POST a pod, again while admission has not seen its PriorityClass yet (CLASS_VISIBLE_S)."""
    deadline = time.monotonic() + CLASS_VISIBLE_S
    while True:
        try:
            return api.call("POST", path, body)
        except api_mod.ApiError as exc:
            unseen_class = exc.status == 403 and "no PriorityClass with name" in str(exc)
            if not unseen_class or time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)
