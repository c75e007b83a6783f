"""`preemptctl explain NAMESPACE/POD --decisions DECISIONS`: why a pod was (or was not) preempted.

This module owns answering that question from the decision records alone, in
each flow's terms (docs/semantics.md), never by re-running the engine: what was recorded
is what is explained. For the pod it finds every decision that mentions it:
- as a victim: which decision, which preemptor, which node, why that node
  (its rank against the runner-up, criterion by criterion) and why this pod
  rather than its neighbours (the reprieve order, the DaemonSet candidate order,
  the job's give-back pass);
- as a survivor: a candidate victim that was not evicted: given back on the
  chosen node, or on a node that ranked worse;
- as a preemptor (or gang member): where it landed and why, or why it stayed
  pending (rejected nodes by reason, quota checks, wait reasons);
and says so plainly when no record mentions it.

What the records can support is limited by what the engine writes into
`explanation`: the pods given back on the chosen node are listed only when the
chosen node carries `potentialVictims` (docs/audit.md); older records lack it,
and the answer says when that matters.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from engine import timeutil
from engine.errors import EngineError
from streams.audit import verify
from streams.common.errors import UsageError
from streams.kafka import connection

VICTIM, SURVIVOR, PREEMPTOR, MEMBER = "victim", "survivor", "preemptor", "member"
SHIFT = 2**31  # the engine counts victim priorities from -2^31 when summing them (docs/semantics.md)
QOS_RANK = {"Guaranteed": 2, "Burstable": 1, "BestEffort": 0}
# How many rejection reasons a text answer lists (the JSON has all the record has).
TOP_REASONS = 3


@dataclass(slots=True)
class Finding:
    """One decision's part in the pod's story."""

    decision: str
    cluster: str
    seq: int
    ts: str
    flow: str
    role: str
    summary: str
    details: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "cluster": self.cluster,
            "seq": self.seq,
            "ts": self.ts,
            "flow": self.flow,
            "role": self.role,
            "summary": self.summary,
            "details": self.details,
            "facts": self.facts,
        }


@dataclass(slots=True)
class Report:
    pod: str
    scanned: int = 0
    clusters: set[str] = field(default_factory=set)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _undetailed: int = 0  # default-flow preemptions whose chosen node lacks potentialVictims

    def add(self, d: Mapping[str, Any]) -> None:
        """Count one decision record and keep what it says about the pod."""
        self.scanned += 1
        self.clusters.add(str(d.get("cluster")))
        chosen = _dict(_dict(d.get("explanation")).get("chosen"))
        if d.get("flow") == "default" and d.get("outcome") == "preempt" and "potentialVictims" not in chosen:
            self._undetailed += 1
        self.findings.extend(findings(self.pod, d))

    def finish(self) -> None:
        # Only worth saying when the pod might be a spared neighbour these records cannot name.
        if self._undetailed and all(f.role == SURVIVOR for f in self.findings):
            self.notes.append(
                f"{self._undetailed} default-flow decision(s) do not list the pods given back on their "
                "chosen node (no potentialVictims in the explanation): a pod that was on such a node and "
                "was spared is not mentioned by them"
            )

    @property
    def verdict(self) -> str:
        if not self.findings:
            scope = ", ".join(sorted(self.clusters)) or "none"
            return (
                f"{self.pod} is not mentioned in any of the {self.scanned} decision record(s) "
                f"(clusters: {scope}): never a preemptor, a victim, or a candidate victim in them"
            )
        parts = []
        for role, label in (
            (PREEMPTOR, "preemptor in"),
            (MEMBER, "gang member in"),
            (VICTIM, "victim of"),
            (SURVIVOR, "spared by"),
        ):
            mine = [f for f in self.findings if f.role == role]
            if mine:
                parts.append(f"{label} {len(mine)} decision(s) (latest: {mine[-1].summary}, {mine[-1].ts})")
        return f"{self.pod}: " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "decisionsScanned": self.scanned,
            "verdict": self.verdict,
            "mentioned": bool(self.findings),
            "findings": [f.to_json() for f in self.findings],
            "notes": self.notes,
        }

    def text(self) -> str:
        lines = [self.verdict]
        for f in self.findings:
            lines.append("")
            lines.append(f"{f.decision}  {f.ts}  cluster {f.cluster}  flow {f.flow}")
            lines.append(f"  {f.role}: {f.summary}")
            lines.extend(f"  - {d}" for d in f.details)
        if self.notes:
            lines.append("")
            lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


# ---- small readers of the explanation -------------------------------------------------


def _key(v: Mapping[str, Any]) -> str:
    return f"{v.get('namespace')}/{v.get('name')}"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _placements(d: Mapping[str, Any]) -> dict[str, Any]:
    """Every member's node: `placements` for a gang of several, `node` for a single-pod job preemptor."""
    placements = _dict(d.get("placements"))
    if not placements and d.get("node"):
        members = _list(_dict(d.get("explanation")).get("members")) or [d.get("preemptor")]
        placements = {str(members[0]): d.get("node")}
    return placements


