"""Folding is atomic per event: a rejected event leaves the controller exactly as before it.

Random logs (pods, nodes, PDBs and PriorityClasses coming and going, pods asking
for preemption, TICKs and RESYNCs, time moving on) get random garbage events
mixed in: shapes the worker cannot read, malformed objects that pass the shape
check (a Pod whose spec.containers is a string raises AttributeError inside the
engine), unknown kinds, bad quantities and times. Folding the mixed log must
reject exactly the garbage and end in the same state, with the same decisions,
as a reference fold of only the good events; a failure injected into deciding
must be undone the same way. `replay` (fold) and the simulator treat these
inputs alike.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import flows
from engine.config import Config
from engine.decision import Decision
from fold import fleet
from fold.controller import BadEvent, Controller
from schemas import chain
from streams.sim import simulator, traces
from tests.support.mixed_logs import garbage, good_logs, mixed_logs, ts

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def observed(ctl: Controller, dirty: dict[str, bytes | None]) -> dict[str, Any]:
    """Everything a later decision or the store could read, in a comparable form; `dirty`: what
    the controller's Readies told the store to write (gathered as the worker does)."""
    c = ctl.cluster
    return {
        "state": orjson.dumps(ctl.state()),  # bytes: dict order is part of the persisted state
        "dirty": dirty,  # the encoded objects the store would write
        "pods": dict(c.pods),
        "nodes": {n: (s.node, dict(s.pods), dict(s.used)) for n, s in c.nodes.items()},
        "nominated": {n: dict(c.nominated_on(n)) for n in ("n1", "n2", "n7", "n9")},
        "classes": dict(c.priority_classes),
        "policies": {n: c.policy(n) for n in c.priority_classes},
        "pdbs": dict(c.pdbs),
        # The derived indexes a rollback must put back too (PDB membership, quota usage, owners).
        "pdb_members": {uid: [p.uid for p in c.budgets.of(uid)] for uid in c.pods},
        "usage": {k: (dict(v[0]), v[1]) for k, v in c.usage.items() if v[1]},
        "owned": {uid for uid in c.pods if c.owns(uid)},
        "quotas": dict(c.quotas),
        "tombstones": list(c.tombstones.items()),
        "warnings": dict(c.warnings),
        "earliest": ctl._earliest,
    }


def fold_all(
    ctl: Controller, events: list[Any], dirty: dict[str, bytes | None] | None = None
) -> tuple[list[Any], set[int]]:
    """The decisions and the rejected events' indexes; each Ready's store keys into `dirty`."""
    decisions: list[Any] = []
    rejected: set[int] = set()
    for i, e in enumerate(events):
        try:
            ready = ctl.step(e)
        except BadEvent:
            rejected.add(i)
            continue
        decisions.extend(ready.records)
        if dirty is not None:
            dirty.update(ready.dirty)
    return decisions, rejected


@SETTINGS
@given(mixed_logs())
def test_garbage_is_rejected_and_leaves_no_trace(case: tuple[list[Any], set[int]]) -> None:
    mixed, bad = case
    ctl, got_dirty = Controller("c", Config()), {}
    got, rejected = fold_all(ctl, mixed, got_dirty)
    assert rejected == bad
    reference, want_dirty = Controller("c", Config()), {}
    want, none = fold_all(reference, [e for i, e in enumerate(mixed) if i not in bad], want_dirty)
    assert not none
    assert got == want
    assert observed(ctl, got_dirty) == observed(reference, want_dirty)
    # ... and they decide on identically.
    tail = [{"ts": ts(10_000), "type": "TICK"}]
    assert fold_all(ctl, tail) == fold_all(reference, tail)


@st.composite
def failing_decisions(draw: st.DrawFn) -> tuple[list[dict[str, Any]], set[int]]:
    events = draw(good_logs())
    return events, set(draw(st.sets(st.integers(0, len(events) - 1), max_size=6)))


