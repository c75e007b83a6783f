"""CloudEvents 1.0 attributes of every record preemptctl writes, as Kafka headers (binary content mode).

This module owns the mapping from a record to its CloudEvents Kafka protocol
binding headers (`ce_*` plus `content-type`), for preemption.decisions,
preemption.evictions and preemption.dead-letter. The value stays the plain
record, so consumers that ignore headers see no change; consumers that speak
CloudEvents (Knative's KafkaSource, Argo Events, the SDKs' Kafka bindings) get
typed, routable events.

Every header is a pure function of what is written (the record, or a dead
letter's key, bytes and origin headers): no clock, no host, no counter. `time`
is the record's own `ts` (the log's time), so a replayed log carries
byte-identical headers. docs/topics.md is the reference for the values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

import orjson

SPECVERSION = "1.0"
JSON = "application/json"
OCTETS = "application/octet-stream"
# `source`: a URI-reference naming the cluster the record is about.
SOURCE_PREFIX = "/preemptctl/clusters/"
# A dead letter whose key does not name a cluster (missing, empty, not UTF-8, longer than a
# DNS subdomain, as every cluster name is) comes from preemptctl at large.
CLUSTER_MAX_BYTES = 253
SOURCE_UNKNOWN = "/preemptctl"
# `type` is versioned by the record's envelope version `v` (docs/topics.md, compatibility policy).
TYPE_PREFIX = "io.preemptctl."
DECISION, EVICTION, DEAD_LETTER = "decision", "eviction", "deadletter"
# The `$id` of each JSON Schema in schemas/ (tests/test_cloudevent.py keeps them equal), by envelope version.
SCHEMA_BASE = "https://preemptctl.dev/schemas/v{v}/"
SCHEMA_FILES = {DECISION: "decisions.json", EVICTION: "evictions.json"}
# The dead-letter headers describe the rejected bytes; those are the first version of that contract.
DEAD_LETTER_VERSION = 1
# RFC 3339 (CloudEvents `time`): a rejected value's `ts` is only carried over when it is one.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")

Headers = list[tuple[str, bytes]]


def source(cluster: str) -> str:
    # Percent-encoded as one path segment, so any cluster name stays one valid URI-reference.
    return SOURCE_PREFIX + quote(cluster, safe="")


def event_type(kind: str, version: int) -> str:
    return f"{TYPE_PREFIX}{kind}.v{version}"


def dataschema(kind: str, version: int) -> str:
    return SCHEMA_BASE.format(v=version) + SCHEMA_FILES[kind]


def _headers(
    *,
    id: str,
    source: str,
    type: str,
    time: str | None,
    subject: str,
    dataschema: str | None,
    partitionkey: str | None,
    content_type: str,
) -> Headers:
    # One fixed order, so equal attributes are equal bytes on the wire.
    attributes = (
        ("ce_specversion", SPECVERSION),
        ("ce_id", id),
        ("ce_source", source),
        ("ce_type", type),
        ("ce_time", time),
        ("ce_subject", subject),
        ("ce_dataschema", dataschema),
        # The Partitioning extension names the record's key (the binding's key mapping, §3.1):
        # a mapper must not drop it, so it travels as a header too.
        ("ce_partitionkey", partitionkey),
        ("content-type", content_type),
    )
    return [(name, value.encode()) for name, value in attributes if value]


def decision_headers(record: Mapping[str, Any]) -> Headers:
    """A decision: id is the decision id, subject the preemptor (or job), key and source the cluster."""
    version = int(record["v"])
    return _headers(
        id=str(record["id"]),
        source=source(str(record["cluster"])),
        type=event_type(DECISION, version),
        time=str(record["ts"]),
        subject=str(record["preemptor"]),
        dataschema=dataschema(DECISION, version),
        partitionkey=str(record["cluster"]),
        content_type=JSON,
    )


def eviction_id(record: Mapping[str, Any]) -> str:
    """Decision id + victim uid: one outcome per pair. A dry run's outcome is a different event."""
    base = f"{record['decisionId']}/{record['victim']['uid']}"
    return base + "/dry-run" if record.get("dryRun") else base


def eviction_headers(record: Mapping[str, Any]) -> Headers:
    """An actuator outcome: subject the victim, key the victim uid (the topic's key)."""
    version = int(record["v"])
    victim = record["victim"]
    return _headers(
        id=eviction_id(record),
        source=source(str(record["cluster"])),
        type=event_type(EVICTION, version),
        time=str(record["ts"]),
        subject=f"{victim['namespace']}/{victim['name']}",
        dataschema=dataschema(EVICTION, version),
        partitionkey=str(victim["uid"]),
        content_type=JSON,
    )


def dead_letter_headers(key: bytes | None, value: bytes, origin: Sequence[tuple[str, bytes]]) -> Headers:
    """A dead letter's CloudEvents attributes, from its key, its rejected bytes and its origin headers.

    id is the origin's position (topic/partition/offset, plus /index for one event of a
    batch): stable across replays and unique, since a position is rejected once per stage.
    subject is the origin topic; there is no dataschema (the bytes are whatever was
    rejected), and `time` only when the rejected value carries a valid RFC 3339 `ts`.
    """
    found = {name: raw.decode("utf-8", "replace") for name, raw in origin}
    position = "/".join(found[h] for h in ("origin-topic", "origin-partition", "origin-offset"))
    if "origin-index" in found:
        position += "/" + found["origin-index"]
    cluster = _text(key)
    parsed = _json(value)
    return _headers(
        id=position,
        source=source(cluster) if cluster else SOURCE_UNKNOWN,
        type=event_type(DEAD_LETTER, DEAD_LETTER_VERSION),
        time=_ts(parsed),
        subject=found["origin-topic"],
        dataschema=None,
        partitionkey=cluster,
        content_type=JSON if parsed is not _NOT_JSON else OCTETS,
    )


_NOT_JSON = object()


def _json(value: bytes) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _ts(parsed: Any) -> str | None:
    ts = parsed.get("ts") if isinstance(parsed, dict) else None
    if not isinstance(ts, str) or not _RFC3339.fullmatch(ts):
        return None
    try:
        datetime.fromisoformat(ts.upper())  # the shape alone lets through a 13th month
    except ValueError:
        return None
    return ts


def _text(key: bytes | None) -> str | None:
    if not key or len(key) > CLUSTER_MAX_BYTES:
        return None  # no cluster's name: nothing to repeat in source and partitionkey
    try:
        return key.decode()
    except UnicodeDecodeError:
        return None
