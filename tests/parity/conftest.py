"""One control plane and one harness for every parity test; the counts reported at the end.

The control plane is kube-apiserver + etcd (testbed/cluster.py) with the
TaintNodesByCondition admission plugin off: no node-lifecycle controller runs
to lift the not-ready taint it would put on every node. kube-scheduler runs
fresh for each scenario (tests/parity/harness.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from testbed import cluster as k8s
from testbed import scheduler as scheduler_mod
from tests.parity.harness import Harness
from tests.parity.tally import BY_FILTER, BY_SHAPE, RESULTS
from tests.support import tools


@pytest.fixture(scope="session")
def parity() -> Iterator[Harness]:
    try:
        k8s.prerequisites()
        scheduler_mod.binary()
    except k8s.Unavailable as exc:
        tools.unavailable(f"no real kube-apiserver and kube-scheduler: {exc}")
    with k8s.TestCluster(disable_admission=("TaintNodesByCondition",)) as control:
        harness = Harness(control)
        try:
            yield harness
        finally:
            harness.close()


KINDS = ("same", "tie", "documented", "unexplained")


def _counts(rows: list[tuple[str, str]]) -> list[str]:
    out = []
    for label in sorted({r[0] for r in rows}):
        kinds = Counter(k for name, k in rows if name == label)
        out.append(
            f"  {label}: {sum(kinds.values())}: " + ", ".join(f"{kinds[k]} {k}" for k in KINDS if kinds[k])
        )
    return out


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    write = terminalreporter.write_line
    for source in sorted({r[0] for r in RESULTS}):
        kinds = Counter(r[1] for r in RESULTS if r[0] == source)
        departures = Counter(d for r in RESULTS if r[0] == source for d in r[2])
        write(
            f"parity with kube-scheduler, {source}: {sum(kinds.values())} compared: "
            + ", ".join(f"{kinds[k]} {k}" for k in ("same", "tie", "documented", "unexplained") if kinds[k])
        )
        for name, n in sorted(departures.items()):
            write(f"  documented departure {name}: {n}")
    if BY_FILTER:
        write("parity by the filter that decides upstream (a cluster may count under several):")
        for line in _counts(BY_FILTER):
            write(line)
    if BY_SHAPE:
        write("parity by generated shape (a cluster may count under several):")
        for line in _counts(BY_SHAPE):
            write(line)
