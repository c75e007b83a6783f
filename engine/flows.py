"""The flows as one protocol, their registry, and the decision entry point every caller uses.

Per pending preemptor (docs/semantics.md) the first flow of the registry that
applies decides: a DaemonSet pod takes the DaemonSet flow; a gang of several pods,
or a pod charged to an ElasticQuota, the job flow; anything else the default flow,
the catch-all, always last. `decide` is the one function the CLI, the streaming
worker and the audit replay call; `preemptctl explain` and `preemptctl bench engine`
reach a flow through this registry too, never by its name spelled out.

A flow is one module implementing `Flow` (engine/default.py, engine/job.py,
engine/daemonset.py): its name, when it applies, `decide`, the shape of its
records' `explanation` (a TypedDict), the literal reference it is benchmarked
against, and how it explains its own records. Adding a flow is its module and
one entry in `BUILTIN`, plus the `flow` enum of schemas/decisions.schema.json
(tests/test_flows.py holds the two equal). `registered` adds one for a test only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Protocol

from engine import daemonset, default, job
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import Decision
from engine.flowbase import Told
from engine.index import Index
from engine.objects import Pod


class Flow(Protocol):
    """One way of deciding for a pending preemptor (kube-scheduler's preemption `Interface`)."""

    @property
    def name(self) -> str:
        """The record's `flow` (schemas/decisions.schema.json)."""
        ...

    @property
    def explanation(self) -> type[Mapping[str, Any]]:
        """The TypedDict of this flow's records' `explanation`: every key its decisions write."""
        ...

    def applies(self, cluster: Cluster, pods: Sequence[Pod]) -> bool:
        """Whether this flow takes these pods (one preemptor, or every pending member of a gang),
        given that no flow before it in the registry did."""
        ...

    def decide(
        self, cluster: Cluster, pods: Sequence[Pod], *, now: int, config: Config, index: Index
    ) -> Decision: ...

    def reference(
        self, cluster: Cluster, pods: Sequence[Pod], now: int, config: Config
    ) -> dict[str, Any] | None:
        """engine.reference's answer to the same question, as {outcome, node or placements,
        victims: sorted keys}; None where the reference does not cover this config."""
        ...

    # Explaining a record of this flow (streams.audit.explain); `pod` is namespace/name and
    # `d` the record as read back from the log (engine.flowbase says how to read it).

    def places(self, pod: str, d: Mapping[str, Any]) -> bool:
        """Whether `pod` is one of the pods the record decides for, other than its `preemptor`
        (a gang member)."""
        ...

    def explain_preemptor(self, pod: str, d: Mapping[str, Any]) -> Told:
        """`pod` asked for room (the preemptor, or a pod it `places`): where it went and why, or
        why it stays pending. Facts follow outcome, reason, victims; no summary: "outcome: reason"."""
        ...

    def explain_victim(self, pod: str, d: Mapping[str, Any], victim: Mapping[str, Any]) -> Told:
        """`pod` is the record's `victim` entry: why it was eligible and why it, not its neighbours.
        Facts start with `preemptorPriority`; the summary is the explainer's."""
        ...

    def explain_survivor(self, pod: str, d: Mapping[str, Any]) -> Told | None:
        """`pod` is not a victim: if the record names it as a candidate victim, why it was spared
        (no summary: "spared by <preemptor>")."""
        ...

    def unnamed_spared(self, d: Mapping[str, Any]) -> str | None:
        """When the record may have spared pods it does not name, the explainer's note about it
        (worded after "N <flow>-flow decision(s) "); else None."""
        ...


# Order is precedence: the first flow that applies decides. The last applies to anything.
BUILTIN: tuple[Flow, ...] = (daemonset.FLOW, job.FLOW, default.FLOW)

# The flows in force: the built-ins, plus any a test registers for the duration of a
# `with registered(...)` (a context variable: nothing leaks past the block, nor to other threads).
_FLOWS: ContextVar[tuple[Flow, ...]] = ContextVar("flows", default=BUILTIN)


def registry() -> tuple[Flow, ...]:
    """Every flow in force, in precedence order."""
    return _FLOWS.get()


def names() -> tuple[str, ...]:
    return tuple(f.name for f in _FLOWS.get())


def named(name: object) -> Flow | None:
    """The flow whose records say `flow: name`, if any."""
    return next((f for f in _FLOWS.get() if f.name == name), None)


def of_record(d: Mapping[str, Any]) -> Flow:
    """The flow that explains a decision record: its own, else (a record of a flow no longer or
    not yet known) the catch-all's, which reads whatever it finds."""
    return named(d.get("flow")) or _FLOWS.get()[-1]


@contextlib.contextmanager
def registered(flow: Flow, *, before: str | None = None) -> Iterator[Flow]:
    """Add `flow` to the registry inside the block only: before the flow named `before`, by
    default before the catch-all (which stays last)."""
    flows = _FLOWS.get()
    if named(flow.name) is not None:
        raise ValueError(f"a flow named {flow.name!r} is already registered")
    target = flows[-1].name if before is None else before
    at = next((i for i, f in enumerate(flows) if f.name == target), None)
    if at is None:
        raise ValueError(f"no flow named {target!r} to register {flow.name!r} before")
    token = _FLOWS.set((*flows[:at], flow, *flows[at:]))
    try:
        yield flow
    finally:
        _FLOWS.reset(token)


def select(cluster: Cluster, pods: Sequence[Pod]) -> Flow:
    """The flow that decides for these pods: the first in the registry that applies."""
    flows = _FLOWS.get()
    return next((f for f in flows[:-1] if f.applies(cluster, pods)), flows[-1])


def select_flow(cluster: Cluster, pods: Sequence[Pod]) -> str:
    return select(cluster, pods).name


def decide(
    cluster: Cluster,
    pods: Sequence[Pod],
    *,
    now: int,
    config: Config,
    index: Index | None = None,
) -> Decision:
    """Decide for one pending preemptor (or one gang, all members given).

    Pass the same `index` for every decision over one cluster (the streaming
    worker does): its rankings then stay current incrementally.
    """
    flow = select(cluster, pods)
    return flow.decide(cluster, pods, now=now, config=config, index=index or Index(cluster))
