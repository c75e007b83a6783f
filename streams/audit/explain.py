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
and says so plainly when no record mentions it. Each answer's flow-specific part is
the record's flow's own (`explain_preemptor`, `explain_victim`, `explain_survivor`
beside its `decide`, reached through the registry in engine.flows): this module
finds the records that mention the pod, adds what every flow shares, and prints.

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

from engine import flows, timeutil
from engine.errors import EngineError
from engine.flowbase import as_list, key_of, victim_keys
from streams.audit import verify
from streams.common.errors import UsageError
from streams.kafka import connection

VICTIM, SURVIVOR, PREEMPTOR, MEMBER = "victim", "survivor", "preemptor", "member"


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
    # Records that may have spared pods they do not name, counted by (flow, the flow's note):
    # e.g. default-flow preemptions whose chosen node lacks potentialVictims.
    _unnamed: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, d: Mapping[str, Any]) -> None:
        """Count one decision record and keep what it says about the pod."""
        self.scanned += 1
        self.clusters.add(str(d.get("cluster")))
        flow = flows.named(d.get("flow"))
        note = flow.unnamed_spared(d) if flow is not None else None
        if flow is not None and note is not None:
            self._unnamed[flow.name, note] = self._unnamed.get((flow.name, note), 0) + 1
        self.findings.extend(findings(self.pod, d))

    def finish(self) -> None:
        # Only worth saying when the pod might be a spared neighbour these records cannot name.
        if all(f.role == SURVIVOR for f in self.findings):
            for (flow, note), count in self._unnamed.items():
                self.notes.append(f"{count} {flow}-flow decision(s) {note}")

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


# ---- findings: what every flow shares; the rest is the record's flow's (engine.flows) ------


def _victim(pod: str, d: Mapping[str, Any], victim: Mapping[str, Any], base: dict[str, Any]) -> Finding:
    node = str(victim.get("node"))
    terminating = bool(victim.get("terminating"))
    action = str(victim.get("action"))
    others = [key_of(v) for v in as_list(d.get("victims")) if isinstance(v, dict) and key_of(v) != pod]
    facts: dict[str, Any] = {
        "uid": victim.get("uid"),
        "preemptor": d.get("preemptor"),
        "node": node,
        "action": action,
        "priority": victim.get("priority"),
        "terminating": terminating,
        "coVictims": others,
    }
    how = "already terminating: listed again, no new action" if terminating else f"action {action}"
    summary = f"preempted by {d.get('preemptor')} on {node} ({how})"
    told = flows.of_record(d).explain_victim(pod, d, victim)
    facts.update(told.facts)
    details = list(told.details)
    if others:
        details.append(f"evicted with it: {', '.join(others)}")
    if terminating:
        details.append(
            "it was already terminating (an earlier decision's victim), so its room was leaving anyway"
        )
    return Finding(role=VICTIM, summary=summary, details=details, facts=facts, **base)


def _survivor(pod: str, d: Mapping[str, Any], base: dict[str, Any]) -> Finding | None:
    told = flows.of_record(d).explain_survivor(pod, d)
    if told is None:
        return None
    summary = told.summary if told.summary is not None else f"spared by {d.get('preemptor')}"
    return Finding(role=SURVIVOR, summary=summary, details=told.details, facts=told.facts, **base)


def _preemptor(pod: str, d: Mapping[str, Any], base: dict[str, Any]) -> Finding:
    facts: dict[str, Any] = {
        "outcome": str(d.get("outcome")),
        "reason": str(d.get("reason")),
        "victims": victim_keys(d),
    }
    told = flows.of_record(d).explain_preemptor(pod, d)
    facts.update(told.facts)
    role = PREEMPTOR if pod == d.get("preemptor") else MEMBER
    summary = told.summary if told.summary is not None else f"{facts['outcome']}: {facts['reason']}"
    return Finding(role=role, summary=summary, details=told.details, facts=facts, **base)


def _is_preemptor(pod: str, d: Mapping[str, Any]) -> bool:
    return d.get("preemptor") == pod or flows.of_record(d).places(pod, d)


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
    victim = next((v for v in as_list(d.get("victims")) if isinstance(v, dict) and key_of(v) == pod), None)
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
