"""preemptctl against the real kube-scheduler v1.34.2, on the same API objects.

Each test writes one cluster to a real kube-apiserver, lets a fresh kube-scheduler
(DefaultPreemption, or scheduler-plugins v0.34.7's PreemptionToleration in its
place) decide for a pending preemptor, lets preemptctl decide on the objects as
read back, and classifies the difference (tests/parity/classify.py): the same
answer, a tie kube-scheduler breaks at random, or a documented departure;
anything else fails, saying both answers.

The clusters: PARITY_CLUSTERS generated ones (tests/parity/generate.py, seeds
PARITY_FIRST_SEED onwards; `make test` runs 30, `make parity` 300), and every
bundled conformance case of one default-flow preemptor (k8s cases under
DefaultPreemption, toleration cases under PreemptionToleration). Each departure's
own case must differ from kube-scheduler by that departure alone.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.parity import classify as classify_mod
from tests.parity import generate, upstream
from tests.parity.harness import Harness
from tests.parity.scenario import DEFAULT, TOLERATION, from_case
from tests.parity.tally import record

CASES = Path(__file__).resolve().parents[1] / "conformance" / "cases"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"
FIRST_SEED = int(os.environ.get("PARITY_FIRST_SEED", "0"))
CLUSTERS = int(os.environ.get("PARITY_CLUSTERS", "30"))
# A file to append one JSON line per comparison to (both answers, the classification), when set.
LOG = os.environ.get("PARITY_LOG")
# The departures that show only where PreemptionToleration decides (its policies, its rule).
TOLERATION_DEPARTURES = {
    "toleration-annotation-alias",
    "toleration-boundary-inclusive",
    "toleration-waits-only-for-preemptions",
}


def _check(parity: Harness, scenario_source: str, scenario: object) -> classify_mod.Classification:
    run = parity.run(scenario)  # type: ignore[arg-type]
    c = classify_mod.classify(run)
    record(scenario_source, c, run.scenario.tags)
    if LOG:
        with open(LOG, "a") as out:
            row = {
                "scenario": run.scenario.name,
                "profile": run.scenario.profile,
                "kind": c.kind,
                "departures": list(c.departures),
                "filters": list(c.filters),
                "tags": list(run.scenario.tags),
                "kube": str(run.kube),
                "preemptctl": str(run.preemptctl),
                "detail": c.detail,
            }
            out.write(json.dumps(row) + "\n")
    assert c.kind != classify_mod.UNEXPLAINED, classify_mod.explain(run, c)
    return c


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + CLUSTERS))
def test_generated_cluster(parity: Harness, seed: int) -> None:
    _check(parity, "generated clusters", generate.scenario(seed))


def _cases(folder: str) -> list[Path]:
    return sorted((CASES / folder).glob("*.yaml"))


@pytest.mark.parametrize(
    ("path", "profile"),
    [(p, DEFAULT) for p in _cases("k8s")]
    + [(p, TOLERATION) for p in _cases("toleration")]
    # The inter-pod filters' cases, but those answered "not modelled" (docs/semantics.md §10),
    # where preemptctl declines what kube-scheduler decides, and the job flow's (a gang, or
    # a pod group's member: Koordinator's rules, which kube-scheduler does not run).
    + [
        (p, DEFAULT)
        for p in _cases("interpod")
        if "not-modelled" not in p.stem and not p.stem.startswith("job-")
    ],
    ids=lambda v: v.stem if isinstance(v, Path) else v,
)
def test_bundled_case(parity: Harness, path: Path, profile: str) -> None:
    scenario = from_case(path, profile)
    assert scenario is not None, f"{path.name} is not one default-flow preemptor"
    _check(parity, "bundled cases", scenario)


@pytest.mark.parametrize("departure", sorted(upstream.DEPARTURES))
def test_each_departure_is_documented_and_shown_by_its_own_case(parity: Harness, departure: str) -> None:
    docs = DOCS.read_text()
    assert re.search(rf"`{re.escape(departure)}`", docs), f"docs/semantics.md does not list {departure}"
    case = CASES / "departures" / f"{departure}.yaml"
    assert case.exists(), f"no conformance case shows {departure}"
    scenario = from_case(case, TOLERATION if departure in TOLERATION_DEPARTURES else DEFAULT)
    assert scenario is not None
    c = _check(parity, "departure cases", scenario)
    assert (c.kind, c.departures) == (classify_mod.DOCUMENTED, (departure,)), c
