"""The JSON Schema files stay in step with the typed records in schemas.records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import chain, decisions, records

HERE = Path(records.__file__).parent


def _schema(name: str) -> dict[str, Any]:
    return json.loads((HERE / f"{name}.schema.json").read_text())


@pytest.mark.parametrize(
    ("name", "typed"),
    [
        ("cluster-events", records.ClusterEventBatch),
        ("decisions", records.DecisionRecord),
        ("evictions", records.EvictionRecord),
    ],
)
def test_schema_fields_match_typed_record(name: str, typed: Any) -> None:
    schema = _schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["required"]) == set(typed.__required_keys__)
    assert set(schema["properties"]) == set(typed.__required_keys__) | set(typed.__optional_keys__)


def test_victim_and_event_shapes_match() -> None:
    victim = _schema("decisions")["properties"]["victims"]["items"]
    assert set(victim["required"]) == set(records.VictimRecord.__required_keys__)
    assert set(victim["properties"]) == set(records.VictimRecord.__annotations__)
    event = _schema("cluster-events")["properties"]["events"]["items"]
    assert set(event["properties"]) == set(records.ClusterEvent.__annotations__)
    assert event["properties"]["type"]["enum"] == list(records.EVENT_TYPES)
    assert _schema("evictions")["properties"]["result"]["enum"] == list(records.EVICTION_RESULTS)
    assert _schema("dead-letter-headers")["required"] == list(records.DEAD_LETTER_HEADERS)


def test_decode_batch_reasons() -> None:
    good = {"v": 1, "cluster": "c", "events": [{"ts": "2026-01-01T00:00:00Z", "type": "TICK"}]}
    assert records.decode_batch(records.encode(good))["cluster"] == "c"
    jsonschema.validate(good, _schema("cluster-events"))
    for bad, why in [
        (b"\xff\x00", "not JSON"),
        (records.encode({"v": 9, "cluster": "c", "events": []}), "version"),
        (records.encode({**good, "events": [{"ts": "x", "type": "BOOM"}]}), "unknown event type"),
        (records.encode({**good, "events": [{"ts": "x", "type": "ADDED"}]}), "without object"),
    ]:
        with pytest.raises(records.DecodeError, match=why):
            records.decode_batch(bad)


def test_every_writer_writes_the_same_envelope() -> None:
    """One envelope builder (records.batch), and the bytes a writer that encodes events one by one
    frames with it (the source's Publisher) are the builder's, key order included."""
    events: list[Any] = [
        {"ts": "2026-01-01T00:00:00Z", "type": "RESYNC", "scope": {"schedulerNames": ["s"]}},
        {"ts": "2026-01-01T00:00:01Z", "type": "TICK"},
    ]
    for cluster in ("c", "prod-eu1", '名前/"q"'):
        by_hand = orjson.dumps({"v": 1, "cluster": cluster, "events": events})
        assert records.encode_batch(cluster, events) == by_hand
        head, tail = records.batch_frame(cluster)
        assert head + b",".join(orjson.dumps(e) for e in events) + tail == by_hand
        assert head + orjson.dumps(events[0]) + tail == records.encode_batch(cluster, events[:1])
        assert records.decode_batch(by_hand) == records.batch(cluster, events)


def _decision(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "v": 1,
        "id": "c/7/p-uid",
        "cluster": "c",
        "seq": 7,
        "ts": "2026-01-01T00:00:00Z",
        "flow": "default",
        "preemptor": "default/p",
        "preemptorUid": "p-uid",
        "outcome": "preempt",
        "node": "n1",
        "victims": [
            {
                "uid": "v-uid",
                "namespace": "default",
                "name": "v",
                "node": "n1",
                "priority": 1,
                "action": "delete",
            }
        ],
        "reason": "r",
        "explanation": {},
        "configHash": "h",
        "engineVersion": "0",
        **changes,
    }
    return chain.seal(record, chain.GENESIS)


def test_a_decision_record_is_checked_in_one_place() -> None:
    """schemas.decisions: the chain's members for the audit, the schema and then the shape for the
    actuator; each reason names what is wrong."""
    good = _decision()
    assert decisions.problem(good) is None and decisions.chain_problem(good) is None
    jsonschema.validate(good, _schema("decisions"))
    assert decisions.schema_problem([good]) == "record is not a JSON object"
    assert decisions.schema_problem({**good, "v": 2}) == "unsupported envelope version 2"
    assert decisions.schema_problem({**good, "flow": "other"}) is not None
    assert (
        decisions.problem(_decision(preemptor="default/a\nb"))
        == "preemptor 'default/a\\nb' is not namespace/name"
    )
    twice = _decision(victims=[good["victims"][0], good["victims"][0]])
    assert decisions.problem(twice) == "victims[1]: uid v-uid named twice"
    # The audit reads no more than the chain does: a record off the schema is still chained.
    assert decisions.chain_problem({**good, "flow": "other"}) is None
    assert decisions.chain_problem({"id": "x", "hash": 1, "seq": "7"}) == (
        "cluster, prevHash, hash, seq missing or mistyped"
    )
    assert decisions.chain_problem({**good, "seq": True}) == "seq missing or mistyped"


def test_chain_detects_edits() -> None:
    r1 = chain.seal({"id": "a", "x": 1}, chain.GENESIS)
    r2 = chain.seal({"id": "b", "x": 2}, r1["hash"], key=b"k")
    assert r2["prevHash"] == r1["hash"] and chain.verify_signature(b"k", r2)
    assert not chain.verify_signature(b"other", r2)
    assert chain.digest(r1["prevHash"], {**r1, "x": 5}) != r1["hash"]


def _label_by_hand(value: str) -> bool:
    """RFC 1123 label, spelled out character by character (the reference for the regexes)."""
    alnum = set("abcdefghijklmnopqrstuvwxyz0123456789")
    return (
        0 < len(value) <= 63
        and value[0] in alnum
        and value[-1] in alnum
        and all(c in alnum or c == "-" for c in value)
    )


_NAME_CHARS = st.text(alphabet="ab9-.A_\n/é", max_size=12) | st.text(max_size=300)


@given(namespace=_NAME_CHARS, name=_NAME_CHARS)
def test_object_names_are_accepted_exactly_when_the_api_server_would_store_them(
    namespace: str, name: str
) -> None:
    pod = {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": "u"}}
    name_ok = not name or (len(name) <= 253 and all(_label_by_hand(part) for part in name.split(".")))
    namespace_ok = not namespace or _label_by_hand(namespace)
    problem = records.object_problem(pod)
    if len(name.encode()) > records.MAX_NAME_BYTES or len(namespace.encode()) > records.MAX_NAME_BYTES:
        assert problem is not None and "longer than" in problem
    elif name_ok and namespace_ok:
        assert problem is None
    else:
        assert problem is not None and "DNS-1123" in problem
        assert "\n" not in problem  # the reason is logged and put in a header: one line
