"""Issue 29's acceptance property: whatever an attacker writes into the cluster's log, the
actuator writes only to pods the live objects allow.

The attacker holds the source's or the actuator's Kafka rights: it appends any sequence of
events to `preemption.cluster-events` (pods, nodes, PriorityClasses and quotas added, changed
or deleted with any priority, node, uid, scheduler or pod group; OUTCOME events). The worker
folds that log honestly (`fleet.fold`, the worker's own fold) and signs what it decides, as a
real worker would: signing is not what stops these. Every decision then reaches the actuator,
in order, against a fake API holding the truth.

The property, checked on every write the actuator makes:
- a victim it deletes, evicts or labels (or marks with DisruptionTarget) is, live, bound to the
  decision's node (a gang: one of its placements), outside the protected namespaces, and of a
  priority below the live priority of the decision's preemptor (a gang: of its lowest member);
- that preemptor (every member) exists live with the decision's uid, unbound, of a scheduler in
  the actuator's scope, with `preemptionPolicy` not `Never`;
- a nomination is written only to such a preemptor.

What the actuator does not re-check (docs/topics.md, "Who can make what happen"): that the
node really lacks room. A forged pod filling a node makes the worker preempt there for a real
pending preemptor; kube-scheduler's own view (nominated pods included) is not one the actuator
can read per decision. The damage is bounded by the rules above.

Examples: FORGED_LOG_EXAMPLES (default 200 under `make test`; the closing note's figure was
measured with thousands).
"""

from __future__ import annotations

import asyncio
import copy
import os
from typing import Any

import kmock
import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.cluster import POD_GROUP
from engine.config import Config
from fold import fleet
from streams.kafka.deadletter import Origin
from streams.kafka.sink import MemorySink
from streams.kube import api, eviction
from streams.kube.actuator import Actuator, Freshness
from streams.kube.ledger import Ledger
from tests.k8s import objects
from tests.k8s.decisions import FAST, KEY
from tests.k8s.fakeapi import FakeApi

SCHEDULER = "preemptctl-scheduler"
PROTECTED = ("kube-system",)
EXAMPLES = int(os.environ.get("FORGED_LOG_EXAMPLES", "200"))
CLUSTER = "default"

# The live cluster: (name, namespace, node, priority, scheduler, unschedulable, policy).
LIVE_PODS: tuple[tuple[str, str, str | None, int, str | None, bool, str | None], ...] = (
    ("high", "default", None, 1000, SCHEDULER, True, None),
    ("never", "default", None, 100_000, SCHEDULER, True, "Never"),
    ("foreign", "default", None, 100_000, "default-scheduler", True, None),
    ("w-0", "batch", None, 500, SCHEDULER, True, None),
    ("w-1", "batch", None, 700, SCHEDULER, True, None),
    ("batch-low", "batch", "n2", 20, None, False, None),
    ("low-a", "default", "n1", 10, None, False, None),
    ("low-b", "default", "n1", 10, None, False, None),
    ("low-c", "default", "n2", 20, None, False, None),
    ("mid", "default", "n2", 600, None, False, None),
    ("equal", "default", "n1", 1000, None, False, None),
    ("above", "default", "n1", 5000, None, False, None),
    ("bound-high", "default", "n2", 100_000, SCHEDULER, False, None),
    ("coredns", "kube-system", "n1", 2_000_000_000, None, False, None),
)
# Bound pods twice: the lies that matter most restate a would-be victim.
NAMES = [p[0] for p in LIVE_PODS] + [p[0] for p in LIVE_PODS if p[2]] + ["ghost-1", "ghost-2"]
NODES = ["n1", "n2", "ghost-node"]
PRIORITIES = [-5, 0, 10, 500, 999, 1000, 1001, 5000, 100_000, 2_000_000_000]


