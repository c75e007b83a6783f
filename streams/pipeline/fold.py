"""Offline folding: `preemptctl replay` of a recorded log, or of a trace through the simulator.

`fold` replays a log exactly as recorded (the audit path). `simulate` runs the
simulated cluster in-process and yields the same full log and decision log that
`preemptctl run --trace` produces through Kafka.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import Config
from schemas.records import DecisionRecord
from streams.controller import BadEvent, Controller
from streams.simulator import Simulator

DEFAULT_CLUSTER = "default"


@dataclass(slots=True)
class Result:
    decisions: list[DecisionRecord] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)  # the full event log (simulate only)
    events: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)  # (event number, reason)


class Fleet:
    """One controller per cluster named in the log."""

    def __init__(self, config: Config, key: bytes | None = None) -> None:
        self.config = config
        self.key = key
        self.controllers: dict[str, Controller] = {}

    def handle(self, event: Mapping[str, Any]) -> list[DecisionRecord]:
        name = str(event.get("cluster") or DEFAULT_CLUSTER)
        ctl = self.controllers.get(name)
        if ctl is None:
            ctl = self.controllers[name] = Controller(name, self.config, self.key)
        return ctl.handle(event)


def fold(
    events: Iterable[Mapping[str, Any]],
    config: Config,
    *,
    key: bytes | None = None,
    progress: Callable[[int], None] | None = None,
) -> Result:
    fleet = Fleet(config, key)
    result = Result()
    for n, event in enumerate(events):
        try:
            result.decisions.extend(fleet.handle(event))
        except BadEvent as exc:
            result.bad.append((n, str(exc)))
        result.events += 1
        if progress is not None and n % 10_000 == 0:
            progress(n)
    return result


def simulate(trace: Sequence[Mapping[str, Any]], config: Config, *, key: bytes | None = None) -> Result:
    fleet = Fleet(config, key)
    sim = Simulator(trace)
    result = Result()
    for n, event in enumerate(sim):
        event = dict(event, cluster=event.get("cluster", DEFAULT_CLUSTER))  # type: ignore[assignment]
        result.log.append(event)  # type: ignore[arg-type]
        try:
            decisions = fleet.handle(event)
        except BadEvent as exc:
            result.bad.append((n, str(exc)))
            continue
        result.decisions.extend(decisions)
        sim.react(decisions)
        result.events += 1
    return result
