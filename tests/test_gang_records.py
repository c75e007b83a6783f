"""A gang's decision record names every member's uid (`memberUids`), which the actuator checks live.

The actuator refuses a gang decision unless each member it would nominate exists with
the uid the decision names (streams/kube/actuator.py): without the worker writing
them, every real gang decision would be refused.
"""

from __future__ import annotations

from engine.config import Config
from fold.controller import Controller
from tests.support import gen

TS = "2026-01-01T00:00:00Z"
GROUP = "pod-group.scheduling.sigs.k8s.io"


def test_a_gang_decision_carries_each_members_uid() -> None:
    ctl = Controller("c", Config())
    rv = 0

    def add(obj: dict, kind: str = "ADDED") -> list:  # type: ignore[type-arg]
        nonlocal rv
        rv += 1
        obj["metadata"]["resourceVersion"] = str(rv)
        return ctl.step({"ts": TS, "type": kind, "object": obj}).records

    for n in ("n1", "n2"):
        add(gen.node(n, 2, 8, 110))
        add(gen.pod(f"low-{n}", node=n, priority=0, cpu_m=2000))
    # Both members pending before kube-scheduler marks either unschedulable: one gang decision.
    members = [
        gen.pod(f"m{k}", node=None, priority=100, cpu_m=1500, labels={GROUP: "train"}) for k in range(2)
    ]
    records = []
    for member in members:
        records.extend(add(member))
    for member in members:
        member["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": TS}
        ]
        records.extend(add(member, "MODIFIED"))
    gangs = [r for r in records if "placements" in r]
    assert gangs, records
    for r in gangs:
        assert r["outcome"] == "preempt"
        assert r["memberUids"] == {key: f"{key.split('/')[1]}-uid" for key in r["placements"]}