def _live(fake: FakeApi) -> dict[tuple[str, str], dict[str, Any]]:
    # n1: five 1-CPU pods on 6 CPUs; n2: four on 5. A 3-CPU preemptor fits nowhere as it is.
    fake.create("nodes", objects.node("n1", cpu="6"))
    fake.create("nodes", objects.node("n2", cpu="5"))
    fake.create("elasticquotas", objects.elastic_quota("team", namespace="batch"))
    pods = {}
    for name, namespace, node, priority, scheduler, unschedulable, policy in LIVE_PODS:
        labels = {POD_GROUP: "train"} if name.startswith("w-") else None
        pod = objects.pod(
            name,
            namespace=namespace,
            node=node,
            priority=priority,
            cpu="3" if node is None else "1",
            scheduler=scheduler,
            unschedulable=unschedulable,
            labels=labels,
        )
        if policy:
            pod["spec"]["preemptionPolicy"] = policy
        pods[(namespace, name)] = fake.create("pods", pod)
    return pods


LIES = ("priority", "node", "uid", "scheduler", "policy", "group", "nominated", "cpu", "namespace")


@st.composite
def forged_events(draw: st.DrawFn) -> list[dict[str, Any]]:
    """What the attacker appends. A forged pod mostly restates a live pod (its name, namespace,
    uid, node...) with one to three lies, the strongest forgeries; sometimes it is a stranger.
    Nodes, PriorityClasses, quotas and OUTCOME events are forged too."""
    drawn = []
    for _ in range(draw(st.integers(1, 5))):
        what = draw(
            st.sampled_from(["pod", "pod", "pod", "pod", "delete", "node", "class", "quota", "outcome"])
        )
        drawn.append(
            {
                "what": what,
                "type": draw(st.sampled_from(["ADDED", "MODIFIED"])),
                "base": draw(st.sampled_from(NAMES)),
                "lies": draw(st.sets(st.sampled_from(LIES), min_size=1, max_size=2)),
                "priority": draw(st.sampled_from(PRIORITIES)),
                "node": draw(st.sampled_from([None, *NODES])),
                "uid": draw(st.sampled_from(["forged", "another live pod's"])),
                "scheduler": draw(st.sampled_from([SCHEDULER, "default-scheduler", None])),
                "policy": draw(st.sampled_from([None, "Never", "PreemptLowerPriority"])),
                "group": draw(st.sampled_from([None, "train", "other"])),
                "nominated": draw(st.sampled_from(NODES)),
                "cpu": draw(st.sampled_from(["100m", "1", "3", "8", "64"])),
                "namespace": draw(st.sampled_from(["default", "batch", "kube-system"])),
            }
        )
    return drawn


