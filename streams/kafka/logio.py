"""Logs as files or topics: event logs and decision logs from JSONL files or kafka://host:port/topic."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from schemas import records
from schemas.records import event_problem
from streams.common.errors import UsageError
from streams.kafka import connection

if TYPE_CHECKING:
    from streams.kafka import reading


def is_kafka(location: str) -> bool:
    return location.startswith("kafka://")


def read_events(
    location: str,
    *,
    on_bad: Callable[[str], None] | None = None,
    kafka: connection.KafkaConfig | None = None,
) -> list[dict[str, Any]]:
    """Every event of a log, in order, each with its `cluster`.

    From a topic, what the worker would dead-letter is left out the same way: a
    record that does not decode or whose key is not its envelope's cluster, and
    each event that is not event-shaped (the rest of its record is kept). Leaving a
    rejected event out folds to the same result as rejecting it, since a rejected
    event changes nothing (fold.controller).
    """
    if not is_kafka(location):
        return read_trace(Path(location))
    from streams.kafka import reading  # the Kafka client only for a topic: a file needs none

    config, topic = reading.topic_config(location, kafka)

    async def collect() -> list[dict[str, Any]]:
        return events_of([m async for m in reading.read_all(config, topic)], topic=topic, on_bad=on_bad)

    return asyncio.run(collect())


def events_of(
    messages: Iterable[reading.Message], *, topic: str, on_bad: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """The events of cluster-events records, each with its `cluster`, as the worker takes them."""
    out: list[dict[str, Any]] = []
    for m in messages:
        where = f"{topic}/{m.partition}@{m.offset}"
        try:
            batch = records.decode_envelope(m.value)
            problem = records.key_problem(m.key, batch)
        except records.DecodeError as exc:
            problem = str(exc)
        if problem:
            if on_bad is not None:
                on_bad(f"{where}: {problem}")
            continue
        for i, event in enumerate(batch["events"]):
            problem = event_problem(event)
            if problem:
                if on_bad is not None:
                    on_bad(f"{where}[{i}]: {problem}")
                continue
            out.append(dict(event, cluster=batch["cluster"]))
    return out


def read_decisions(location: str, *, kafka: connection.KafkaConfig | None = None) -> list[dict[str, Any]]:
    """Every record of a decision log (JSONL or a topic), in order; UsageError naming the first
    record that is not a decision (not JSON, not an object, no string `id` and `hash`)."""
    if is_kafka(location):
        from streams.kafka import reading  # the Kafka client only for a topic: a file needs none

        config, topic = reading.topic_config(location, kafka)

        async def collect() -> list[dict[str, Any]]:
            return [
                _decision(m.value, f"{topic}/{m.partition}@{m.offset}")
                async for m in reading.read_all(config, topic, read_committed=True)
            ]

        return asyncio.run(collect())
    path = Path(location)
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    return [_decision(line, f"{path}:{number}") for number, line in enumerate(lines, 1) if line.strip()]


def _decision(raw: bytes, where: str) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON: {exc}") from exc
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("id"), str)
        or not isinstance(value.get("hash"), str)
    ):
        raise UsageError(f"{where}: not a decision record (a decision has a string id and hash)")
    return value


def write_jsonl(path: Path, items: Iterable[Any]) -> int:
    """Write items one JSON document per line (a trace, an event log, decisions); the count written."""
    n = 0
    with path.open("wb") as f:
        for item in items:
            f.write(orjson.dumps(item) + b"\n")
            n += 1
    return n


def read_trace(path: Path) -> list[dict[str, Any]]:
    """A JSONL trace; UsageError naming the first bad line."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    events = []
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise UsageError(f"{path}:{number}: not JSON: {exc}") from exc
            problem = event_problem(event)
            if problem:
                raise UsageError(f"{path}:{number}: {problem}")
            events.append(event)
    return events
