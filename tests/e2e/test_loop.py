"""The whole loop on a real control plane (issue 22): kube-scheduler binds what preemptctl decides.

kube-apiserver + etcd, kube-scheduler v1.34.2 with both profiles of docs/deploy.md,
kwok faking the nodes and the pods' lifecycle, and preemptctl's source, worker and
actuator as processes (testbed/stack.py). Each test builds its own small corner of
the cluster (nodes labelled with its group, pods selecting them) and waits, polling
the API server, for what a user would see: the preemptor bound, the victims gone.
Waits are generous deadlines for a loaded machine, never timings asserted.
"""

from __future__ import annotations

import contextlib
import signal
import time
import urllib.error
from collections import Counter
from typing import Any

import pytest

from testbed import objects
from testbed.stack import ControlPlane, Stack, wait_for
from tests.e2e.waits import (
    BIND_TIMEOUT_S,
    HIGH,
    KAFKA_NAMESPACE,
    LOW,
    MID,
    NAMESPACE,
    SETTLE_S,
    decisions_for,
    gone,
    phase,
    preempted_exactly,
    watch_until_bound,
)


@pytest.fixture(scope="session", autouse=True)
def priority_classes(plane: ControlPlane) -> None:
    for name, value in ((LOW, 10), (MID, 500), (HIGH, 1000)):
        with contextlib.suppress(urllib.error.HTTPError):
            plane.create(objects.priority_class(name, value))


def _nodes(plane: ControlPlane, group: str, count: int, **kw: Any) -> list[str]:
    names = [f"{group}-n{i}" for i in range(count)]
    for name in names:
        plane.create(objects.node(name, group, **kw))
    for name in names:
        wait_for(lambda n=name: plane.ready_node(n), f"kwok made {name} Ready", 60)
    return names


def _victims(plane: ControlPlane, group: str, nodes: list[str], per_node: int, *, cpu: str = "2",
             pc: str = LOW, labels: dict[str, str] | None = None,
             namespace: str = NAMESPACE) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Low-priority pods bound straight to each node; returns them by name once Running."""
    made = {}
    for node in nodes:
        for i in range(per_node):
            name = f"{node}-v{i}"
            made[name] = plane.create(
                objects.pod(name, namespace, group, cpu=cpu, priority_class=pc, node=node, labels=labels)
            )
    for name in made:
        wait_for(lambda n=name: phase(plane, n, namespace) == "Running", f"kwok runs {name}", 60)
    return made


def _bound(plane: ControlPlane, name: str) -> str | None:
    pod = plane.pod(NAMESPACE, name)
    return None if pod is None else pod["spec"].get("nodeName")


# ---- the loop -------------------------------------------------------------------------------


def _the_loop(plane: ControlPlane, loop: Stack, group: str, namespace: str) -> None:
    nodes = _nodes(plane, group, 2)
    victims = _victims(plane, group, nodes, 2, namespace=namespace)
    pre = plane.create(objects.pod(f"{group}-p", namespace, group, cpu="3", priority_class=HIGH))
    node, nominations = watch_until_bound(plane, f"{group}-p", namespace)
    (decision,) = [d for d in decisions_for(loop, pre["metadata"]["uid"]) if d["outcome"] == "preempt"]
    assert node == decision["node"]
    # kube-scheduler kept preemptctl's nomination: never cleared, never another node.
    assert [n for n in nominations if n is not None] in ([], [decision["node"]])
    assert nominations[-1] in (None, decision["node"]) and nominations.count(None) <= 1
    assert len(decision["victims"]) == 2 and {v["node"] for v in decision["victims"]} == {node}
    preempted_exactly(plane, decision, victims)
    time.sleep(SETTLE_S)
    preempted_exactly(plane, decision, victims)


def test_preemptor_is_bound_on_the_decided_node_with_exactly_its_victims_gone(
    plane: ControlPlane, loop: Stack
) -> None:
    _the_loop(plane, loop, "main", NAMESPACE)


def test_the_loop_on_apache_kafka(plane: ControlPlane, kafka_loop: Stack) -> None:
    _the_loop(plane, kafka_loop, "kafka", KAFKA_NAMESPACE)


def test_a_refused_decision_then_another_preemptor_for_the_node_ends_bound(
    plane: ControlPlane, loop: Stack
) -> None:
    """Issue 22, 3: p1's decision is refused (p1 found room elsewhere first); p2, decided while
    p1's victim still looked "leaving", must still get that victim evicted and be bound."""
    group = "refused"
    full, other = _nodes(plane, group, 2)
    (victim,) = _victims(plane, group, [full], 1, cpu="4").values()
    blocker = plane.create(
        objects.pod("refused-b", NAMESPACE, group, cpu="4", priority_class=MID, node=other)
    )
    wait_for(lambda: phase(plane, "refused-b") == "Running", "kwok runs the blocker", 60)
    loop.pause("actuator")  # the actuator is late: p1's decision waits in the topic
    try:
        p1 = plane.create(objects.pod("refused-p1", NAMESPACE, group, cpu="4", priority_class=HIGH))
        first = wait_for(lambda: decisions_for(loop, p1["metadata"]["uid"]), "p1 decided", BIND_TIMEOUT_S)
        assert (first[0]["outcome"], first[0]["node"]) == ("preempt", full)
        plane.delete(blocker)  # room appears elsewhere: kube-scheduler binds p1 there
        assert wait_for(lambda: _bound(plane, "refused-p1"), "p1 bound", BIND_TIMEOUT_S) == other
        p2 = plane.create(objects.pod("refused-p2", NAMESPACE, group, cpu="4", priority_class=MID))
        second = wait_for(lambda: decisions_for(loop, p2["metadata"]["uid"]), "p2 decided", BIND_TIMEOUT_S)
        # p2 is decided onto the node whose victim the worker thinks is already leaving.
        assert second[0]["node"] == full and all(v.get("terminating") for v in second[0]["victims"])
    finally:
        loop.resume("actuator")
    # The actuator refuses p1's decision (bound); the worker folds that back and decides p2 again.
    assert wait_for(lambda: _bound(plane, "refused-p2"), "p2 bound", BIND_TIMEOUT_S) == full
    assert gone(plane, victim)
    outcomes = [e["outcome"] for e in loop.events() if e["type"] == "OUTCOME"]
    assert any(o["decisionId"] == first[0]["id"] and o["nomination"] == "bound" for o in outcomes)


