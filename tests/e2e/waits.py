"""What the end-to-end tests wait for and check on the control plane (tests/e2e/test_loop.py,
test_interpod.py): a pod's phase, a preemptor watched until bound (the nominations it showed
meanwhile), exactly the decided victims gone; and what they share: the namespaces of the two
stacks, the PriorityClasses, the deadlines.
"""

from __future__ import annotations

import time
from typing import Any

from testbed.stack import ControlPlane, Stack, wait_for

NAMESPACE = "e2e"
KAFKA_NAMESPACE = "e2e-kafka"
# From a preemptor's creation to its binding: a decision, evictions, kwok removing the
# victims and kube-scheduler's retry take about a second on idle cores; a loaded CI
# machine gets much more before a test counts it as never bound.
BIND_TIMEOUT_S = 90.0
# Long enough for a wrong extra decision or eviction to show up after the fact.
SETTLE_S = 3.0

LOW, MID, HIGH = "e2e-low", "e2e-mid", "e2e-high"


def phase(plane: ControlPlane, name: str, namespace: str = NAMESPACE) -> str | None:
    pod = plane.pod(namespace, name)
    return None if pod is None else (pod.get("status") or {}).get("phase")


def gone(plane: ControlPlane, pod: dict[str, Any]) -> bool:
    now = plane.pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
    return now is None or now["metadata"]["uid"] != pod["metadata"]["uid"]


def decisions_for(loop: Stack, uid: str) -> list[dict[str, Any]]:
    return [d for d in loop.decisions() if d["preemptorUid"] == uid]


def watch_until_bound(
    plane: ControlPlane, name: str, namespace: str = NAMESPACE
) -> tuple[str, list[str | None]]:
    """Poll the preemptor until bound; the nominations it showed meanwhile, in order, deduplicated."""
    seen: list[str | None] = []
    deadline = time.monotonic() + BIND_TIMEOUT_S
    while time.monotonic() < deadline:
        pod = plane.pod(namespace, name)
        assert pod is not None, f"{name} vanished"
        if pod["spec"].get("nodeName"):
            return pod["spec"]["nodeName"], seen
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if not seen or seen[-1] != nominated:
            seen.append(nominated)
        time.sleep(0.05)
    raise AssertionError(f"{name} not bound within {BIND_TIMEOUT_S:g} s; nominations seen {seen}")


def preempted_exactly(
    plane: ControlPlane, decision: dict[str, Any], victims: dict[str, dict[str, Any]]
) -> None:
    chosen = {v["name"] for v in decision["victims"]}
    for name, pod in victims.items():
        if name in chosen:
            wait_for(lambda p=pod: gone(plane, p), f"decided victim {name} gone", BIND_TIMEOUT_S)
        else:
            assert not gone(plane, pod), f"{name} was not a decided victim, yet it is gone"
