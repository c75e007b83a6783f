"""The controller's shortcuts on the fold's hot path give exactly what the plain code gave
(issue 31 #4: the worker's fold). Speed is measured in docs/performance.md, never asserted."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import objects
from engine.config import Config
from streams.pipeline import controller
from streams.pipeline.controller import Controller, Retry
from tests import gen


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gen.clusters(), st.sampled_from(["9", "10"]), st.dictionaries(st.sampled_from("ab"), st.just("x")))
def test_differs_is_replace_then_compare(
    raw: dict[str, Any], version: str, annotations: dict[str, str]
) -> None:
    records = [objects.normalize(o) for o in raw["objects"]]
    variants = []
    for r in records:
        variants.append(r)
        variants.append(dataclasses.replace(r, resource_version=version))
        if isinstance(r, objects.Pod):
            variants.append(dataclasses.replace(r, annotations=annotations))
            variants.append(
                dataclasses.replace(r, node=None, annotations=annotations, resource_version=version)
            )
    for before, after in itertools.product(variants[:12], repeat=2):
        for skip in (controller._VERSION, controller._VERSION_AND_ANNOTATIONS):
            if type(before) is not type(after):
                want = True
            elif skip is controller._VERSION_AND_ANNOTATIONS and not isinstance(before, objects.Pod):
                continue
            else:
                want = dataclasses.replace(before, **{f: getattr(after, f) for f in skip}) != after
            assert controller._differs(before, after, skip) == want


def test_the_state_writes_each_retry_as_astuple_would() -> None:
    r = Retry(3, 10, 2, 7, 9)
    ctl = Controller("c", Config())
    ctl.retry["u"] = r
    assert ctl.state()["retry"] == {"u": dataclasses.astuple(r)}
