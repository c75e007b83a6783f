"""The controller's shortcuts on the fold's hot path give exactly what the plain code gave
(issue 31 #4: the worker's fold). Speed is measured in docs/performance.md, never asserted."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import objects
from engine.config import Config
from fold import controller, fleet
from fold.controller import Controller, Retry
from schemas import records
from streams.pipeline import checkpoint, recovery
from streams.pipeline import store as store_mod
from streams.sim import simulator, traces
from tests.support import gen
from tests.support.memory_pipeline import Pipeline, batches


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


def test_a_costly_store_is_written_less_often_and_nothing_is_published_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STORE_TIME_SHARE: decisions are published at every commit, the store only when its last
    write's cost allows; a crash in between re-folds more log and sends nothing twice."""
    monkeypatch.setattr(checkpoint, "CHECKPOINT_INTERVAL_S", 0.0)  # a commit per record
    writes: list[int] = []
    real = store_mod.Store.write

    def costly(self: store_mod.Store, dirty: Any, state: Any) -> None:
        time.sleep(0.02)
        writes.append(int(state["position"]))
        real(self, dirty, state)

    monkeypatch.setattr(store_mod.Store, "write", costly)
    log = simulator.simulate(traces.basic(40), Config()).log
    want = [dict(d) for d in fleet.fold(log, Config()).decisions]
    recs = batches(log, per_record=5)
    p = Pipeline(tmp_path)
    p.produce(recs)

    async def crash() -> None:
        w = await recovery.open(partition=0, setup=p.setup)
        for m in p.broker.messages(records.CLUSTER_EVENTS, 0):
            await w.process(m.offset, m.key, m.value, m.headers)
        await w.close(commit=False)  # killed: nothing after its last commit counts

    asyncio.run(crash())
    assert len(writes) < len(recs) // 4
    assert p.decisions() == want  # every commit published, though the store lags
    with store_mod.Store(tmp_path / "cluster-events-0") as kept:
        state = kept.state()
        assert state is not None and state["position"] < len(recs) - 1
    asyncio.run(p.run())  # reopened from the lagging store: the rest folded again
    assert p.decisions() == want  # nothing sent twice