def _criteria_order(mode: str) -> list[tuple[str, str]]:
    """(criterion, what wins on it), in the order the engine ranks candidate nodes (docs/semantics.md)."""
    shifted = ("shiftedSum", "a smaller sum of victim priorities (each counted from -2^31)")
    count = ("victims", "fewer victims")
    head = [
        ("pdbViolations", "fewer PDB violations"),
        ("highestVictimPriority", "a lower highest victim priority"),
    ]
    latest = ("earliestStartOfHighest", "a later start of its highest-priority victims")
    if mode == "minimal":
        return [*head, count, shifted, latest]
    return [*head, shifted, count, latest]


def _value(c: Mapping[str, Any], name: str) -> Any:
    if name == "shiftedSum":
        return int(c.get("prioritySum") or 0) + int(c.get("victims") or 0) * SHIFT
    if name == "highestVictimPriority":
        v = c.get("highestVictimPriority")
        return -SHIFT if v is None else v
    if name == "earliestStartOfHighest":
        return c.get("earliestStartOfHighest") or "~"  # no start sorts last: the latest possible
    return c.get(name) or 0


def _show(c: Mapping[str, Any], name: str) -> str:
    if name == "shiftedSum":
        return f"priority sum {c.get('prioritySum')} over {c.get('victims')} victim(s)"
    return str(c.get(name))


def rank_reason(better: Mapping[str, Any], worse: Mapping[str, Any], mode: str) -> tuple[str, str]:
    """(criterion, sentence): the first criterion on which `better` beats `worse`, as the engine ranks."""
    # Candidates are recorded best first, so the first criterion that differs is the one it wins on.
    for name, wins in _criteria_order(mode):
        a, b = _value(better, name), _value(worse, name)
        if a != b:
            return name, (
                f"{better.get('node')} has {wins} ({_show(better, name)} vs {_show(worse, name)} "
                f"on {worse.get('node')})"
            )
    return "node", (
        f"{better.get('node')} and {worse.get('node')} tie on every criterion; the node name breaks the tie"
    )


