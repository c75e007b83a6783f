"""The audit tools against real topics on the embedded broker: export, verify, replay, explain, consume.

A recorded run is put on the topics as the pipeline writes it (the full event log,
reactions included, to cluster-events keyed by cluster; the decision records to
decisions): the exports must replay to exactly those decisions anywhere, and the
decisions topic must verify as is. Records that would upset other tests' readers
of the shared topics (tampered, malformed) go to fresh topics only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from fold import fleet
from schemas import records
from streams.cli import main
from streams.kafka import topics
from streams.sim import traces
from tests.integration import pipeline
from tests.support import audit_traces

ROOT = Path(__file__).resolve().parents[2]


def _cluster() -> str:
    return f"audit-{uuid.uuid4().hex[:8]}"


async def _produce(bootstrap: str, topic: str, values: list[tuple[bytes, bytes]]) -> None:
    await topics.ensure_topics(bootstrap, [topics.TopicSpec(topic)])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for key, value in values:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def recorded(tansu_broker: str) -> tuple[str, fleet.Result]:
    """A run of the example and reprieve stories, recorded on the shared topics under a fresh cluster."""
    cluster = _cluster()
    trace = pipeline.with_cluster(audit_traces.reprieve() + traces.example(), cluster)
    result = audit_traces.simulate(trace)
    asyncio.run(pipeline.produce(tansu_broker, cluster, result.log, per_record=7))
    decisions = [(cluster.encode(), orjson.dumps(d)) for d in result.decisions]
    asyncio.run(_produce(tansu_broker, records.DECISIONS, decisions))
    return cluster, result


def test_export_then_replay_reproduces_the_decisions(
    tansu_broker: str, recorded: tuple[str, fleet.Result], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, result = recorded
    url = f"kafka://{tansu_broker}"
    events, decisions = tmp_path / "events.jsonl", tmp_path / "decisions.jsonl"
    code, out, err = _run(
        capsys, "export", f"{url}/{records.CLUSTER_EVENTS}", "--cluster", cluster, "--out", str(events)
    )
    assert (code, out) == (0, "")
    assert f"exported {len(result.log)} events" in err
    exported = [orjson.loads(line) for line in events.read_bytes().splitlines()]
    assert exported == result.log  # every event, in order, each with its cluster
    code, _, _ = _run(
        capsys, "export", f"{url}/{records.DECISIONS}", "--cluster", cluster, "--out", str(decisions)
    )
    assert code == 0
    assert decisions.read_bytes() == b"".join(orjson.dumps(d) + b"\n" for d in result.decisions)

    code, out, err = _run(capsys, "replay", str(events), "--compare", str(decisions))
    assert (code, out) == (0, "") and "0 decision(s) differ" in err
    code, out, _ = _run(capsys, "audit", "verify", str(decisions))
    assert code == 0 and out.startswith(f"intact: {len(result.decisions)} record(s), 1 cluster(s)")


def test_verify_and_explain_read_the_topic(
    tansu_broker: str, recorded: tuple[str, fleet.Result], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, result = recorded
    topic = f"kafka://{tansu_broker}/{records.DECISIONS}"
    code, out, _ = _run(capsys, "audit", "verify", topic, "--cluster", cluster)
    assert code == 0, out
    assert f"{cluster} head {result.decisions[-1]['hash']} ({len(result.decisions)} records" in out
    code, out, _ = _run(
        capsys, "explain", "default/c", "--decisions", topic, "--cluster", cluster, "--output", "json"
    )
    answer = orjson.loads(out)
    assert code == 0 and [f["decision"] for f in answer["findings"]] == [f"{cluster}/9/p-uid"]


def test_verify_names_a_tampered_record_by_partition_and_offset(
    tansu_broker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"test.audit.{uuid.uuid4().hex[:8]}"
    decisions = audit_traces.decisions(traces.example())
    decisions[5]["victims"] = []  # someone "undoes" a preemption in the log
    asyncio.run(_produce(tansu_broker, topic, [(b"default", orjson.dumps(d)) for d in decisions]))
    code, out, _ = _run(capsys, "audit", "verify", f"kafka://{tansu_broker}/{topic}")
    assert code == 1
    assert out.startswith(
        f"FAILED at partition 0 offset 5 (id {decisions[5]['id']}, cluster default): edited"
    )


def _consumer_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "preemptctl_example_consumer", ROOT / "examples" / "consumer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_example_consumer_validates_records_from_a_topic(tansu_broker: str) -> None:
    consumer = _consumer_module()
    evictions, decisions = (f"test.consumer.{uuid.uuid4().hex[:8]}.{k}" for k in ("evictions", "decisions"))
    decision = audit_traces.decisions(traces.example())[0]
    good: dict[str, Any] = {
        "v": 1,
        "decisionId": decision["id"],
        "cluster": "default",
        "victim": decision["victims"][0],
        "action": "delete",
        "result": "done",
        "attempts": 1,
        "ts": decision["ts"],
    }
    sent = [
        good,
        dict(good, futureField={"added": "in a later v1"}),  # forward compatible: accepted
        dict(good, v=2),  # unknown envelope version: rejected
        {k: v for k, v in good.items() if k != "result"},  # schema violation: rejected
    ]
    uid = good["victim"]["uid"].encode()
    asyncio.run(_produce(tansu_broker, evictions, [(uid, orjson.dumps(r)) for r in sent] + [(uid, b"{oops")]))
    asyncio.run(_produce(tansu_broker, decisions, [(b"default", orjson.dumps(decision))]))
    out, err = io.StringIO(), io.StringIO()
    stats = asyncio.run(
        consumer.consume(
            tansu_broker,
            {evictions: "evictions", decisions: "decisions"},
            consumer.load_validators(ROOT / "schemas"),
            from_beginning=True,
            idle_exit=1.0,
            out=out,
            err=err,
        )
    )
    assert (stats.valid, stats.rejected, stats.by_kind) == (3, 3, {"evictions": 2, "decisions": 1})
    lines = out.getvalue().splitlines()
    assert sum(line.startswith("eviction default/ex1-a on ex1-node: delete -> done") for line in lines) == 2
    assert (
        f"decision {decision['id']}: default/ex1-c preempt on ex1-node; victims: default/ex1-a, default/ex1-b"
        in (lines)
    )
    rejected = err.getvalue().splitlines()
    assert [r.split(": ", 1)[1] for r in rejected] == [
        "unsupported envelope version v=2 (this consumer knows 1)",
        "schema: (record): 'result' is a required property",
        rejected[2].split(": ", 1)[1],
    ]
    assert rejected[2].startswith(f"rejected {evictions}[0]@4: not JSON")