# ---- liveness: a preemptor whose answer changes is decided again ------------------------------


def test_a_taint_removed_ends_bound(plane: ControlPlane, loop: Stack) -> None:
    group = "taint"
    (node,) = _nodes(plane, group, 1, taint=True)
    (victim,) = _victims(plane, group, [node], 1, cpu="4").values()
    pre = plane.create(objects.pod("taint-p", NAMESPACE, group, cpu="4", priority_class=HIGH))
    (first,) = wait_for(lambda: decisions_for(loop, pre["metadata"]["uid"]), "decided", BIND_TIMEOUT_S)
    assert first["outcome"] == "unschedulable"
    plane.patch(objects.node(node, group), {"spec": {"taints": None}})
    assert watch_until_bound(plane, "taint-p")[0] == node
    assert gone(plane, victim)


def test_a_node_added_ends_bound(plane: ControlPlane, loop: Stack) -> None:
    group = "added"
    (first_node,) = _nodes(plane, group, 1)
    _victims(plane, group, [first_node], 1, cpu="4", pc=HIGH)  # not preemptable by an equal priority
    pre = plane.create(objects.pod("added-p", NAMESPACE, group, cpu="4", priority_class=HIGH))
    (first,) = wait_for(lambda: decisions_for(loop, pre["metadata"]["uid"]), "decided", BIND_TIMEOUT_S)
    assert first["outcome"] == "unschedulable"
    # A node joins already running a low-priority pod (bound before the node showed up, as a
    # DaemonSet's or a static pod would be): only preempting it makes room.
    new = f"{group}-n1"
    victim = plane.create(objects.pod(f"{new}-v0", NAMESPACE, group, cpu="4", priority_class=LOW, node=new))
    plane.create(objects.node(new, group))
    assert watch_until_bound(plane, "added-p")[0] == new
    wait_for(lambda: gone(plane, victim), "the new node's victim gone", BIND_TIMEOUT_S)


