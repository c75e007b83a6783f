"""The controller's folded state against a naive reference fold (STYLE: a reference model per stateful part).

Random logs of pod and node events, with re-delivered and out-of-order stale
copies mixed in, are folded by the controller; the naive model keeps, per
object, the event with the highest resourceVersion and drops the object when
that event is a DELETED. Both must hold the same objects. The controller's
persisted state, restored into a new controller, must hold them too and decide
the same afterwards.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import Config
from fold.controller import Controller
from tests.support import gen

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TS = "2026-01-01T00:00:00Z"


@st.composite
def logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for rv in range(1, draw(st.integers(1, 40)) + 1):
        kind = draw(st.sampled_from(("pod", "pod", "pod", "node")))
        name = draw(st.sampled_from(("a", "b", "c")))
        if kind == "pod":
            obj = gen.pod(
                name,
                node=draw(st.sampled_from((None, "n1", "n2"))),
                priority=draw(st.sampled_from((0, 5))),
                cpu_m=draw(st.sampled_from((500, 1000))),
            )
            if obj["spec"].get("nodeName") is None and draw(st.booleans()):
                # kube-scheduler found no room: this asks the controller for a decision
                obj["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "lastTransitionTime": TS,
                    }
                ]
                obj["spec"]["priority"] = 100
        else:
            obj = gen.node(f"n{1 + (ord(name) % 2)}", draw(st.sampled_from((2, 4))), 8, 110)
        obj["metadata"]["resourceVersion"] = str(rv)
        etype = draw(st.sampled_from(("ADDED", "MODIFIED", "MODIFIED", "DELETED")))
        events.append({"ts": TS, "type": etype, "object": obj})
        if events and draw(st.integers(0, 4)) == 0:
            events.append(dict(draw(st.sampled_from(events))))  # a stale or duplicate re-delivery
    return events


def _naive(events: list[dict[str, Any]]) -> dict[str, str]:
    """(kind/key) -> resourceVersion of the live objects, by highest resourceVersion per object."""
    latest: dict[str, tuple[int, str]] = {}
    for e in events:
        o = e["object"]
        key = f"{o['kind']}/{o['metadata']['uid'] if o['kind'] == 'Pod' else o['metadata']['name']}"
        rv = int(o["metadata"]["resourceVersion"])
        if key not in latest or rv > latest[key][0]:
            latest[key] = (rv, e["type"])
    return {k: str(rv) for k, (rv, t) in latest.items() if t != "DELETED"}


def _held(ctl: Controller) -> dict[str, str]:
    c = ctl.cluster
    out = {f"Pod/{u}": p.resource_version for u, p in c.pods.items()}
    out.update({f"Node/{n}": s.node.resource_version for n, s in c.nodes.items()})
    return out


@SETTINGS
@given(logs())
def test_fold_matches_naive_model_under_redelivery(events: list[dict[str, Any]]) -> None:
    ctl = Controller("c", Config())
    for e in events:
        ctl.step(e)
    assert _held(ctl) == _naive(events)


@SETTINGS
@given(logs(), logs())
def test_restored_state_folds_on_identically(first: list[dict[str, Any]], rest: list[dict[str, Any]]) -> None:
    live = Controller("c", Config())
    dirty: dict[str, bytes | None] = {}  # every Ready's store keys, as the worker gathers them
    for e in first:
        dirty.update(live.step(e).dirty)
    objects: dict[str, Any] = {}
    for key, obj in dirty.items():
        if obj is None:
            objects.pop(key, None)
        else:
            objects[key] = orjson.loads(obj)
    restored = Controller.restore(
        config=Config(), key=None, state=live.state(), objects_raw=list(objects.values())
    )
    assert _held(restored) == _held(live)
    # Warmed at restore (Controller.warm): every node's summary is there before any
    # decision, and the decisions below are those of the live controller all the same.
    assert len(restored.index.summaries) == len(restored.cluster.nodes)
    waiting = [u for u in restored.waiting if restored.cluster.pods[u].node is None]
    assert bool(restored.index._rankings) == bool(waiting)
    offset = 10_000  # later events must carry newer versions than the first part's
    for e in rest:
        e = {
            **e,
            "object": {
                **e["object"],
                "metadata": {
                    **e["object"]["metadata"],
                    "resourceVersion": str(offset + int(e["object"]["metadata"]["resourceVersion"])),
                },
            },
        }
        got, want = restored.step(e).records, live.step(e).records
        assert got == want
    assert _held(restored) == _held(live)
    assert restored.prev_hash == live.prev_hash
