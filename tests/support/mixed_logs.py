"""Logs of good events with garbage mixed in: for the fold's atomicity (tests/test_fold_atomic.py),
the worker (tests/test_worker.py), progress (tests/test_progress.py) and the chaos suite.

`good_logs`: a cluster's log, objects with rising resourceVersions, preemptors, ticks and a resync;
`garbage(ts)`: events the worker must reject (shapes it cannot read, malformed objects that pass
the shape check, unknown kinds, bad quantities, times and names); `mixed_logs`: a good log with
garbage inserted, and the garbage's positions. `ts(seconds)`: the logs' time, from 2026-01-01.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from engine import timeutil
from tests.support import gen

BASE_SECONDS = 1_767_225_600  # 2026-01-01T00:00:00Z


def ts(seconds: int) -> str:
    return timeutil.render((BASE_SECONDS + seconds) * timeutil.SECOND)


def _pdb(name: str, allowed: int) -> dict[str, Any]:
    p = gen.pdb(name, "a", allowed)
    p["metadata"]["uid"] = f"{name}-uid"
    return p


@st.composite
def good_logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A cluster's log: objects with rising resourceVersions, preemptors, ticks and a resync."""
    events: list[dict[str, Any]] = []
    seconds = 0
    rv = 0
    for _ in range(draw(st.integers(1, 45))):
        seconds += draw(st.sampled_from((0, 0, 1, 5, 400)))  # 400 s: nominations expire
        choice = draw(st.sampled_from(("pod", "pod", "pod", "node", "pdb", "class", "tick", "resync")))
        if choice == "tick":
            events.append({"ts": ts(seconds), "type": "TICK"})
            continue
        if choice == "resync":
            events.append({"ts": ts(seconds), "type": "RESYNC"})
            continue
        rv += 1
        if choice == "pod":
            name = draw(st.sampled_from(("a", "b", "c", "d")))
            obj = gen.pod(
                name,
                node=draw(st.sampled_from((None, "n1", "n2"))),
                priority=draw(st.sampled_from((0, 5))),
                cpu_m=draw(st.sampled_from((500, 1000, 1500))),
                labels={"app": "a"},
            )
            if obj["spec"].get("nodeName") is None and draw(st.booleans()):
                obj["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "lastTransitionTime": ts(seconds),
                    }
                ]
                obj["spec"]["priority"] = 100
        elif choice == "node":
            obj = gen.node(draw(st.sampled_from(("n1", "n2"))), draw(st.sampled_from((1, 2, 4))), 8, 110)
        elif choice == "pdb":
            obj = _pdb(draw(st.sampled_from(("p1", "p2"))), draw(st.integers(0, 1)))
        else:
            obj = gen.tolerant_class()
        obj["metadata"]["resourceVersion"] = str(rv)
        etype = draw(st.sampled_from(("ADDED", "MODIFIED", "MODIFIED", "DELETED")))
        events.append({"ts": ts(seconds), "type": etype, "object": obj})
    events.append({"ts": ts(seconds + 1), "type": "TICK"})
    return events


def garbage(ts: str) -> list[Any]:
    pod = gen.pod("g", node=None, priority=0, cpu_m=100)
    pod["metadata"]["resourceVersion"] = "999999"
    containers_string = copy.deepcopy(pod)
    containers_string["spec"]["containers"] = "abc"  # AttributeError inside the engine
    no_name = copy.deepcopy(pod)
    del no_name["metadata"]["name"]
    bad_priority = copy.deepcopy(pod)
    bad_priority["spec"]["priority"] = "high"
    bad_cpu = gen.node("n9", 1, 1, 1)
    bad_cpu["status"]["allocatable"]["cpu"] = "lots"
    unknown_kind = {"kind": "Gadget", "metadata": {"name": "x", "uid": "x"}}
    # Names the API server never stores (schemas/names.py): a path segment, a forged log line.
    dot_dot = copy.deepcopy(pod)
    dot_dot["metadata"]["name"] = ".."
    newline = gen.node("n8\nforged", 1, 1, 1)
    upper_namespace = copy.deepcopy(pod)
    upper_namespace["metadata"]["namespace"] = "Kube-System"
    return [
        ["not", "an", "event"],
        7,
        {"ts": ts, "type": "EXPLODED"},
        {"type": "TICK"},
        {"ts": "yesterday", "type": "TICK"},
        {"ts": ts, "type": "ADDED", "object": "pod"},
        {"ts": ts, "type": "ADDED", "object": containers_string},
        {"ts": ts, "type": "MODIFIED", "object": no_name},
        {"ts": ts, "type": "ADDED", "object": bad_priority},
        {"ts": ts, "type": "ADDED", "object": bad_cpu},
        {"ts": ts, "type": "DELETED", "object": unknown_kind},
        {"ts": "yesterday", "type": "ADDED", "object": gen.node("n7", 1, 1, 1)},
        {"ts": ts, "type": "ADDED", "object": dot_dot},
        {"ts": ts, "type": "ADDED", "object": newline},
        {"ts": ts, "type": "MODIFIED", "object": upper_namespace},
    ]


@st.composite
def mixed_logs(draw: st.DrawFn) -> tuple[list[Any], set[int]]:
    """A good log with garbage inserted; the positions of the garbage."""
    good = draw(good_logs())
    mixed: list[Any] = []
    bad: set[int] = set()
    for event in good:
        while draw(st.integers(0, 5)) == 5:  # the simplest log has no garbage
            bad.add(len(mixed))
            mixed.append(draw(st.sampled_from(garbage(event["ts"]))))
        mixed.append(event)
    return mixed, bad