def more_important(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """Why pod entry `a` outranks `b` in importance (priority, QoS, earlier start), or None if it does not."""
    pa, pb = int(a.get("priority") or 0), int(b.get("priority") or 0)
    if pa != pb:
        return f"higher priority ({pa} > {pb})" if pa > pb else None
    qa, qb = QOS_RANK.get(str(a.get("qos")), 0), QOS_RANK.get(str(b.get("qos")), 0)
    if qa != qb:
        return f"same priority, better QoS class ({a.get('qos')} > {b.get('qos')})" if qa > qb else None
    sa, sb = a.get("start") or "~", b.get("start") or "~"
    if sa != sb:
        return (
            f"same priority and QoS, started earlier ({a.get('start')} < {b.get('start')})"
            if sa < sb
            else None
        )
    return None


def _res(value: Any) -> str:
    """{"cpu": "1", "pods": "1"} -> "cpu 1, pods 1"."""
    return ", ".join(f"{k} {v}" for k, v in sorted(_dict(value).items())) or "nothing"


def _rejected(ex: Mapping[str, Any]) -> str | None:
    reasons = _dict(ex.get("rejectedReasons"))
    count = ex.get("rejectedCount") or sum(int(n) for n in reasons.values())
    if not count:
        return None
    top = sorted(reasons.items(), key=lambda kv: (-int(kv[1]), kv[0]))[:TOP_REASONS]
    shown = "; ".join(f"{n}× {r}" for r, n in top)
    more = " …" if len(reasons) > TOP_REASONS else ""
    return f"{count} node(s) rejected: {shown}{more}"


def _node_choice(ex: Mapping[str, Any], chosen: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Why the chosen node, against the runner-up; lines and facts."""
    mode = str(ex.get("victimSelection") or "kubernetes")
    candidates = [c for c in _list(ex.get("candidates")) if isinstance(c, dict)]
    count = int(ex.get("candidateCount") or len(candidates))
    runner = next((c for c in candidates if c.get("node") != chosen.get("node")), None)
    facts: dict[str, Any] = {"candidateNodes": count, "victimSelection": mode}
    lines = []
    if runner is None:
        lines.append(f"{chosen.get('node')} was the only node where evicting lower-priority pods makes room")
    else:
        criterion, why = rank_reason(chosen, runner, mode)
        facts.update(runnerUp=runner.get("node"), decidedBy=criterion)
        lines.append(f"{chosen.get('node')} ranked first of {count} candidate node(s): {why}")
    rejected = _rejected(ex)
    if rejected:
        lines.append(rejected)
    return lines, facts


# ---- findings per flow ------------------------------------------------------------------


def _victim(pod: str, d: Mapping[str, Any], victim: Mapping[str, Any], base: dict[str, Any]) -> Finding:
    ex = _dict(d.get("explanation"))
    flow = str(d.get("flow"))
    node = str(victim.get("node"))
    terminating = bool(victim.get("terminating"))
    action = str(victim.get("action"))
    others = [_key(v) for v in _list(d.get("victims")) if isinstance(v, dict) and _key(v) != pod]
    facts: dict[str, Any] = {
        "uid": victim.get("uid"),
        "preemptor": d.get("preemptor"),
        "node": node,
        "action": action,
        "priority": victim.get("priority"),
        "terminating": terminating,
        "coVictims": others,
    }
    pre_prio = ex.get("jobPriority") if flow == "job" else ex.get("preemptorPriority")
    facts["preemptorPriority"] = pre_prio
    how = "already terminating: listed again, no new action" if terminating else f"action {action}"
    summary = f"preempted by {d.get('preemptor')} on {node} ({how})"
    details = []
    if flow == "job":
        details += _victim_job(pod, d, ex, node, facts)
    elif flow == "daemonset":
        details += _victim_daemonset(pod, d, ex, facts)
    else:
        details.append(
            f"eligible: priority {victim.get('priority')} is below the preemptor's {pre_prio}, "
            "and it does not tolerate the preemptor"
        )
        chosen = _dict(ex.get("chosen"))
        lines, choice = _node_choice(ex, chosen)
        facts.update(choice)
        details += lines
        details += _why_this_pod(pod, ex, victim, facts)
    if others:
        details.append(f"evicted with it: {', '.join(others)}")
    if terminating:
        details.append(
            "it was already terminating (an earlier decision's victim), so its room was leaving anyway"
        )
    return Finding(role=VICTIM, summary=summary, details=details, facts=facts, **base)


def _why_this_pod(
    pod: str, ex: Mapping[str, Any], victim: Mapping[str, Any], facts: dict[str, Any]
) -> list[str]:
    chosen = _dict(ex.get("chosen"))
    entries = [e for e in _list(chosen.get("potentialVictims")) if isinstance(e, dict)]
    node = chosen.get("node")
    if ex.get("victimSelection") == "minimal":
        facts["reprieved"] = [e.get("pod") for e in entries if not e.get("victim")] if entries else None
        kept = f" ({', '.join(str(x) for x in facts['reprieved'])} left in place)" if entries else ""
        return [
            f"victimSelection minimal: of the eligible pods on {node}, the victim set chosen is the one "
            "with the fewest PDB violations, then the lowest highest priority, then the fewest victims, "
            f"then the smallest priority sum{kept}: one pod that frees enough beats several smaller ones"
        ]
    if not entries:
        facts["reprieved"] = None
        return [
            f"the record does not list the pods given back on {node} (no potentialVictims in the "
            "explanation): lower-priority pods are given back most important first (higher priority, "
            "then QoS class, then earlier start), pods whose eviction would violate a PDB first, and "
            "this pod's return would "
            "have left the preemptor without room"
        ]
    me = next((e for e in entries if e.get("pod") == pod), dict(victim, pod=pod))
    spared = [e for e in entries if not e.get("victim")]
    facts["reprieved"] = [e.get("pod") for e in spared]
    lines = [
        f"on {node} the engine removed {len(entries)} lower-priority pod(s), then gave them back in "
        f"this order: {', '.join(str(e.get('pod')) for e in entries)}; a pod whose return left the "
        "preemptor without room stayed a victim"
    ]
    for e in spared:
        if e.get("pdbViolating") and not me.get("pdbViolating"):
            why = "evicting it would violate a PDB, and those are given back first"
        else:
            why = more_important(e, me) or "less important, but small enough to fit back in the room left"
        lines.append(f"{e.get('pod')} was given back: {why}")
    if not spared:
        lines.append(f"every eligible pod on {node} had to go: none could be given back")
    return lines


def _victim_job(
    pod: str, d: Mapping[str, Any], ex: Mapping[str, Any], node: str, facts: dict[str, Any]
) -> list[str]:
    placements = _placements(d)
    here = sorted(m for m, n in placements.items() if n == node)
    facts["membersOnNode"] = here
    lines = [
        f"job {ex.get('job')} (priority {ex.get('jobPriority')}) places {len(placements)} member(s): "
        + ", ".join(f"{m} on {n}" for m, n in sorted(placements.items())),
        f"eligible: preemptible and priority {facts.get('priority')} below the job's {ex.get('jobPriority')}",
        f"all eligible pods were removed, the members placed, then pods given back most important first "
        f"while {', '.join(here) or 'the members'} on {node} still fit and the job's quota held: this one "
        "could not come back",
    ]
    if facts["action"] == "label":
        lines.append(
            "soft eviction: the pod is labelled for its owner to remove (podShouldBeDeletedWhenPreempted "
            "is false), not deleted"
        )
    return lines


def _victim_daemonset(
    pod: str, d: Mapping[str, Any], ex: Mapping[str, Any], facts: dict[str, Any]
) -> list[str]:
    candidates = [c for c in _list(ex.get("candidates")) if isinstance(c, dict)]
    position = next((i for i, c in enumerate(candidates) if c.get("pod") == pod), None)
    strategies = [s for s in _list(ex.get("strategies")) if isinstance(s, dict)]
    used = strategies[-1] if strategies else {}
    facts.update(position=None if position is None else position + 1, strategy=used.get("strategy"))
    lines = [
        f"DaemonSet pod {d.get('preemptor')} needs its required node {ex.get('node')} (request "
        f"{_res(ex.get('request'))}; free {_res(ex.get('free'))})"
    ]
    if position is not None:
        me = candidates[position]
        lines.append(
            f"candidate {position + 1} of {ex.get('candidateCount', len(candidates))} in the order "
            f"(class regular < owner < opt-out, then lower priority, then younger, then larger): class "
            f"{me.get('class')}, priority {me.get('priority')}, created {me.get('created')}"
        )
    if used:
        lines.append(f"strategy {used.get('strategy')}: {used.get('result')}")
    return lines


def _survivor(pod: str, d: Mapping[str, Any], base: dict[str, Any]) -> Finding | None:
    ex = _dict(d.get("explanation"))
    flow = str(d.get("flow"))
    outcome = d.get("outcome")
    victims = [_key(v) for v in _list(d.get("victims")) if isinstance(v, dict)]
    evicted = ", ".join(victims) or "no one"
    if flow == "daemonset":
        candidates = [c for c in _list(ex.get("candidates")) if isinstance(c, dict)]
        position = next((i for i, c in enumerate(candidates) if c.get("pod") == pod), None)
        if position is None:
            return None
        strategies = [s for s in _list(ex.get("strategies")) if isinstance(s, dict)]
        used = strategies[-1] if strategies else {}
        facts = {
            "node": ex.get("node"),
            "as": "daemonset-candidate",
            "position": position + 1,
            "victims": victims,
        }
        details = [
            f"candidate {position + 1} of {ex.get('candidateCount', len(candidates))} on {ex.get('node')}"
            f" (class {candidates[position].get('class')}, priority {candidates[position].get('priority')},"
            f" created {candidates[position].get('created')})"
        ]
        if outcome == "preempt":
            details.append(
                f"strategy {used.get('strategy')} ({used.get('result')}) took {evicted}: enough room "
                "without this pod"
            )
        return Finding(
            role=SURVIVOR,
            summary=f"spared on {ex.get('node')}: {outcome}, evicted {evicted}",
            details=details,
            facts=facts,
            **base,
        )
    if flow == "job":
        return _survivor_job(pod, d, ex, evicted, base)
    chosen = _dict(ex.get("chosen"))
    mode = str(ex.get("victimSelection") or "kubernetes")
    entry = next(
        (e for e in _list(chosen.get("potentialVictims")) if isinstance(e, dict) and e.get("pod") == pod),
        None,
    )
    if entry is not None:
        evicted_entries = [
            e for e in _list(chosen.get("potentialVictims")) if isinstance(e, dict) and e.get("victim")
        ]
        details = [f"a lower-priority pod on the chosen node {chosen.get('node')}, given back: "]
        if mode == "minimal":
            details[0] = (
                f"a lower-priority pod on the chosen node {chosen.get('node')}, left in place: "
                "victimSelection minimal chose the least disruptive victim set there (fewest PDB "
                "violations, lowest highest priority, fewest victims, smallest priority sum), "
                "and it is not in it"
            )
        elif entry.get("pdbViolating"):
            details[0] += "evicting it would violate a PDB, and those are given back first"
        else:
            beats = [(v.get("pod"), more_important(entry, v)) for v in evicted_entries]
            if beats and all(reason for _, reason in beats):
                details[0] += "it outranks every victim: " + "; ".join(f"vs {p}: {r}" for p, r in beats)
            else:
                details[0] += (
                    "it was tried after more important pods came back and the preemptor still had "
                    "room with it"
                )
        details.append(f"evicted instead: {evicted}")
        facts = {
            "node": chosen.get("node"),
            "as": "reprieved",
            "priority": entry.get("priority"),
            "victims": [v.get("pod") for v in evicted_entries],
        }
        return Finding(
            role=SURVIVOR,
            summary=f"given back on {chosen.get('node')} for {d.get('preemptor')}",
            details=details,
            facts=facts,
            **base,
        )
    candidates = [c for c in _list(ex.get("candidates")) if isinstance(c, dict)]
    for rank, c in enumerate(candidates, 1):
        if pod in _list(c.get("victimPods")) and c.get("node") != chosen.get("node"):
            facts = {
                "node": c.get("node"),
                "as": "other-candidate-node",
                "rank": rank,
                "chosenNode": chosen.get("node") or d.get("node"),
            }
            details = [
                f"it would have been a victim on {c.get('node')} (candidate {rank} of "
                f"{ex.get('candidateCount', len(candidates))})"
            ]
            if chosen:
                criterion, why = rank_reason(chosen, c, mode)
                facts["decidedBy"] = criterion
                details.append(f"but {why}")
                details.append(f"evicted instead: {evicted} on {chosen.get('node')}")
            else:
                details.append(f"but no pod was evicted: outcome {outcome} ({d.get('reason')})")
            return Finding(
                role=SURVIVOR,
                summary=f"spared: {d.get('preemptor')} went to "
                f"{chosen.get('node') or d.get('node') or 'no node'}, not {c.get('node')}",
                details=details,
                facts=facts,
                **base,
            )
    return None


def _survivor_job(
    pod: str, d: Mapping[str, Any], ex: Mapping[str, Any], evicted: str, base: dict[str, Any]
) -> Finding | None:
    placements = _placements(d)
    mode = str(ex.get("victimSelection") or "kubernetes")
    for step in _list(ex.get("placements")):
        if not isinstance(step, dict):
            continue
        candidates = [c for c in _list(step.get("candidates")) if isinstance(c, dict)]
        mine = next((c for c in candidates if pod in _list(c.get("victimPods"))), None)
        if mine is None:
            continue
        member, node = step.get("member"), mine.get("node")
        facts: dict[str, Any] = {"node": node, "member": member, "memberNode": step.get("node")}
        if d.get("outcome") != "preempt":
            facts["as"] = "no-eviction"
            details = [
                f"a candidate victim on {node} while placing {member}, but the job evicted no one: "
                f"{d.get('outcome')} ({d.get('reason')})"
            ]
        elif node == step.get("node") or node in placements.values():
            facts["as"] = "reprieved"
            details = [
                f"a candidate victim on {node} while placing {member}",
                "given back in the job's final pass (most important first) because every member placed on "
                f"{node} still fit and the quota held with it",
                f"evicted instead: {evicted}",
            ]
        else:
            facts["as"] = "other-candidate-node"
            chosen = next((c for c in candidates if c.get("node") == step.get("node")), None)
            why = rank_reason(chosen, mine, mode)[1] if chosen else f"{member} went to {step.get('node')}"
            details = [f"it would have been a victim on {node} for member {member}", f"but {why}"]
        return Finding(
            role=SURVIVOR, summary=f"spared by job {ex.get('job')}", details=details, facts=facts, **base
        )
    return None


def _preemptor(pod: str, d: Mapping[str, Any], base: dict[str, Any]) -> Finding:
    ex = _dict(d.get("explanation"))
    flow, outcome, reason = str(d.get("flow")), str(d.get("outcome")), str(d.get("reason"))
    victims = [_key(v) for v in _list(d.get("victims")) if isinstance(v, dict)]
    facts: dict[str, Any] = {"outcome": outcome, "reason": reason, "victims": victims}
    role = PREEMPTOR
    details: list[str] = []
    if flow == "job":
        placements = _placements(d)
        facts["placements"] = placements
        if pod != d.get("preemptor"):
            role = MEMBER
            facts["node"] = placements.get(pod)
        where = (
            f"{pod} on {placements[pod]}"
            if pod in placements
            else ", ".join(f"{m} on {n}" for m, n in sorted(placements.items()))
        )
        summary = f"{outcome}: {where or reason}"
        details.append(
            f"job {ex.get('job')} (priority {ex.get('jobPriority')}), members: "
            f"{', '.join(str(m) for m in _list(ex.get('members')))}"
        )
        for step in _list(ex.get("placements")):
            if isinstance(step, dict):
                details.append(
                    f"member {step.get('member')}: {step.get('how')}"
                    f"{' on ' + str(step.get('node')) if step.get('node') else ''}"
                    f" ({step.get('candidateCount', 0)} candidate node(s), "
                    f"{step.get('rejectedCount', 0)} rejected)"
                )
        for q in _list(ex.get("quotas")):
            for c in _list(_dict(q).get("checks")):
                if isinstance(c, dict) and not c.get("ok"):
                    details.append(
                        f"quota {_dict(q).get('quota')} fails for {c.get('resource')}: "
                        f"{c.get('formula')}: {c.get('value')} > {c.get('limit')}"
                    )
        details.append(f"outcome {outcome}: {reason}")
    elif flow == "daemonset":
        facts["node"] = d.get("node") or ex.get("node")
        summary = f"{outcome} on {ex.get('node')}" + (f", evicting {', '.join(victims)}" if victims else "")
        details.append(
            f"DaemonSet pod: only its required node {ex.get('node')} counts (request "
            f"{_res(ex.get('request'))}; free {_res(ex.get('free'))})"
        )
        for s in _list(ex.get("strategies")):
            if isinstance(s, dict):
                details.append(f"strategy {s.get('strategy')}: {s.get('result')}")
        details.append(f"outcome {outcome}: {reason}")
    else:
        facts["node"] = d.get("node")
        details.append(f"priority {ex.get('preemptorPriority')}")
        if outcome == "preempt":
            chosen = _dict(ex.get("chosen"))
            lines, choice = _node_choice(ex, chosen)
            facts.update(choice)
            summary = f"nominated to {d.get('node')}, evicting {', '.join(victims) or 'no one'}"
            details += lines
            details.append(
                f"{d.get('node')}: {chosen.get('victims')} victim(s), highest priority "
                f"{chosen.get('highestVictimPriority')}, {chosen.get('pdbViolations')} PDB violation(s)"
            )
            leaving = [
                _key(v) for v in _list(d.get("victims")) if isinstance(v, dict) and v.get("terminating")
            ]
            facts["alreadyLeaving"] = leaving
            if leaving:
                # Seed 004 Example 2: a higher-priority pod takes over a node whose victims are leaving.
                details.append(
                    f"{len(leaving)} of its victims were already terminating (an earlier decision's): no new "
                    f"eviction for {', '.join(leaving)}"
                )
        elif outcome == "fits":
            summary = f"fits on {d.get('node')} without preemption"
        else:
            summary = f"{outcome}: {reason}"
            rejected = _rejected(ex)
            if rejected:
                details.append(rejected)
            facts["rejectedReasons"] = _dict(ex.get("rejectedReasons"))
    return Finding(role=role, summary=summary, details=details, facts=facts, **base)


def _is_preemptor(pod: str, d: Mapping[str, Any]) -> bool:
    if d.get("preemptor") == pod:
        return True
    ex = _dict(d.get("explanation"))
    return d.get("flow") == "job" and (pod in _list(ex.get("members")) or pod in _placements(d))


def findings(pod: str, d: Mapping[str, Any]) -> list[Finding]:
    """What one decision record says about `pod` (nothing, or one finding per role)."""
    base: dict[str, Any] = {
        "decision": str(d.get("id")),
        "cluster": str(d.get("cluster")),
        "seq": int(d.get("seq") or 0),
        "ts": str(d.get("ts")),
        "flow": str(d.get("flow")),
    }
    out = []
    if _is_preemptor(pod, d):
        out.append(_preemptor(pod, d, base))
    victim = next((v for v in _list(d.get("victims")) if isinstance(v, dict) and _key(v) == pod), None)
    if victim is not None:
        out.append(_victim(pod, d, victim, base))
    else:
        survivor = _survivor(pod, d, base)
        if survivor is not None:
            out.append(survivor)
    return out


def explain(pod: str, decisions: Iterable[Mapping[str, Any]], *, cluster: str | None = None) -> Report:
    report = Report(pod)
    for d in decisions:
        if cluster is None or d.get("cluster") == cluster:
            report.add(d)
    report.finish()
    return report


def parse_pod(text: str) -> str:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise UsageError(f"expected NAMESPACE/POD, got {text!r}")
    return text


# `explain` found no record mentioning the pod.
EXIT_NOT_MENTIONED = 1
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, *, now_us: int) -> int:
    """`--since`: an RFC 3339 time, or a duration before `now_us` (30m, 2h, 7d); epoch microseconds."""
    match = _DURATION.match(text)
    if match:
        return now_us - int(match.group(1)) * _UNIT_S[match.group(2)] * 1_000_000
    try:
        return timeutil.parse(text, field="--since")
    except EngineError as exc:
        raise UsageError(
            f"--since: expected a duration (30m, 2h, 7d) or an RFC 3339 time, got {text!r}"
        ) from exc


def read(
    location: str,
    pod: str,
    *,
    cluster: str | None,
    kafka: connection.KafkaConfig | None = None,
    since_us: int | None = None,
) -> Report:
    """Stream the log, one record at a time (a long log is never held whole); with `since_us`, only
    decisions made at or after it (a topic is read from there on, through the broker's time index)."""
    report = Report(pod)
    wanted = cluster.encode() if cluster is not None else None

    def sink(where: str, key: bytes | None, value: bytes) -> None:
        if wanted is not None and key is not None and key != wanted:
            return  # decision topics are keyed by cluster
        try:
            d = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"{location}: {where}: not JSON: {exc}") from exc
        if not isinstance(d, dict) or not isinstance(d.get("id"), str):
            raise UsageError(f"{location}: {where}: not a decision record")
        if since_us is not None and _decided_us(d) < since_us:
            return
        if cluster is None or d.get("cluster") == cluster:
            report.add(d)

    verify.scan(location, sink, kafka=kafka, since_ms=None if since_us is None else since_us // 1000)
    report.finish()
    return report


def _decided_us(d: Mapping[str, Any]) -> int:
    try:
        return timeutil.parse(d.get("ts"), field="ts")
    except EngineError:
        return 0  # a record without a readable time: before any --since


def cmd(args: argparse.Namespace) -> int:
    pod = parse_pod(args.pod)
    since = None if args.since is None else parse_since(args.since, now_us=time.time_ns() // 1000)
    kafka = connection.for_locations(args)
    report = read(args.decisions, pod, cluster=args.cluster, kafka=kafka, since_us=since)
    if args.output == "json":
        sys.stdout.write(orjson.dumps(report.to_json()).decode() + "\n")
    else:
        print(report.text())
    return 0 if report.findings else EXIT_NOT_MENTIONED
