"""The simulator binds a pod only where kube-scheduler would: the inter-pod filters included.

`replay --simulate` and `preemptctl run` play kube-scheduler's part with the engine's
own filters (engine.interpod); a pod whose host port is held by a more important pod
must stay pending there, as it does on a real cluster, not bind where only its
resources fit.
"""

from __future__ import annotations

from typing import Any

from engine.config import Config
from streams.sim import simulator
from tests.support import gen

TS = "2026-01-01T00:00:00Z"


def _trace(port_of_holder: int) -> list[dict[str, Any]]:
    holder = gen.pod("holder", node="n1", priority=2000, cpu_m=500)
    holder["spec"]["containers"][0]["ports"] = [{"containerPort": 1, "hostPort": port_of_holder}]
    pending = gen.pod("p", node=None, priority=1000, cpu_m=500)
    pending["spec"]["containers"][0]["ports"] = [{"containerPort": 1, "hostPort": 8080}]
    objects = [gen.node("n1", 4, 8, 110), holder, pending]
    for rv, obj in enumerate(objects, start=1):
        obj["metadata"]["resourceVersion"] = str(rv)
    return [{"ts": TS, "type": "ADDED", "object": obj} for obj in objects]


def _bound(result: simulator.Result) -> set[str]:
    return {
        e["object"]["metadata"]["name"]
        for e in result.log
        if e.get("type") == "MODIFIED" and (e["object"].get("spec") or {}).get("nodeName")
    }


def test_a_pod_whose_port_is_held_stays_pending_in_the_simulation() -> None:
    held = simulator.simulate(_trace(8080), Config())
    assert "p" not in _bound(held)
    assert [d["outcome"] for d in held.decisions] == ["unschedulable"]
    free = simulator.simulate(_trace(9090), Config())
    assert "p" in _bound(free)
