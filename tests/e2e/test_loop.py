"""The whole loop on a real control plane (issue 22): kube-scheduler binds what preemptctl decides.

kube-apiserver + etcd, kube-scheduler v1.34.2 with both profiles of docs/deploy.md,
kwok faking the nodes and the pods' lifecycle, and preemptctl's source, worker and
actuator as processes (tests/e2e/stack.py). Each test builds its own small corner of
the cluster (nodes labelled with its group, pods selecting them) and waits, polling
the API server, for what a user would see: the preemptor bound, the victims gone.
Waits are generous deadlines for a loaded machine, never timings asserted.
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
from typing import Any

import pytest

from tests.e2e import objects
from tests.e2e.conftest import NAMESPACE
from tests.e2e.stack import ControlPlane, Stack, wait_for

# From a preemptor's creation to its binding: a decision, evictions, kwok removing the
# victims and kube-scheduler's retry take about a second on idle cores; a loaded CI
# machine gets much more before a test counts it as never bound.
BIND_TIMEOUT_S = 90.0
# Long enough for a wrong extra decision or eviction to show up after the fact.
SETTLE_S = 3.0

LOW, MID, HIGH = "e2e-low", "e2e-mid", "e2e-high"


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
             pc: str = LOW, labels: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Low-priority pods bound straight to each node; returns them by name once Running."""
    made = {}
    for node in nodes:
        for i in range(per_node):
            name = f"{node}-v{i}"
            made[name] = plane.create(
                objects.pod(name, NAMESPACE, group, cpu=cpu, priority_class=pc, node=node, labels=labels)
            )
    for name in made:
        wait_for(lambda n=name: _phase(plane, n) == "Running", f"kwok runs {name}", 60)
    return made


def _phase(plane: ControlPlane, name: str) -> str | None:
    pod = plane.pod(NAMESPACE, name)
    return None if pod is None else (pod.get("status") or {}).get("phase")


def _bound(plane: ControlPlane, name: str) -> str | None:
    pod = plane.pod(NAMESPACE, name)
    return None if pod is None else pod["spec"].get("nodeName")


def _gone(plane: ControlPlane, pod: dict[str, Any]) -> bool:
    now = plane.pod(NAMESPACE, pod["metadata"]["name"])
    return now is None or now["metadata"]["uid"] != pod["metadata"]["uid"]


def _decisions_for(loop: Stack, uid: str) -> list[dict[str, Any]]:
    return [d for d in loop.decisions() if d["preemptorUid"] == uid]


def _watch_until_bound(plane: ControlPlane, name: str) -> tuple[str, list[str | None]]:
    """Poll the preemptor until bound; the nominations it showed meanwhile, in order, deduplicated."""
    seen: list[str | None] = []
    deadline = time.monotonic() + BIND_TIMEOUT_S
    while time.monotonic() < deadline:
        pod = plane.pod(NAMESPACE, name)
        assert pod is not None, f"{name} vanished"
        if pod["spec"].get("nodeName"):
            return pod["spec"]["nodeName"], seen
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if not seen or seen[-1] != nominated:
            seen.append(nominated)
        time.sleep(0.05)
    raise AssertionError(f"{name} not bound within {BIND_TIMEOUT_S:g} s; nominations seen {seen}")


def _preempted_exactly(
    plane: ControlPlane, decision: dict[str, Any], victims: dict[str, dict[str, Any]]
) -> None:
    chosen = {v["name"] for v in decision["victims"]}
    for name, pod in victims.items():
        if name in chosen:
            wait_for(lambda p=pod: _gone(plane, p), f"decided victim {name} gone", BIND_TIMEOUT_S)
        else:
            assert not _gone(plane, pod), f"{name} was not a decided victim, yet it is gone"


# ---- the loop -------------------------------------------------------------------------------


def test_preemptor_is_bound_on_the_decided_node_with_exactly_its_victims_gone(
    plane: ControlPlane, loop: Stack
) -> None:
    group = "main"
    nodes = _nodes(plane, group, 2)
    victims = _victims(plane, group, nodes, 2)
    pre = plane.create(objects.pod("main-p", NAMESPACE, group, cpu="3", priority_class=HIGH))
    node, nominations = _watch_until_bound(plane, "main-p")
    (decision,) = [d for d in _decisions_for(loop, pre["metadata"]["uid"]) if d["outcome"] == "preempt"]
    assert node == decision["node"]
    # kube-scheduler kept preemptctl's nomination: never cleared, never another node.
    assert [n for n in nominations if n is not None] in ([], [decision["node"]])
    assert nominations[-1] in (None, decision["node"]) and nominations.count(None) <= 1
    assert len(decision["victims"]) == 2 and {v["node"] for v in decision["victims"]} == {node}
    _preempted_exactly(plane, decision, victims)
    time.sleep(SETTLE_S)
    _preempted_exactly(plane, decision, victims)
