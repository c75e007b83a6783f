"""Priorities at and beyond int32 through the worker's fold, warm-up and restore (issue 28, item 7).

Kubernetes priorities are int32; an object outside that range is one the API
server would refuse, so the controller rejects its event (a dead letter with its
reason) and folds on. Whatever else a log holds (class values and toleration
annotations at the extremes, spec.priority at both ends of int32), the node
table's sums stay in range: deciding never raises, and a controller restored
from the folded objects warms its index and decides exactly as the live one.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import objects
from engine.config import Config
from engine.errors import InvalidObject
from fold.controller import BadEvent, Controller
from tests.support import gen

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TS = "2026-01-01T00:00:00Z"
INT32 = (-(2**31), -(2**31) + 1, -1, 0, 1, 2**31 - 2, 2**31 - 1)
BEYOND = (-(2**63), -(2**31) - 1, 2**31, 2**63, 10**30)
ANNOTATIONS = ("2147483647", "-2147483648", "2147483648", "-2147483649", "9223372036854775808", "1000")
PREFIX = "preemption-toleration.scheduling.x-k8s.io/"


@st.composite
def logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    rv = 0

    def add(obj: dict[str, Any]) -> None:
        nonlocal rv
        rv += 1
        obj["metadata"]["resourceVersion"] = str(rv)
        events.append({"ts": TS, "type": "ADDED", "object": obj})

    for i in range(draw(st.integers(1, 3))):
        add(gen.node(f"n{i}", draw(st.sampled_from((2, 4))), 8, 110))
    for k in range(draw(st.integers(0, 3))):
        add(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {
                    "name": f"c{k}",
                    "annotations": {
                        PREFIX + "minimum-preemptable-priority": draw(st.sampled_from(ANNOTATIONS)),
                        PREFIX + "toleration-seconds": draw(
                            st.sampled_from(("-1", "3600", "9223372036854775808"))
                        ),
                    },
                },
                "value": draw(st.sampled_from(INT32 + BEYOND)),
                "globalDefault": draw(st.booleans()),
            }
        )
    for j in range(draw(st.integers(1, 8))):
        node = draw(st.sampled_from((None, "n0", "n1")))
        obj = gen.pod(f"p{j}", node=node, priority=0, cpu_m=draw(st.sampled_from((500, 1000, 2000))))
        priority = draw(st.sampled_from((None, *INT32, *BEYOND)))
        if priority is None:
            del obj["spec"]["priority"]
            obj["spec"]["priorityClassName"] = f"c{draw(st.integers(0, 2))}"
        else:
            obj["spec"]["priority"] = priority
        if node is None:
            obj["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": TS,
                }
            ]
        add(obj)
    return events


def _out_of_range(obj: dict[str, Any]) -> bool:
    value = obj.get("value", obj.get("spec", {}).get("priority"))
    return isinstance(value, int) and not objects.INT32_MIN <= value <= objects.INT32_MAX


@SETTINGS
@given(logs())
def test_extreme_priorities_are_refused_or_decided_and_restore_decides_the_same(
    events: list[dict[str, Any]],
) -> None:
    live = Controller("c", Config())
    decided = []
    dirty: dict[str, bytes | None] = {}  # every Ready's store keys, as the worker gathers them
    for e in events:
        try:
            ready = live.step(e)
            decided.extend(ready.records)
            dirty.update(ready.dirty)
        except BadEvent:
            # Refused: only an object beyond int32 (or a node referring to nothing) is.
            assert _out_of_range(e["object"]), e["object"]
            with_reason = objects.normalize
            try:
                with_reason(e["object"])
            except InvalidObject as exc:
                assert "32-bit integer" in str(exc)
        else:
            assert not _out_of_range(e["object"]), e["object"]
    held: dict[str, Any] = {}
    for key, obj in dirty.items():
        if obj is None:
            held.pop(key, None)
        else:
            held[key] = orjson.loads(obj)
    restored = Controller.restore(
        config=Config(), key=None, state=live.state(), objects_raw=list(held.values())
    )
    tick = {"ts": "2026-01-01T01:00:00Z", "type": "TICK"}
    assert restored.step(tick).records == live.step(tick).records