def test_a_pdb_loosened_ends_bound(plane: ControlPlane, loop: Stack) -> None:
    group = "pdb"
    (node,) = _nodes(plane, group, 1)
    (victim,) = _victims(plane, group, [node], 1, cpu="4", labels={"app": "pdb-web"}).values()
    budget = plane.cluster.apply(objects.pdb("pdb-web", NAMESPACE, "pdb-web", allowed=0, healthy=1))
    pre = plane.create(objects.pod("pdb-p", NAMESPACE, group, cpu="4", priority_class=HIGH))
    uid = victim["metadata"]["uid"]
    wait_for(
        lambda: [
            e for e in loop.evictions() if e["victim"]["uid"] == uid and e["result"] == "blocked-by-pdb"
        ],
        "the eviction blocked by the PDB",
        BIND_TIMEOUT_S,
        every_s=1.0,
    )
    assert _bound(plane, "pdb-p") is None
    # The disruption controller's part: the budget now allows one disruption.
    status = objects.pdb("pdb-web", NAMESPACE, "pdb-web", allowed=1, healthy=2)["status"]
    plane.patch(budget, {"status": status}, subresource="status")
    assert watch_until_bound(plane, "pdb-p")[0] == node
    assert gone(plane, victim)
    assert len([d for d in decisions_for(loop, pre["metadata"]["uid"]) if d["outcome"] == "preempt"]) >= 2


def test_a_toleration_window_ending_ends_bound(plane: ControlPlane, loop: Stack) -> None:
    group = "tolerate"
    seconds = 6
    with contextlib.suppress(urllib.error.HTTPError):
        plane.create(
            objects.priority_class(
                "e2e-tolerant",
                10,
                annotations={
                    "preemption-toleration.scheduling.x-k8s.io/minimum-preemptable-priority": "100000",
                    "preemption-toleration.scheduling.x-k8s.io/toleration-seconds": str(seconds),
                },
            )
        )
    (node,) = _nodes(plane, group, 1)
    # Scheduled by kube-scheduler, so the pod has PodScheduled=True: its window starts then.
    victim = plane.create(objects.pod("tolerate-v", NAMESPACE, group, cpu="4", priority_class="e2e-tolerant"))
    wait_for(lambda: phase(plane, "tolerate-v") == "Running", "the tolerant victim runs", BIND_TIMEOUT_S)
    pre = plane.create(objects.pod("tolerate-p", NAMESPACE, group, cpu="4", priority_class=HIGH))
    first = wait_for(lambda: decisions_for(loop, pre["metadata"]["uid"]), "decided", BIND_TIMEOUT_S)
    assert first[0]["outcome"] == "unschedulable", first[0]["reason"]
    assert watch_until_bound(plane, "tolerate-p")[0] == node
    assert gone(plane, victim)


def test_room_freed_without_a_new_unschedulable_message_ends_bound(plane: ControlPlane, loop: Stack) -> None:
    """Only preemptctl's re-decision can bind this preemptor. Its node holds a pod it may not
    preempt (higher priority) and one it may; preempting the lower one alone frees too little, so
    the answer is `unschedulable`. The higher pod is then deleted: kube-scheduler retries the
    preemptor (a pod deleted from a node it filtered on resources), and fails it again with the
    very same message ("0/N nodes are available: 1 Insufficient cpu, ..."), so it does not
    rewrite the PodScheduled condition and the preemptor's own record asks for nothing. The
    deletion is a change that could alter the answer: the worker decides again and preempts."""
    group = "same"
    (node,) = _nodes(plane, group, 1)
    kept = plane.create(objects.pod(f"{node}-h", NAMESPACE, group, cpu="2", priority_class=HIGH, node=node))
    (victim,) = _victims(plane, group, [node], 1, cpu="2").values()
    wait_for(lambda: phase(plane, f"{node}-h") == "Running", "kwok runs the higher pod", 60)
    pre = plane.create(objects.pod("same-p", NAMESPACE, group, cpu="4", priority_class=MID))
    uid = pre["metadata"]["uid"]
    (first,) = wait_for(lambda: decisions_for(loop, uid), "decided", BIND_TIMEOUT_S)
    assert first["outcome"] == "unschedulable", first
    message = _unschedulable_message(plane, "same-p")
    assert "Insufficient cpu" in message
    plane.delete(kept)
    wait_for(lambda: gone(plane, kept), "the higher pod gone", 60)
    assert watch_until_bound(plane, "same-p")[0] == node
    assert gone(plane, victim)
    # kube-scheduler wrote the preemptor's failure once: its retry after the deletion failed the
    # same way and wrote nothing (the audit log has every write; preemptctl's log keeps no messages).
    target = {"namespace": NAMESPACE, "name": "same-p", "subresource": "status"}
    writes = sorted(
        (
            e["requestReceivedTimestamp"],
            "kube-scheduler"
            if e.get("userAgent", "").startswith("kube-scheduler")
            else e["user"]["username"],
        )
        for e in plane.cluster.audit()
        if e["verb"] == "patch" and {k: e.get("objectRef", {}).get(k) for k in target} == target
    )
    nominated = next(i for i, (_, who) in enumerate(writes) if who != "kube-scheduler")
    assert [who for _, who in writes[:nominated]] == ["kube-scheduler"], writes
    decided = decisions_for(loop, uid)
    assert [d["outcome"] for d in decided][:1] == ["unschedulable"] and decided[-1]["outcome"] == "preempt"


