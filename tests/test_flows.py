"""The flows as one protocol (engine.flows): the registry, its precedence, and adding a flow.

- the schema's `flow` enum is the registry's names, in order;
- precedence is as it always was: a lone DaemonSet pod, then a gang or a quota pod, then the rest;
- every explanation a flow writes is described by its TypedDict (no key it does not name, none
  it requires missing, values of the types it says);
- a fourth flow, registered for one test, decides, is explained through the protocol and is
  listed by the benchmark, with nothing else touched: its module here and the registry;
  and it is gone when the block ends (nor was it ever seen by another thread).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import threading
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict

import orjson
import pytest
import yaml

from engine import case as case_mod
from engine import cluster as cluster_mod
from engine import decision as decision_mod
from engine import flows, objects, timeutil
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import Decision
from engine.flowbase import Told
from engine.objects import Pod
from engine.victims import to_victims
from fold import fleet as fold
from schemas import records
from streams.audit import explain
from streams.bench import engine as bench_engine
from streams.cli import main
from streams.common.errors import UsageError
from streams.sim import mixed, traces
from tests.support import audit_traces, gen
from tests.support.flowgen import ds_pod, jpod, quota

SCHEMA = Path(records.__file__).parent / "decisions.schema.json"


def test_the_schema_flow_enum_is_the_registry() -> None:
    enum = json.loads(SCHEMA.read_text())["properties"]["flow"]["enum"]
    assert flows.names() == tuple(f.name for f in flows.BUILTIN)
    # The same names (the schema lists them in its own order; the registry's is precedence).
    assert len(enum) == len(set(enum)) and set(enum) == set(flows.names())


def test_precedence_is_daemonset_then_job_then_default() -> None:
    c = cluster_mod.build(
        [
            objects.normalize(o)
            for o in (gen.node("n1", 4, 8, 110), quota("q", "team-a", min_cpu=1, max_cpu=2))
        ]
    )
    lone_ds = objects.pod(ds_pod("agent-n1", required="n1"))
    ds_in_quota = dataclasses.replace(lone_ds, namespace="team-a")  # charged to q, still a DaemonSet pod
    quota_pod = objects.pod(jpod("q-pod"))
    gang = [objects.pod(jpod(f"g-{i}", namespace="other", group="g")) for i in range(2)]
    plain = objects.pod(jpod("plain", namespace="other"))
    assert flows.select_flow(c, [lone_ds]) == "daemonset"
    assert flows.select_flow(c, [ds_in_quota]) == "daemonset"
    assert flows.select_flow(c, [quota_pod]) == "job"
    assert flows.select_flow(c, [lone_ds, plain]) == "job"  # several pods are a gang
    assert flows.select_flow(c, gang) == "job"
    assert flows.select_flow(c, [plain]) == "default"
    assert flows.select(c, [plain]) is flows.registry()[-1]


# ---- every explanation is what its flow's TypedDict says ----------------------------------


def _problems(value: Any, tp: Any, path: str) -> list[str]:
    """Where `value` (JSON as a record holds it) is not of type `tp` (a TypedDict and what it nests)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return []
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not a {tp.__name__}"]
        hints = typing.get_type_hints(tp, include_extras=True)
        out = [f"{path}.{k}: not a key of {tp.__name__}" for k in value if k not in hints]
        for k, hint in hints.items():
            wrapper = typing.get_origin(hint)
            required = wrapper is typing.Required or (tp.__total__ and wrapper is not typing.NotRequired)
            if k not in value:
                if required:
                    out.append(f"{path}.{k}: required by {tp.__name__}, missing")
                continue
            inner = typing.get_args(hint)[0] if wrapper in (typing.Required, typing.NotRequired) else hint
            out += _problems(value[k], inner, f"{path}.{k}")
        return out
    if origin in (typing.Union, types.UnionType):
        arms = [_problems(value, arm, path) for arm in args]
        return [] if any(not a for a in arms) else arms[0]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {value!r} is not a list"]
        return [p for i, item in enumerate(value) for p in _problems(item, args[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not an object"]
        return [p for k, v in value.items() for p in _problems(v, args[1], f"{path}.{k}")]
    if origin is Literal:
        return [] if value in args else [f"{path}: {value!r} not in {args}"]
    if tp is type(None):
        return [] if value is None else [f"{path}: {value!r} is not null"]
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    return [] if ok else [f"{path}: {value!r} is not {tp.__name__}"]


def _mixed_trace(seed: int, interpod: float, count: int) -> list[dict[str, Any]]:
    """A generated cluster and `count` preemptors of every flow in turn (default, gang, DaemonSet)."""
    g = mixed.MixedCluster(24, seed=seed, interpod=interpod)
    t0 = timeutil.parse("2026-01-01T00:00:00Z")
    events = [{"type": "ADDED", "ts": timeutil.render(t0), "cluster": "c", "object": o} for o in g.objects()]
    shapes = g.preemptor_shapes(12)
    for k in range(count):
        at = 60.0 + k
        ts = timeutil.render(t0 + int(at * timeutil.SECOND))
        if k % 3 == 0:
            raws = [g.default_preemptor(k, shapes[g.rng.randrange(len(shapes))], at=at)]
        elif k % 3 == 1:
            raws = g.gang(k, size=3, at=at)
        else:
            raws = [g.daemonset_pod(k, at=at)]
        events += [{"type": "ADDED", "ts": ts, "cluster": "c", "object": r} for r in raws]
    return events


@pytest.fixture(scope="module")
def decisions() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    stories = [
        traces.example(),
        audit_traces.reprieve(),
        audit_traces.gang(),
        audit_traces.daemonset(),
        audit_traces.ticks(),
        _mixed_trace(1, 0.0, 24),
        _mixed_trace(2, 0.3, 24),
    ]
    for story in stories:
        for mode in ("kubernetes", "minimal"):
            out += audit_traces.decisions(story, Config(victim_selection=mode))
    return out


def test_every_explanation_is_what_its_flows_typeddict_says(decisions: list[dict[str, Any]]) -> None:
    seen: dict[str, set[str]] = {}
    for d in decisions:
        flow = flows.named(d["flow"])
        assert flow is not None, d["flow"]
        assert d["explanation"]["flow"] == flow.name
        assert _problems(d["explanation"], flow.explanation, f"{d['id']}.explanation") == []
        seen.setdefault(flow.name, set()).add(d["outcome"])
    # The stories reach every flow, and each flow's preemptions and non-preemptions.
    assert set(seen) == set(flows.names())
    assert all("preempt" in outcomes and len(outcomes) > 1 for outcomes in seen.values()), seen


CASES = sorted((Path(__file__).resolve().parent / "conformance" / "cases").rglob("*.yaml"))


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_conformance_cases_explanation_is_what_its_flows_typeddict_says(path: Path) -> None:
    """The edge cases too: not modelled, inter-pod filters, quotas, toleration, departures."""
    d = case_mod.answer(case_mod.load(yaml.safe_load(path.read_text()), where=str(path)))
    flow = flows.named(d.flow)
    assert flow is not None and d.explanation["flow"] == d.flow
    assert _problems(orjson.loads(orjson.dumps(d.explanation)), flow.explanation, "explanation") == []


def test_the_checker_catches_a_key_no_typeddict_names(decisions: list[dict[str, Any]]) -> None:
    d = next(d for d in decisions if d["flow"] == "job" and d["outcome"] == "preempt")
    flow = flows.named("job")
    assert flow is not None
    stray = dict(d["explanation"], surprise=1)
    assert _problems(stray, flow.explanation, "x") == ["x.surprise: not a key of Explanation"]
    del stray["members"], stray["surprise"]
    assert _problems(stray, flow.explanation, "x") == ["x.members: required by Explanation, missing"]


# ---- a fourth flow, for this test only ---------------------------------------------------

TOY = "toy.example/evict-all-below-on"  # the label: the node where everything below it goes


class ToyExplanation(TypedDict):
    flow: str
    node: str
    below: list[str]


class ToyFlow:
    """Takes a pod labelled with a node: evicts every lower-priority pod there, whatever fits."""

    name = "toy"
    explanation = ToyExplanation

    def applies(self, cluster: Cluster, pods: Sequence[Pod]) -> bool:
        return len(pods) == 1 and TOY in pods[0].labels

    def decide(
        self, cluster: Cluster, pods: Sequence[Pod], *, now: int, config: Config, index: object
    ) -> Decision:
        pod = pods[0]
        node = pod.labels[TOY]
        priority = cluster.priority(pod)
        below = sorted(
            (p for p in cluster.nodes[node].pods.values() if cluster.priority(p) < priority),
            key=lambda p: p.key,
        )
        explanation: dict[str, Any] = {"flow": self.name, "node": node, "below": [p.key for p in below]}
        make = decision_mod.maker(self.name, pod.key, pod.uid, explanation)
        if not below:
            return make(decision_mod.FITS, f"nothing below it on {node}", node=node)
        victims = to_victims(below, cluster, action=config.victim_action)
        return make(
            decision_mod.PREEMPT, f"toy: evict {len(below)} pod(s) on {node}", node=node, victims=victims
        )

    def reference(
        self, cluster: Cluster, pods: Sequence[Pod], now: int, config: Config
    ) -> dict[str, Any] | None:
        return None

    def places(self, pod: str, d: Mapping[str, Any]) -> bool:
        return False

    def explain_preemptor(self, pod: str, d: Mapping[str, Any]) -> Told:
        node = d["explanation"]["node"]
        return Told(
            [f"toy flow: everything below it on {node} goes"], {"node": d.get("node")}, f"toy on {node}"
        )

    def explain_victim(self, pod: str, d: Mapping[str, Any], victim: Mapping[str, Any]) -> Told:
        return Told(["below the toy preemptor on its node"], {"preemptorPriority": None})

    def explain_survivor(self, pod: str, d: Mapping[str, Any]) -> Told | None:
        return None

    def unnamed_spared(self, d: Mapping[str, Any]) -> str | None:
        return None


def _toy_story() -> list[dict[str, Any]]:
    objs = [
        gen.node("n1", 4, 8, 110),
        gen.pod("low-a", node="n1", priority=10, cpu_m=100),
        gen.pod("low-b", node="n1", priority=20, cpu_m=100),
        gen.pod("high", node="n1", priority=5000, cpu_m=100),
    ]
    toy = gen.pod("toy", node=None, priority=1000, cpu_m=100, labels={TOY: "n1"})
    return audit_traces.trace(objs, [toy])


def _explain_cli(pod: str, path: Path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main.main(["explain", pod, "--decisions", str(path)])
    return out.getvalue()


def _bench_engine_parser() -> argparse.ArgumentParser:
    sub = argparse.ArgumentParser().add_subparsers()
    bench_engine.register(sub)
    return sub.choices["engine"]


def test_a_fourth_flow_is_its_module_and_one_registration(tmp_path: Path) -> None:
    builtin = flows.names()
    with flows.registered(ToyFlow()) as toy:
        assert flows.names() == ("daemonset", "job", "toy", "default")  # before the catch-all
        # It decides: the worker's fold takes the labelled pod to the toy flow.
        (record,) = fold.fold(_toy_story(), Config()).decisions
        d: dict[str, Any] = dict(record)
        assert (d["flow"], d["outcome"], d["node"]) == ("toy", "preempt", "n1")
        assert [v["name"] for v in d["victims"]] == ["low-a", "low-b"]
        assert _problems(d["explanation"], toy.explanation, "toy") == []
        # The explainer explains it through the protocol, adding what every flow shares.
        (pre,) = explain.explain("default/toy", [d]).findings
        assert (pre.role, pre.summary, pre.facts["outcome"], pre.facts["node"]) == (
            "preemptor",
            "toy on n1",
            "preempt",
            "n1",
        )
        (victim,) = explain.explain("default/low-a", [d]).findings
        assert victim.role == "victim" and victim.details == [
            "below the toy preemptor on its node",
            "evicted with it: default/low-b",
        ]
        assert explain.explain("default/high", [d]).findings == []
        path = tmp_path / "decisions.jsonl"
        path.write_bytes(orjson.dumps(d) + b"\n")
        assert "toy flow: everything below it on n1 goes" in _explain_cli("default/toy", path)
        # The benchmark lists it (its mixed workload has no toy preemptors to make: it says so).
        bench = _bench_engine_parser()
        assert "--flow {daemonset,job,toy,default}" in bench.format_usage()
        assert bench.parse_args(["--workload", "mixed", "--flow", "toy"]).flow == "toy"
        with pytest.raises(UsageError, match="no mixed workload makes 'toy' preemptors"):
            bench_engine.run_mixed(
                4, 1, flow="toy", churn=False, shape="basic", mode="kubernetes", seed=1, reference_decisions=0
            )
        # Another thread never saw it: the registration is this context's alone.
        other: list[tuple[str, ...]] = []
        thread = threading.Thread(target=lambda: other.append(flows.names()))
        thread.start()
        thread.join()
        assert other == [builtin]
    # Gone with the block: the same pod is the default flow's again.
    assert flows.names() == builtin
    assert "--flow {daemonset,job,default}" in _bench_engine_parser().format_usage()
    (d,) = [dict(r) for r in fold.fold(_toy_story(), Config()).decisions]
    assert d["flow"] == "default"


def test_registration_is_checked_and_undone_on_error() -> None:
    builtin = flows.names()
    twice = (flows.registered(ToyFlow()), flows.registered(ToyFlow()))
    with pytest.raises(ValueError, match="already registered"), twice[0], twice[1]:
        pass
    with pytest.raises(ValueError, match="no flow named 'nope'"), flows.registered(ToyFlow(), before="nope"):
        pass
    with pytest.raises(RuntimeError), flows.registered(ToyFlow(), before="daemonset"):
        assert flows.names() == ("toy", *builtin)
        raise RuntimeError("inside")
    assert flows.names() == builtin
