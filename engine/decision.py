"""Decision records: what the engine answers, and why.

A decision names its flow, the preemptor, the outcome (preempt, fits,
unschedulable, wait), where the preemptor goes, the victims with the action the
actuator must take on each, and an explanation: every candidate node with the
criteria values that ranked it, and why the other nodes were rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PREEMPT, FITS, UNSCHEDULABLE, WAIT = "preempt", "fits", "unschedulable", "wait"
OUTCOMES = (PREEMPT, FITS, UNSCHEDULABLE, WAIT)
DELETE, EVICT, LABEL = "delete", "evict", "label"


@dataclass(frozen=True, slots=True)
class Victim:
    uid: str
    namespace: str
    name: str
    node: str
    priority: int
    action: str
    # Already terminating: its capacity is leaving anyway; the actuator does nothing more.
    terminating: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "node": self.node,
            "priority": self.priority,
            "action": self.action,
        }
        if self.terminating:
            out["terminating"] = True
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    flow: str
    preemptor: str  # namespace/name; for a gang, namespace/pod-group
    preemptor_uid: str
    outcome: str
    node: str | None = None
    placements: dict[str, str] | None = None
    victims: tuple[Victim, ...] = ()
    reason: str = ""
    explanation: dict[str, Any] = field(default_factory=dict)
    members: tuple[str, ...] = ()  # gang: the member pods (namespace/name) the decision places
    member_uids: tuple[str, ...] = ()  # their uids, in the same order

    def answer(self) -> dict[str, Any]:
        """The `preemptctl decide` contract (docs/case-format.md), plus the explanation."""
        out: dict[str, Any] = {"outcome": self.outcome, "flow": self.flow, "preemptor": self.preemptor}
        if self.placements is not None:
            out["placements"] = dict(sorted(self.placements.items()))
        elif self.node is not None:
            out["node"] = self.node
        out["victims"] = [v.key for v in self.victims]
        out["actions"] = {v.key: v.action for v in self.victims}
        out["reason"] = self.reason
        out["explanation"] = self.explanation
        return out


def maker(
    flow: str, preemptor: str, preemptor_uid: str, explanation: dict[str, Any], **common: Any
) -> Callable[..., Decision]:
    """Decisions of one flow for one preemptor, which differ only in outcome, reason and details."""

    def make(outcome: str, reason: str, **details: Any) -> Decision:
        return Decision(
            flow=flow,
            preemptor=preemptor,
            preemptor_uid=preemptor_uid,
            outcome=outcome,
            reason=reason,
            explanation=explanation,
            **common,
            **details,
        )

    return make