def _event(spec: dict[str, Any], live: dict[tuple[str, str], dict[str, Any]], ts: str) -> dict[str, Any]:
    what, lies = spec["what"], spec["lies"]
    if what == "node":
        name = spec["node"] or "n1"
        return {
            "ts": ts,
            "type": spec["type"],
            "object": {"kind": "Node", **objects.node(name, cpu=spec["cpu"])},
        }
    if what == "class":
        klass = objects.priority_class(spec["base"], spec["priority"])
        return {"ts": ts, "type": spec["type"], "object": {"kind": "PriorityClass", **klass}}
    if what == "quota":
        quota = objects.elastic_quota("team", namespace=spec["namespace"])
        quota["spec"]["min"]["cpu"] = spec["cpu"]
        quota["metadata"]["uid"] = f"quota-{spec['namespace']}"
        return {"ts": ts, "type": spec["type"], "object": {"kind": "ElasticQuota", **quota}}
    if what == "outcome":
        uid = next(iter(live.values()))["metadata"]["uid"]
        outcome = {
            "decisionId": f"{CLUSTER}/1/{uid}",
            "preemptorUid": uid,
            "nomination": "done",
            "victims": {},
        }
        return {"ts": ts, "type": "OUTCOME", "outcome": outcome}
    real = next((pod for (_, name), pod in sorted(live.items()) if name == spec["base"]), None)
    pod = (
        copy.deepcopy(real)
        if real is not None
        else objects.pod(spec["base"], cpu=spec["cpu"], unschedulable=True)
    )
    pod["metadata"].setdefault("uid", f"forged-{spec['base']}")
    pod_spec, status = pod["spec"], pod["status"]
    if "priority" in lies:
        pod_spec["priority"] = spec["priority"]
    if "node" in lies:
        pod_spec.pop("nodeName", None)
        status.pop("conditions", None)
        if spec["node"]:
            pod_spec["nodeName"] = spec["node"]
        else:
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    if "uid" in lies:
        others = [p["metadata"]["uid"] for p in live.values() if p is not real]
        pod["metadata"]["uid"] = f"forged-{spec['base']}" if spec["uid"] == "forged" else others[0]
    if "scheduler" in lies:
        pod_spec.pop("schedulerName", None)
        if spec["scheduler"]:
            pod_spec["schedulerName"] = spec["scheduler"]
    if "policy" in lies:
        pod_spec.pop("preemptionPolicy", None)
        if spec["policy"]:
            pod_spec["preemptionPolicy"] = spec["policy"]
    if "group" in lies:
        pod["metadata"]["labels"].pop(POD_GROUP, None)
        if spec["group"]:
            pod["metadata"]["labels"][POD_GROUP] = spec["group"]
    if "nominated" in lies and not pod_spec.get("nodeName"):
        status["nominatedNodeName"] = spec["nominated"]
    if "cpu" in lies:
        pod_spec["containers"][0]["resources"]["requests"]["cpu"] = spec["cpu"]
    if "namespace" in lies:
        pod["metadata"]["namespace"] = spec["namespace"]
    return {
        "ts": ts,
        "type": "DELETED" if what == "delete" else spec["type"],
        "object": {"kind": "Pod", **pod},
    }


