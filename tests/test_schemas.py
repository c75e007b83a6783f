"""The JSON Schema files stay in step with the typed records in schemas.records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import chain, records

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
