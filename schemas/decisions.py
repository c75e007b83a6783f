"""What makes a value a decision record (preemption.decisions): one validation for every reader.

decisions.schema.json is the contract: this module checks a record against the file itself
(schemas.validate), and adds what the file cannot say. A reader checks as deep as it relies
on the record:
- `chain_problem`: the members the hash chain reads (CHAIN_FIELDS, of the schema's types).
  `preemptctl audit verify` needs no more: any other damage is for the chain to name (an
  edited record is `edited`, not malformed: docs/audit.md);
- `schema_problem`: the envelope version and decisions.schema.json;
- `shape_problem`: beyond the schema, what acting on a record relies on: names the
  actuator puts in API paths are DNS-1123 (a victim named `..` made the client request
  another URL), strings it logs have no control characters, victims are unique, the
  explanation's members it reads are of the types it reads;
- `problem`: all three, in that order.
The actuator (streams.kube.actuator, `verify`) checks the schema before a record's hash and
signature and its shape after them, so a forged record is refused as forged; what the live
objects must be (the API server's answers) is the actuator's own check.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from schemas import VERSION, names, records, validate

# The schema file every decision record is checked against.
SCHEMA = "decisions.schema.json"
# What the hash chain reads of a record (schemas.chain, streams.audit.verify), in the order a
# problem names them.
CHAIN_FIELDS = ("id", "cluster", "prevHash", "hash", "seq")
# A record id's length at most (it names the record in logs, dead letters and outcomes).
MAX_ID_CHARS = 1024
# A uid (a UUID from the API server; tests use readable ones): visible ASCII, no spaces.
_UID = re.compile(r"[!-~]{1,253}\Z")
_dns_label = names.dns_label
_dns_subdomain = names.dns_subdomain
_label_value = names.label_value


def problem(record: Any) -> str | None:
    """Why `record` (parsed) is not a decision record the actuator may act on, or None."""
    return schema_problem(record) or shape_problem(record)


def chain_problem(record: dict[str, Any]) -> str | None:
    """Which of CHAIN_FIELDS are missing or not of the schema's type, as one line; or None."""
    bad = [name for name, kind in _chain_types() if not validate.is_type(record.get(name), kind)]
    return f"{', '.join(bad)} missing or mistyped" if bad else None


@functools.cache
def _chain_types() -> tuple[tuple[str, str], ...]:
    """Each of CHAIN_FIELDS with its type in the schema file (and nothing else of its schema)."""
    members = validate.load(SCHEMA)["properties"]
    return tuple((name, members[name]["type"]) for name in CHAIN_FIELDS)


def schema_problem(record: Any) -> str | None:
    """Why `record` (parsed) is not a JSON object of this envelope version that conforms to
    decisions.schema.json, or None."""
    if not isinstance(record, dict):
        return "record is not a JSON object"
    if record.get("v") != VERSION:
        return f"unsupported envelope version {_shown(record.get('v'))}"
    return validate.problem(record, validate.load(SCHEMA))


def shape_problem(record: dict[str, Any]) -> str | None:
    """What the actuator relies on beyond the schema, or None: names it puts in API paths are
    DNS-1123 (a victim named `..` made the client request another URL), strings it logs have
    no control characters, victims are unique, the fields it reads are of the types it reads.
    `record` must conform to the schema (schema_problem)."""
    problem = records.cluster_problem(record["cluster"])
    if problem:
        return problem
    if not _printable(record["id"], MAX_ID_CHARS):
        return f"id {_shown(record['id'])} is longer than {MAX_ID_CHARS} characters or has control characters"
    placements: dict[str, Any] = record.get("placements") or {}
    namespace, slash, name = record["preemptor"].partition("/")
    group = record.get("flow") == "job" and bool(placements)  # namespace/pod-group: a label value
    if not (slash and _dns_label(namespace) and (_label_value(name) if group else _dns_subdomain(name))):
        return f"preemptor {_shown(record['preemptor'])} is not namespace/name"
    if record["preemptorUid"] and not _uid(record["preemptorUid"]):
        return f"preemptorUid {_shown(record['preemptorUid'])} is not a uid"
    if "node" in record and not _dns_subdomain(record["node"]):
        return f"node {_shown(record['node'])} is not a node name"
    for member, node in placements.items():
        if not _pod_ref(member) or not _dns_subdomain(node):
            return f"placements: {_shown(member)} -> {_shown(node)} is not namespace/name -> node"
    member_uids = record.get("memberUids")
    if member_uids is not None:
        for member, uid in member_uids.items():
            if not _pod_ref(member) or not _uid(uid):
                return f"memberUids: {_shown(member)} -> {_shown(uid)} is not namespace/name -> uid"
    seen: set[str] = set()
    for i, victim in enumerate(record["victims"]):
        if not _dns_label(victim["namespace"]) or not _dns_subdomain(victim["name"]):
            return f"victims[{i}]: {_shown(victim['namespace'])}/{_shown(victim['name'])} is not a pod name"
        if not _uid(victim["uid"]):
            return f"victims[{i}].uid {_shown(victim['uid'])} is not a uid"
        if not _dns_subdomain(victim["node"]):
            return f"victims[{i}].node {_shown(victim['node'])} is not a node name"
        if victim["uid"] in seen:
            return f"victims[{i}]: uid {victim['uid']} named twice"
        seen.add(victim["uid"])
    return _explanation_problem(record["explanation"])


def _explanation_problem(explanation: dict[str, Any]) -> str | None:
    """The explanation's members the actuator reads (its Events: streams.kube.preemptor_events)."""
    members = explanation.get("members")
    if members is not None and not (isinstance(members, list) and all(_pod_ref(m) for m in members)):
        return "explanation.members must be a list of namespace/name"
    reasons = explanation.get("rejectedReasons")
    if reasons is not None and not (isinstance(reasons, dict) and all(_integer(n) for n in reasons.values())):
        return "explanation.rejectedReasons must map reasons to counts"
    for name in ("rejectedCount", "candidateCount"):
        if explanation.get(name) is not None and not _integer(explanation[name]):
            return f"explanation.{name} must be an integer"
    return None


def _uid(value: Any) -> bool:
    return isinstance(value, str) and _UID.match(value) is not None


def _pod_ref(value: Any) -> bool:
    namespace, slash, name = value.partition("/") if isinstance(value, str) else ("", "", "")
    return bool(slash) and _dns_label(namespace) and _dns_subdomain(name)


def _printable(value: str, limit: int) -> bool:
    return len(value) <= limit and value.isprintable()


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any, chars: int = 80) -> str:
    """repr(value), cut: a refusal names the value without copying a huge one or a control character."""
    if isinstance(value, dict | list):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= chars else text[:chars] + "..."
