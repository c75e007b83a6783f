"""Human-readable renderings of decisions (`--output text`)."""

from __future__ import annotations

from typing import Any

from engine.decision import Decision


def decision_text(name: str, d: Decision) -> str:
    lines = [f"{name}: {d.outcome.upper()} ({d.flow} flow) — {d.preemptor}"]
    if d.placements:
        for member, node in sorted(d.placements.items()):
            lines.append(f"  place {member} on {node}")
    elif d.node:
        lines.append(f"  node: {d.node}")
    for v in d.victims:
        extra = " (already terminating)" if v.terminating else ""
        lines.append(f"  {v.action} {v.key} on {v.node} (priority {v.priority}){extra}")
    lines.append(f"  why: {d.reason}")
    ex: dict[str, Any] = d.explanation
    for c in ex.get("candidates", [])[:5]:
        lines.append(
            "  candidate {node}: pdbViolations={pdbViolations} highest={highestVictimPriority} "
            "sum={prioritySum} victims={victims}".format(**c)
        )
    for r in ex.get("rejected", [])[:5]:
        lines.append(f"  rejected {r['node']}: {r['reason']}")
    more = ex.get("rejectedCount", 0) - len(ex.get("rejected", [])[:5])
    if more > 0:
        lines.append(f"  ... {more} more rejected node(s)")
    return "\n".join(lines)
