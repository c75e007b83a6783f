"""Busy logs of one cluster for the controller's queue: preemptors, victims coming and going, nodes
changing, outcomes, ticks and resyncs (tests/test_liveness.py, tests/test_projection.py,
tests/test_fold_projection.py).

`busy_logs`: the hypothesis strategy; `pending` and `bound`: its pods (a preemptor kube-scheduler
found no room for, a pod on a node); `ts(seconds)`: its time, from 2026-01-01; `fold`: every
decision of a controller folding a log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from engine import timeutil
from schemas.records import DecisionRecord
from tests.support import gen

if TYPE_CHECKING:
    from fold.controller import Controller

BASE_SECONDS = 1_767_225_600  # 2026-01-01T00:00:00Z


def ts(seconds: float) -> str:
    return timeutil.render(int((BASE_SECONDS + seconds) * timeutil.SECOND))


def pending(
    name: str, priority: int = 1000, cpu_m: int = 2000, scheduler: str | None = None
) -> dict[str, Any]:
    """A pod kube-scheduler found no room for: PodScheduled False/Unschedulable."""
    obj = gen.pod(name, node=None, priority=priority, cpu_m=cpu_m)
    obj["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": ts(0)}
    ]
    if scheduler:
        obj["spec"]["schedulerName"] = scheduler
    return obj


def bound(name: str, node: str, priority: int = 0, cpu_m: int = 2000, **kw: Any) -> dict[str, Any]:
    return gen.pod(name, node=node, priority=priority, cpu_m=cpu_m, **kw)


@st.composite
def busy_logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Preemptors, victims coming and going, nodes changing, outcomes, ticks and resyncs; with
    a toleration policy, tolerant victims too, and ticks exactly on their windows' ends."""
    events: list[dict[str, Any]] = []
    at = 0.0
    rv = 0
    window = draw(st.sampled_from((0, 1, 3, 10)))  # toleration-seconds; 0: no policy at all
    ends: list[float] = []  # the tolerant victims' windows' last protected instants
    choices: tuple[str, ...] = (
        "pending",
        "pending",
        "bound",
        "delete",
        "node",
        "pdb",
        "tick",
        "tick",
        "outcome",
        "resync",
    )
    if window:
        choices += ("tolerant", "window-end", "window-end")
        policy = gen.tolerant_class()  # tolerates preemptors below 1000: p* of priority 100
        annotations = policy["metadata"]["annotations"]
        annotations["preemption-toleration.scheduling.x-k8s.io/toleration-seconds"] = str(window)
        rv += 1
        policy["metadata"]["resourceVersion"] = str(rv)
        events.append({"ts": ts(at), "type": "ADDED", "object": policy})
    decided_ids = [f"c/{n}/p{i}-uid" for n in range(0, 40) for i in range(3)]
    for _ in range(draw(st.integers(5, 60))):
        at += draw(st.sampled_from((0, 0.3, 1, 2, 7, 400)))
        choice = draw(st.sampled_from(choices))
        if choice == "window-end":
            later = sorted(e for e in ends if e >= at)
            if later:
                at = draw(st.sampled_from(later))
            choice = "tick"
        event: dict[str, Any] = {"ts": ts(at)}
        if choice == "tick":
            events.append({**event, "type": "TICK"})
            continue
        if choice == "resync":
            scope = draw(st.sampled_from((None, ["preemptctl-scheduler"])))
            events.append(
                {**event, "type": "RESYNC", **({"scope": {"schedulerNames": scope}} if scope else {})}
            )
            continue
        if choice == "outcome":
            victims = {
                f"v{i}-uid": draw(st.sampled_from(("done", "error", "blocked-by-pdb")))
                for i in range(draw(st.integers(0, 2)))
            }
            body = {
                "decisionId": draw(st.sampled_from(decided_ids)),
                "preemptorUid": f"p{draw(st.integers(0, 2))}-uid",
                "nomination": draw(st.sampled_from(("done", "bound", "none"))),
                "victims": victims,
            }
            events.append({**event, "type": "OUTCOME", "outcome": body})
            continue
        rv += 1
        if choice == "pending":
            obj = pending(
                f"p{draw(st.integers(0, 2))}",
                priority=draw(st.sampled_from((100, 1000))),
                scheduler=draw(st.sampled_from((None, "preemptctl-scheduler"))),
            )
            kind = "ADDED"
        elif choice == "bound":
            obj = bound(
                f"v{draw(st.integers(0, 2))}",
                draw(st.sampled_from(("n1", "n2"))),
                priority=draw(st.sampled_from((0, 50))),
            )
            kind = "ADDED"
        elif choice == "tolerant":
            obj = bound(f"t{draw(st.integers(0, 1))}", "n1", priority_class="tolerant", start=ts(at))
            del obj["spec"]["priority"]  # the class's value, 10
            ends.append(at + window)
            kind = "ADDED"
        elif choice == "delete":
            obj = bound(f"v{draw(st.integers(0, 2))}", "n1")
            kind = "DELETED"
        elif choice == "node":
            obj = gen.node(
                draw(st.sampled_from(("n1", "n2"))),
                draw(st.sampled_from((2, 4))),
                8,
                110,
                taint=draw(st.booleans()),
            )
            kind = draw(st.sampled_from(("ADDED", "MODIFIED", "DELETED")))
        else:
            obj = gen.pdb("web", "web", draw(st.integers(0, 1)))
            kind = "MODIFIED"
        obj["metadata"]["resourceVersion"] = str(rv)
        events.append({**event, "type": kind, "object": obj})
    return events


def fold(
    ctl: Controller, events: list[dict[str, Any]], dirty: dict[str, bytes | None] | None = None
) -> list[DecisionRecord]:
    """Every decision of folding `events` through `ctl`, in order; each Ready's store keys into
    `dirty`, as the worker gathers them."""
    out: list[DecisionRecord] = []
    for e in events:
        ready = ctl.step(e)
        out += ready.records
        if dirty is not None:
            dirty.update(ready.dirty)
    return out
