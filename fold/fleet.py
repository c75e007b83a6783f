"""One controller per cluster, and a log folded offline through them, no broker.

`fold` replays a log exactly as recorded (the audit path of `preemptctl replay`);
`Fleet` is the per-cluster controller map it shares with the simulated cluster
(`streams.sim.simulator.simulate`) and `preemptctl run`. An event the worker
would dead-letter is rejected here the same way (BadEvent, the controller
unchanged), so every path folds the same inputs to the same decisions.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.config import Config
from fold.controller import BadEvent, Controller, Ready
from schemas import chain, records
from schemas.records import DecisionRecord

# The cyclic garbage collector's first-generation threshold for folding processes.
# The index holds hundreds of thousands of long-lived, acyclic objects; at the
# default (700) every few records of parsed JSON trigger collections that walk
# them, which cost a third of the worker's time on a 30k-event log. 50,000 keeps
# collections rare; cycles (rare here) are still collected.
GC_GEN0_THRESHOLD = 50_000


@dataclass(slots=True)
class Result:
    decisions: list[DecisionRecord] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)  # the full event log (simulate only)
    events: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)  # (event number, reason)


class Fleet:
    """One controller per cluster named in the log."""

    def __init__(
        self, config: Config, key: bytes | None = None, *, install: str | None = chain.DEFAULT_INSTALL
    ) -> None:
        self.config = config
        self.key = key
        # The install the key's signatures bind (the worker's --install-id, default its topic
        # prefix): the same as the worker's, for the same bytes. None: legacy unbound HMAC.
        self.install = install
        self.controllers: dict[str, Controller] = {}

    def step(self, event: Mapping[str, Any]) -> Ready:
        """Fold one event into its cluster's controller (Controller.step); BadEvent (nothing
        changed) if it cannot be.

        An event without `cluster` is the default cluster's (a one-cluster trace); one that names
        a cluster must name a valid one (records.cluster_problem), as a record's key must in the
        worker: an empty name once gave other decision ids here than in the worker.
        """
        if not isinstance(event, Mapping):
            raise BadEvent("event is not an object")
        name = event.get("cluster", records.DEFAULT_CLUSTER)
        problem = records.cluster_problem(name)
        if problem:
            raise BadEvent(problem)
        ctl = self.controllers.get(name)
        if ctl is None:
            ctl = self.controllers[name] = Controller(name, self.config, self.key, install=self.install)
        return ctl.step(event)


def fold(
    events: Iterable[Mapping[str, Any]],
    config: Config,
    *,
    key: bytes | None = None,
    progress: Callable[[int], None] | None = None,
    install: str | None = chain.DEFAULT_INSTALL,
) -> Result:
    fleet = Fleet(config, key, install=install)
    result = Result()
    for n, event in enumerate(events):
        try:
            result.decisions.extend(fleet.step(event).records)
        except BadEvent as exc:
            result.bad.append((n, str(exc)))
        result.events += 1
        if progress is not None and n % 10_000 == 0:
            progress(n)
    return result


def tune_gc() -> None:
    """Collect rarely: see GC_GEN0_THRESHOLD."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)