def _unschedulable_message(plane: ControlPlane, name: str) -> str:
    pod = plane.pod(NAMESPACE, name)
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c.get("message", "") for c in conditions if c.get("type") == "PodScheduled"), "")


# ---- scope: the default profile's pods are kube-scheduler's ----------------------------------


def test_the_default_profiles_pods_are_never_decided_by_preemptctl(plane: ControlPlane, loop: Stack) -> None:
    group = "dflt"
    (node,) = _nodes(plane, group, 1)
    (victim,) = _victims(plane, group, [node], 1, cpu="4").values()
    pre = plane.create(
        objects.pod("dflt-p", NAMESPACE, group, cpu="4", priority_class=HIGH, scheduler="default-scheduler")
    )
    # kube-scheduler's DefaultPreemption nominates it, evicts the victim and binds it.
    assert watch_until_bound(plane, "dflt-p")[0] == node
    assert gone(plane, victim)
    time.sleep(SETTLE_S)
    uid = pre["metadata"]["uid"]
    # Written to the log once nominated (it claims capacity), but never decided for.
    assert any((e.get("object") or {}).get("metadata", {}).get("uid") == uid for e in loop.events())
    assert decisions_for(loop, uid) == []
    assert [e for e in loop.evictions() if e["victim"]["uid"] == victim["metadata"]["uid"]] == []
    scopes = [e.get("scope") for e in loop.events() if e["type"] == "RESYNC"]
    assert scopes and all(s == {"schedulerNames": ["preemptctl-scheduler"]} for s in scopes)


# ---- crashes: every preemptor bound, no victim evicted twice ------------------------------------


def test_worker_sigkill_and_actuator_restart_mid_run(plane: ControlPlane, loop: Stack) -> None:
    group = "crash"
    nodes = _nodes(plane, group, 4)
    victims = _victims(plane, group, nodes, 2)
    names = [f"crash-p{i}" for i in range(len(nodes))]
    uids = [
        plane.create(objects.pod(n, NAMESPACE, group, cpu="3", priority_class=HIGH))["metadata"]["uid"]
        for n in names
    ]
    wait_for(lambda: decisions_for(loop, uids[0]), "a first decision", BIND_TIMEOUT_S, every_s=0.1)
    loop.kill("worker")  # SIGKILL: no clean shutdown, no final commit
    loop.start("worker")
    loop.kill("actuator", signal.SIGTERM)
    loop.start("actuator")
    bound = {n: wait_for(lambda n=n: _bound(plane, n), f"{n} bound", BIND_TIMEOUT_S) for n in names}
    assert sorted(bound.values()) == sorted(nodes)
    time.sleep(SETTLE_S)
    ours = {v["metadata"]["uid"] for v in victims.values()}
    done = Counter(
        e["victim"]["uid"] for e in loop.evictions() if e["victim"]["uid"] in ours and e["result"] == "done"
    )
    assert done and max(done.values()) == 1, done
    for pod in victims.values():
        assert gone(plane, pod)
