"""The source's projection (engine.projection): every decision the same, nothing else kept.

Properties over generated clusters of every flow, each object dressed as a real
API server holds it (streams.sim.apiserver) with a secret-looking value in every
field a decision does not read: the projection normalises to the same engine
records and leads to the same decisions, and holds the secret nowhere. A second
property injects fields the projection has never heard of, at every level it
keeps, and finds none of them kept.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings

from engine import case as case_mod
from engine import daemonset, objects, projection, toleration
from engine.config import Config
from fold.controller import Controller
from streams.sim import apiserver
from tests.support import busy_logs, flowgen, gen
from tests.support.unknown_fields import SECRET, objects_with_unknown_fields

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DOCS = Path(__file__).resolve().parents[1] / "docs" / "topics.md"


def _as_read(record: objects.Record) -> objects.Record:
    """A normalised record as the engine reads it: of the annotations, only the keys any rule reads
    (engine.daemonset's opt-out, engine.toleration's prefixes); the rest is carried, never read."""
    annotations = getattr(record, "annotations", None)
    if annotations is None:
        return record
    kept = {
        k: v
        for k, v in annotations.items()
        if k == daemonset.ALLOW_PREEMPTION or k.startswith(toleration.PREFIXES)
    }
    return dataclasses.replace(record, annotations=kept)  # type: ignore[type-var]


def _check(raw: dict[str, Any]) -> None:
    preemptors = raw["preemptor"] if isinstance(raw["preemptor"], list) else [raw["preemptor"]]
    dressed = {**raw, "objects": [apiserver.dress(o, secret=SECRET) for o in raw["objects"]],
               "preemptor": [apiserver.dress(p, secret=SECRET) for p in preemptors]}  # fmt: skip
    projected = {**dressed, "objects": [projection.project(o) for o in dressed["objects"]],
                 "preemptor": [projection.project(p) for p in dressed["preemptor"]]}  # fmt: skip
    assert SECRET in orjson.dumps(dressed).decode()  # the dressing did put the secret in
    assert SECRET not in orjson.dumps(projected).decode()
    wholes = dressed["objects"] + dressed["preemptor"]
    for whole, kept in zip(wholes, projected["objects"] + projected["preemptor"], strict=True):
        assert objects.normalize(kept) == _as_read(objects.normalize(whole))
    answer = case_mod.answer(case_mod.load(dressed, where="dressed"))
    assert case_mod.answer(case_mod.load(projected, where="projected")) == answer


@SETTINGS
@given(gen.clusters())
def test_the_default_flow_decides_the_same_on_projections(raw: dict[str, Any]) -> None:
    _check(raw)


@SETTINGS
@given(flowgen.job_clusters())
def test_the_job_flow_decides_the_same_on_projections(raw: dict[str, Any]) -> None:
    _check(raw)


@SETTINGS
@given(flowgen.daemonset_clusters())
def test_the_daemonset_flow_decides_the_same_on_projections(raw: dict[str, Any]) -> None:
    _check(raw)


@SETTINGS
@given(busy_logs.busy_logs())
def test_the_worker_folds_projections_to_the_same_decisions(events: list[dict[str, Any]]) -> None:
    """The worker's controller (which reads a pod's scheduler from the object itself, besides the
    engine's records) decides the same on a log of projections as on one of whole objects: scope,
    outcomes, re-decisions and all."""
    whole = apiserver.dress_log(events, secret=SECRET)
    projected = [
        {**e, "object": projection.project(e["object"])} if isinstance(e.get("object"), dict) else e
        for e in whole
    ]
    assert SECRET not in orjson.dumps(projected).decode()
    want = busy_logs.fold(Controller("c", Config()), whole)
    assert busy_logs.fold(Controller("c", Config()), projected) == want


# ---- fields nobody listed ---------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects_with_unknown_fields())
def test_no_field_outside_the_list_is_kept(obj: dict[str, Any]) -> None:
    assert SECRET in orjson.dumps(obj).decode()
    assert SECRET not in orjson.dumps(projection.project(obj)).decode()
    assert objects.normalize(projection.project(obj)) == _as_read(objects.normalize(obj))


def test_the_projection_does_not_change_its_input() -> None:
    pod = apiserver.dress(gen.pod("p", node="n1", priority=10, cpu_m=100), secret=SECRET)
    before = orjson.dumps(pod)
    projection.project(pod)
    assert orjson.dumps(pod) == before


def test_docs_list_the_fields_kept() -> None:
    """docs/topics.md's list of fields per kind is the code's, in its order."""
    text = DOCS.read_text()
    for kind in projection.FIELDS:
        marker = f"<!-- projection:{kind} -->"
        assert marker in text, f"docs/topics.md has no list of the {kind} fields kept ({marker})"
        block = text.split(marker, 1)[1].split("<!-- /projection -->", 1)[0]
        listed = [line.strip()[3:-1] for line in block.splitlines() if line.strip().startswith("- `")]
        assert listed == projection.paths(kind), kind