def _source_log(fake: FakeApi, live: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """What an honest source writes for the live cluster: a RESYNC scoped to the profile, then
    every object."""
    ts = "2026-11-27T10:00:00Z"
    log: list[dict[str, Any]] = [{"ts": ts, "type": "RESYNC", "scope": {"schedulerNames": [SCHEDULER]}}]
    for plural, kind in (("nodes", "Node"), ("elasticquotas", "ElasticQuota")):
        for (p, _, _), obj in sorted(fake.objects.items(), key=lambda item: str(item[0])):
            if p == plural:
                log.append({"ts": ts, "type": "ADDED", "object": {"kind": kind, **obj}})
    # Bound pods first, as a relist would give them any order: the pending ones then see full nodes.
    for _, pod in sorted(live.items(), key=lambda item: (not item[1]["spec"].get("nodeName"), item[0])):
        log.append({"ts": ts, "type": "ADDED", "object": {"kind": "Pod", **pod}})
    return log


def _pending(event: dict[str, Any]) -> bool:
    obj = event.get("object") or {}
    return obj.get("kind") == "Pod" and not obj["spec"].get("nodeName")


def _allowed(
    decision: dict[str, Any], live: dict[tuple[str, str], dict[str, Any]]
) -> tuple[set[str], set[str]]:
    """(victims, preemptors) the live objects allow this decision to write to, by namespace/name."""
    if decision.get("placements"):  # a gang placed on several nodes; a one-member job has `node`
        members = decision.get("placements") or {}
        uids = decision.get("memberUids") or {}
        nodes = set(members.values())
    else:
        members = {decision.get("preemptor"): decision.get("node")}
        uids = {decision.get("preemptor"): decision.get("preemptorUid")}
        nodes = {decision.get("node")}
    preemptors = set()
    for ref in members:
        namespace, _, name = str(ref).partition("/")
        pod = live.get((namespace, name))
        if (
            pod is None
            or pod["metadata"]["uid"] != uids.get(ref)
            or pod["spec"].get("nodeName")
            or pod["spec"].get("schedulerName") != SCHEDULER
            or pod["spec"].get("preemptionPolicy") == "Never"
        ):
            return set(), set()  # one member failing refuses the whole decision
        preemptors.add(str(ref))
    if not preemptors:
        return set(), set()
    floor = min(live[tuple(ref.split("/", 1))]["spec"]["priority"] for ref in preemptors)  # type: ignore[index]
    victims = {
        f"{namespace}/{name}"
        for (namespace, name), pod in live.items()
        if pod["spec"].get("nodeName") in nodes
        and namespace not in PROTECTED
        and pod["spec"]["priority"] < floor
    }
    return victims, preemptors


async def _attack(specs: list[dict[str, Any]], split: int) -> None:
    async with kmock.KubernetesScaffold() as handler, kmock.Server(handler) as server:
        served = api.for_host(str(server.url))
        try:
            fake = FakeApi(handler)
            live = _live(fake)
            truth = copy.deepcopy(live)
            log = _source_log(fake, live)
            forged = [_event(s, live, f"2026-11-27T10:00:{i + 1:02d}Z") for i, s in enumerate(specs)]
            # The forged events land anywhere in the log; mostly (split < 0) just before the
            # pending pods, where they shape those pods' first decisions.
            at = 1 + split % len(log) if split >= 0 else next(i for i, e in enumerate(log) if _pending(e))
            log = log[:at] + forged + log[at:]
            log.append({"ts": "2026-11-27T10:01:00Z", "type": "TICK"})
            decided = fleet.fold([dict(e, cluster=CLUSTER) for e in log], Config(), key=KEY).decisions
            sink = MemorySink()
            act = Actuator(
                eviction.Actions(served, identity="test", retry=FAST),
                sink,
                Ledger(),
                hmac_key=KEY,
                scope=(SCHEDULER,),
                protected_namespaces=PROTECTED,
                freshness=Freshness(max_age_s=None),
            )
            wrote, lied = 0, False
            for n, record in enumerate(decided):
                before = len(fake.writes())
                value = orjson.dumps(dict(record))
                await asyncio.wait_for(act.handle(value, key=CLUSTER.encode(), origin=Origin("d", 0, n)), 60)
                victims, preemptors = _allowed(dict(record), truth)
                named = {
                    f"{v['namespace']}/{v['name']}"
                    for v in record.get("victims") or []
                    if isinstance(v, dict)
                }
                lied |= bool(named - victims)
                for call in fake.writes()[before:]:
                    if call.plural != "pods":
                        continue
                    ref = f"{call.namespace}/{call.name}"
                    if call.subresource == "status" and ref in preemptors:
                        continue  # a nomination of a live, valid preemptor
                    wrote += 1
                    assert ref in victims, (
                        f"{call.method} {ref} {call.subresource} {orjson.dumps(dict(record)).decode()}"
                    )
            event("wrote to a victim" if wrote else "nothing written")
            # How often the forgery worked on the worker: a decision naming a victim the live
            # objects do not allow (the actuator must then refuse it).
            event(
                "a decision names a victim the live objects forbid" if lied else "every named victim allowed"
            )
            event(f"decisions: {min(len(decided), 3)}{'+' if len(decided) > 3 else ''}")
            coredns = fake.get("pods", "kube-system", "coredns")
            assert coredns is not None and not coredns["metadata"].get("deletionTimestamp")
            assert eviction.SOFT_EVICTION not in coredns["metadata"].get("labels", {})
        finally:
            await served.close()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=forged_events(), split=st.sampled_from([-1, -1, -1]) | st.integers(0, 100))
def test_no_forged_log_gets_a_pod_written_to_that_the_live_objects_do_not_allow(
    specs: list[dict[str, Any]], split: int
) -> None:
    asyncio.run(_attack(specs, split))
