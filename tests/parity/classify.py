"""Every difference between kube-scheduler and preemptctl is a tie, a documented departure, or a failure.

`classify(run)` first holds the model (tests/parity/upstream.py) to both
deciders on this very cluster: with no departure switched on it must admit
kube-scheduler's answer, with all of them on it must give preemptctl's. Then:

- same: both gave the same answer (where a pod fits is not compared);
- tie: preemptctl's answer is one kube-scheduler may pick too (it breaks the
  last tie between nodes, and between equally important victims, at random);
- documented: the smallest set of departures that, switched on, turns the
  model's kube-scheduler into preemptctl's answer; each is listed in
  docs/semantics.md with its reason and its own conformance case;
- unexplained: anything else, or a model that disagrees with either decider.

Each classification also names the filters that decide the cluster upstream
(NodePorts, InterPodAffinity, PodTopologySpread): those whose removal from the
model of kube-scheduler changes its answer, for the counts per filter.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tests.parity import upstream
from tests.parity.harness import SCHEDULER_NAMES, Run

SAME, TIE, DOCUMENTED, UNEXPLAINED = "same", "tie", "documented", "unexplained"
# Departures tried together when no smaller set explains a difference.
MAX_COMBINATION = 3


@dataclass(frozen=True)
class Classification:
    kind: str
    departures: tuple[str, ...] = ()
    detail: str = ""
    filters: tuple[str, ...] = ()  # the filters that decide kube-scheduler's answer here


def model(
    run: Run, departures: frozenset[str], filters: frozenset[str] = upstream.FILTERS
) -> upstream.Answer:
    return upstream.decide(
        run.objects,
        run.preemptor,
        profile=run.scenario.profile,
        schedulers=SCHEDULER_NAMES,
        now=run.now,
        departures=departures,
        filters=filters,
    )


def deciding_filters(run: Run, as_kube: upstream.Answer) -> tuple[str, ...]:
    """The filters without which the model of kube-scheduler answers otherwise."""
    return tuple(
        f
        for f in sorted(upstream.FILTERS)
        if model(run, upstream.UPSTREAM, upstream.FILTERS - {f}) != as_kube
    )


def classify(run: Run) -> Classification:
    kube, ours = run.kube, run.preemptctl
    try:
        as_kube = model(run, upstream.UPSTREAM)
        as_ours = model(run, upstream.ALL)
        filters = deciding_filters(run, as_kube)
    except upstream.TooTied as exc:
        return Classification(UNEXPLAINED, detail=f"too many ties to judge: {exc}")
    problems = []
    if not as_kube.admits(kube.outcome, kube.node, kube.victims):
        problems.append(f"the model of kube-scheduler says {as_kube.describe()}")
    if not as_ours.admits(ours.outcome, ours.node, ours.victims):
        problems.append(f"the model of preemptctl says {as_ours.describe()}")
    if problems:
        return Classification(UNEXPLAINED, detail="; ".join(problems), filters=filters)
    if kube.same(ours):
        return Classification(SAME, filters=filters)
    if as_kube.admits(ours.outcome, ours.node, ours.victims):
        return Classification(
            TIE, detail=f"kube-scheduler may pick either: {as_kube.describe()}", filters=filters
        )
    names = sorted(upstream.DEPARTURES)
    for size in range(1, MAX_COMBINATION + 1):
        for chosen in itertools.combinations(names, size):
            if model(run, frozenset(chosen)).admits(ours.outcome, ours.node, ours.victims):
                return Classification(DOCUMENTED, chosen, filters=filters)
    return Classification(
        DOCUMENTED, tuple(names), detail="explained only by several departures together", filters=filters
    )


def explain(run: Run, c: Classification) -> str:
    """A failure message: both answers, the classification, where the scenario came from."""
    return (
        f"{run.scenario.name} ({run.scenario.origin}, profile {run.scenario.profile}): {c.kind}"
        f"{' ' + ', '.join(c.departures) if c.departures else ''}\n"
        f"  kube-scheduler: {run.kube} {run.kube.detail[:300]}\n"
        f"  preemptctl:     {run.preemptctl} {run.preemptctl.detail[:300]}\n"
        f"  {c.detail}\n"
        f"  shapes: {', '.join(run.scenario.tags) or 'plain'};"
        f" deciding filters: {', '.join(c.filters) or 'none'}"
    )
