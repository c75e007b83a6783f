"""What the flows share beneath the registry (engine.flows): telling a decision record back.

Each flow explains its own decision records: `preemptctl explain` (streams.audit.explain)
asks the record's flow, through the registry, what the record says about one pod as
its preemptor (or a gang member), a victim, or a candidate victim that was spared.
`Told` is a flow's answer; the explainer adds what every flow shares (the role, the
common facts, the co-victims) and prints it.

Records are read as they come back from the log: JSON, possibly from an older
version, possibly partial. The readers below take a field as it is and read a
missing or mistyped one as empty, so an explanation never fails on the record it
explains.

Apart from engine.flows because every flow module imports this one and the
registry imports every flow module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Told:
    """What one flow says about one pod in one decision record.

    `details` are the answer's lines, in order; `facts` its machine-readable part,
    added after the facts every flow shares (their order is the JSON answer's);
    `summary` the one-line answer, or None for the explainer's wording, the same for every flow.
    """

    details: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    summary: str | None = None


def key_of(v: Mapping[str, Any]) -> str:
    """A victim entry's pod: namespace/name."""
    return f"{v.get('namespace')}/{v.get('name')}"


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def explanation_of(d: Mapping[str, Any]) -> dict[str, Any]:
    """A record's `explanation` (empty when it has none)."""
    return as_dict(d.get("explanation"))


def victim_keys(d: Mapping[str, Any]) -> list[str]:
    """Every victim of a record, namespace/name, in the record's order."""
    return [key_of(v) for v in as_list(d.get("victims")) if isinstance(v, dict)]
