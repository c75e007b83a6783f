"""The session's tally of parity classifications: `record` in each parity test, the counts in
the summary tests/parity/conftest.py writes at the end of the run.
"""

from __future__ import annotations

from tests.parity import classify as classify_mod

# Every classification of the session, for the summary: (source, kind, departures).
RESULTS: list[tuple[str, str, tuple[str, ...]]] = []
# The same per filter that decides the cluster upstream, and per generated shape: (label, kind).
BY_FILTER: list[tuple[str, str]] = []
BY_SHAPE: list[tuple[str, str]] = []


def record(source: str, c: classify_mod.Classification, tags: tuple[str, ...] = ()) -> None:
    RESULTS.append((source, c.kind, c.departures))
    BY_FILTER.extend(
        (f, c.kind) for f in c.filters or ("none of NodePorts, InterPodAffinity, PodTopologySpread",)
    )
    if source == "generated clusters":
        BY_SHAPE.extend((t, c.kind) for t in tags or ("plain",))
