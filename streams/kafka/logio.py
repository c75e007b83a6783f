"""Reading event logs and decision logs from JSONL files or Kafka topics (kafka://host:port/topic)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from schemas import records
from streams import topics, traces
from streams.errors import UsageError


def is_kafka(location: str) -> bool:
    return location.startswith("kafka://")


def read_events(location: str, *, on_bad: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every event of a log, in order, each with its `cluster`."""
    if not is_kafka(location):
        return traces.read(Path(location))
    bootstrap, topic = topics.parse_topic_url(location)

    async def collect() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        async for m in topics.read_all(bootstrap, topic):
            try:
                batch = records.decode_batch(m.value)
            except records.DecodeError as exc:
                if on_bad is not None:
                    on_bad(f"{topic}/{m.partition}@{m.offset}: {exc}")
                continue
            out.extend(dict(e, cluster=batch["cluster"]) for e in batch["events"])
        return out

    return asyncio.run(collect())


def read_decisions(location: str) -> list[dict[str, Any]]:
    if is_kafka(location):
        bootstrap, topic = topics.parse_topic_url(location)

        async def collect() -> list[dict[str, Any]]:
            return [
                orjson.loads(m.value) async for m in topics.read_all(bootstrap, topic, read_committed=True)
            ]

        return asyncio.run(collect())
    path = Path(location)
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"{path}:{number}: not JSON: {exc}") from exc
    return out


def write_jsonl(path: Path, items: list[Any]) -> None:
    with path.open("wb") as f:
        for item in items:
            f.write(orjson.dumps(item) + b"\n")
