"""The CloudEvents headers of every record, read back by the CloudEvents SDK's Kafka binding (not our code).

What a CloudEvents consumer relies on: the SDK accepts the headers as a valid
1.0 event in binary content mode, the attributes name what docs/topics.md says
(id, source, type, time, subject, dataschema, partitionkey), the data is the
plain record, and the headers are a pure function of what is written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from schemas import cloudevent, records
from streams.sim import traces
from tests.support import audit_traces

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
ORIGIN = [
    ("origin-topic", b"preemption.cluster-events"),
    ("origin-partition", b"0"),
    ("origin-offset", b"9"),
    ("error-class", b"BadEvent"),
    ("error", b"events[2]: unknown event type 'BOOM'"),
]


def read(headers: list[tuple[str, bytes]], key: bytes | None, value: bytes) -> BaseCloudEvent:
    """What a consumer gets from the SDK's Kafka binding for this message (validation included)."""
    return ce_kafka.from_binary(
        ce_kafka.KafkaMessage(headers=dict(headers), key=key, value=value), JSONFormat(), CloudEvent
    )


def example_decisions() -> list[dict[str, Any]]:
    return [dict(d) for d in audit_traces.decisions(traces.example())]


def outcome(decision: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "decisionId": decision["id"],
        "cluster": decision["cluster"],
        "victim": decision["victims"][0],
        "action": decision["victims"][0]["action"],
        "result": "done",
        "attempts": 1,
        "ts": "2026-01-01T00:00:10.250000Z",
        **extra,
    }


def test_a_decision_is_a_typed_event_whose_id_is_the_decision_id() -> None:
    for d in example_decisions():
        event = read(cloudevent.decision_headers(d), d["cluster"].encode(), records.encode(d))
        assert (event.get_id(), event.get_type(), event.get_specversion()) == (
            d["id"],
            "io.preemptctl.decision.v1",
            "1.0",
        )
        assert event.get_source() == "/preemptctl/clusters/default"
        assert event.get_subject() == d["preemptor"]
        assert event.get_time() == datetime.fromisoformat(d["ts"]).astimezone(UTC)
        assert event.get_dataschema() == "https://preemptctl.dev/schemas/v1/decisions.json"
        assert event.get_datacontenttype() == "application/json"
        assert event.get_extension("partitionkey") == d["cluster"]
        assert event.get_data() == d  # the value is the plain record


def test_an_outcome_is_one_event_per_decision_and_victim_and_a_dry_run_is_another() -> None:
    d = next(d for d in example_decisions() if d["outcome"] == "preempt")
    real = outcome(d)
    event = read(cloudevent.eviction_headers(real), real["victim"]["uid"].encode(), records.encode(real))
    assert event.get_id() == f"{d['id']}/{real['victim']['uid']}"
    assert event.get_type() == "io.preemptctl.eviction.v1"
    assert event.get_subject() == f"{real['victim']['namespace']}/{real['victim']['name']}"
    assert event.get_time() == datetime(2026, 1, 1, 0, 0, 10, 250000, tzinfo=UTC)
    assert event.get_dataschema() == "https://preemptctl.dev/schemas/v1/evictions.json"
    assert event.get_extension("partitionkey") == real["victim"]["uid"]
    dry = outcome(d, dryRun=True)
    # Same source and id would let a consumer drop the real outcome as a duplicate of the dry run's.
    assert read(cloudevent.eviction_headers(dry), None, records.encode(dry)).get_id() != event.get_id()


def test_dataschema_names_the_schema_files_ids() -> None:
    for kind, name in (("decision", "decisions.schema.json"), ("eviction", "evictions.schema.json")):
        assert cloudevent.dataschema(kind, 1) == json.loads((SCHEMAS / name).read_text())["$id"]


def test_headers_are_a_pure_function_of_the_record() -> None:
    d = example_decisions()[0]
    reordered = dict(reversed(list(d.items())))  # as a different encoder might hand it over
    assert cloudevent.decision_headers(d) == cloudevent.decision_headers(reordered)
    assert dict(cloudevent.decision_headers(d))["ce_time"] == d["ts"].encode()  # the log's time
    later = dict(d, ts="2026-01-01T01:00:00Z")
    assert dict(cloudevent.decision_headers(later))["ce_time"] == b"2026-01-01T01:00:00Z"


def test_header_names_follow_the_kafka_binding() -> None:
    d = example_decisions()[0]
    names = [n for n, _ in cloudevent.decision_headers(d)]
    assert names == [
        "ce_specversion",
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_time",
        "ce_subject",
        "ce_dataschema",
        "ce_partitionkey",
        "content-type",
    ]


def test_a_cluster_name_is_one_uri_path_segment() -> None:
    assert cloudevent.source("eu west/1") == "/preemptctl/clusters/eu%20west%2F1"


def test_a_rejected_event_keeps_its_time_and_position() -> None:
    event_bytes = b'{"ts":"2026-01-01T00:05:40Z","type":"BOOM"}'
    origin = [*ORIGIN, ("origin-index", b"2")]
    event = read(cloudevent.dead_letter_headers(b"default", event_bytes, origin), b"default", event_bytes)
    assert event.get_id() == "preemption.cluster-events/0/9/2"
    assert event.get_type() == "io.preemptctl.deadletter.v1"
    assert event.get_source() == "/preemptctl/clusters/default"
    assert event.get_subject() == "preemption.cluster-events"
    assert event.get_time() == datetime(2026, 1, 1, 0, 5, 40, tzinfo=UTC)
    assert event.get_datacontenttype() == "application/json"
    assert event.get_dataschema() is None  # the bytes are whatever was rejected
    assert event.get_data() == {"ts": "2026-01-01T00:05:40Z", "type": "BOOM"}


@pytest.mark.parametrize(
    ("key", "value", "source", "content_type"),
    [
        (b"default", b"\x00\xffnot json", "/preemptctl/clusters/default", "application/octet-stream"),
        (None, b'{"v": 9}', "/preemptctl", "application/json"),  # no key: no cluster to name
        (b"\xff", b'{"ts": "2026-13-01T00:00:00Z"}', "/preemptctl", "application/json"),  # no valid time
    ],
)
def test_a_rejected_record_without_cluster_or_time(
    key: bytes | None, value: bytes, source: str, content_type: str
) -> None:
    headers = dict(cloudevent.dead_letter_headers(key, value, ORIGIN))
    assert "ce_time" not in headers  # never the wall clock: a replay must dead-letter identically
    assert headers["ce_source"].decode() == source
    assert headers["content-type"].decode() == content_type
    assert ("ce_partitionkey" in headers) == (key == b"default")
    raw = ce_kafka.from_binary(
        ce_kafka.KafkaMessage(headers=headers, key=None, value=value), JSONFormat(), CloudEvent
    )
    assert raw.get_id() == "preemption.cluster-events/0/9"