@SETTINGS
@given(failing_decisions())
def test_a_failure_while_deciding_is_rolled_back(case: tuple[list[dict[str, Any]], set[int]]) -> None:
    """The engine raising mid-decision (after the event's object is applied, overlays and all)."""
    events, poisoned = case
    now: list[int] = [-1]

    def decide(*args: Any, **kwargs: Any) -> Decision:
        if now[0] in poisoned:
            flows.decide(*args, **kwargs)  # the index does its work first, then the failure
            raise RuntimeError("engine bug")
        return flows.decide(*args, **kwargs)

    ctl = Controller("c", Config(), decide=decide)
    got: list[Any] = []
    got_dirty: dict[str, bytes | None] = {}
    rejected: set[int] = set()
    for i, e in enumerate(events):
        now[0] = i
        try:
            ready = ctl.step(e)
        except BadEvent as exc:
            assert exc.error_class == "RuntimeError"
            rejected.add(i)
            continue
        got.extend(ready.records)
        got_dirty.update(ready.dirty)
    assert rejected <= poisoned
    reference, want_dirty = Controller("c", Config()), {}
    want, _ = fold_all(reference, [e for i, e in enumerate(events) if i not in rejected], want_dirty)
    assert got == want
    assert observed(ctl, got_dirty) == observed(reference, want_dirty)
    tail = [{"ts": ts(10_000), "type": "TICK"}]
    now[0] = -1
    assert fold_all(ctl, tail) == fold_all(reference, tail)


def _containers_string_log() -> tuple[list[dict[str, Any]], int]:
    log = simulator.simulate(traces.example(), Config()).log
    bad = copy.deepcopy(next(e for e in log if e.get("object", {}).get("kind") == "Pod"))
    bad["object"]["spec"]["containers"] = "abc"
    bad["object"]["metadata"]["resourceVersion"] = "999999"
    at = len(log) // 2
    return [*log[:at], bad, *log[at:]], at


def test_replay_skips_the_event_the_worker_dead_letters() -> None:
    """Issue 12: a Pod whose spec.containers is a string crashed replay with AttributeError;
    it is now refused where it is parsed, with its reason (InvalidObject)."""
    log, at = _containers_string_log()
    result = fleet.fold(log, Config())
    assert [n for n, _ in result.bad] == [at]
    assert "InvalidObject" in result.bad[0][1] and "containers must be a list" in result.bad[0][1]
    assert result.decisions == fleet.fold(log[:at] + log[at + 1 :], Config()).decisions
    assert len(result.decisions) == 8


def test_the_simulator_treats_it_the_same() -> None:
    trace = traces.example()
    bad = copy.deepcopy(next(e for e in trace if e.get("object", {}).get("kind") == "Pod"))
    bad["object"]["spec"]["containers"] = "abc"
    bad["object"]["metadata"]["uid"] = "other-uid"
    bad["object"]["metadata"]["name"] = "other"
    bad_ts = dict(trace[3], ts="not a time")
    mixed = [*trace[:3], bad, bad_ts, *trace[3:]]
    result = simulator.simulate(mixed, Config())
    assert len(result.bad) == 2
    assert result.decisions == simulator.simulate(trace, Config()).decisions
    # And replaying the simulated log (garbage included) gives the same decisions again.
    assert fleet.fold(result.log, Config()).decisions == result.decisions


def test_a_decision_too_large_loses_its_explanation_not_its_victims() -> None:
    log = simulator.simulate(traces.example(), Config()).log
    full = fleet.fold(log, Config()).decisions
    small = Controller("default", Config(), max_record_bytes=1500)
    got = [d for e in log for d in small.step(e).records]
    assert [d["id"] for d in got] == [d["id"] for d in full]
    for want, have in zip(full, got, strict=True):
        assert have["victims"] == want["victims"] and have["outcome"] == want["outcome"]
        if len(orjson.dumps(want)) > 1500:
            assert have["explanation"]["truncated"] is True
            assert have["explanation"]["bytes"] == len(orjson.dumps(want["explanation"]))
        assert len(orjson.dumps(have)) <= 1500
    prev = chain.GENESIS  # still one intact hash chain
    for d in got:
        assert d["prevHash"] == prev and chain.digest(prev, d) == d["hash"]
        prev = d["hash"]


def test_a_decision_too_large_even_without_explanation_is_rejected() -> None:
    log = simulator.simulate(traces.example(), Config()).log
    tiny = Controller("default", Config(), max_record_bytes=300)
    rejected = []
    for e in log:
        try:
            assert tiny.step(e).decisions == []
        except BadEvent as exc:
            rejected.append(exc.error_class)
    assert rejected and set(rejected) == {"DecisionTooLarge"}
    assert tiny.decisions == 0 and tiny.seq == len(log) - len(rejected)


@pytest.mark.parametrize("event", garbage("2026-01-01T00:00:00Z")[:5])
def test_fleet_rejects_what_is_not_an_event(event: Any) -> None:
    with pytest.raises(BadEvent):
        fleet.Fleet(Config()).step(event)
