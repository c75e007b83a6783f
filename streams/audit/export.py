"""`preemptctl export kafka://host:port/topic`: a topic as a JSONL file, to archive or replay anywhere.

This module owns turning a topic into the JSONL forms the rest of the tools read:
- cluster-events records (batches) become a trace, one event per line with its
  `cluster` (docs/case-format.md, traces), in log order: `preemptctl replay` of the file
  re-derives the recorded decisions, without Kafka;
- decision and eviction records are written one per line, byte for byte as they
  are in the topic, so `audit verify` of the file checks the same bytes.

The kind is told by the first record's shape, not by the topic's name (topics
can be renamed). Records that do not fit it are skipped with a warning on stderr,
never silently. With `--out`, the file appears only once the export is complete:
a half-written export must not pass for an archive of the whole log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import IO

import orjson
from aiokafka.errors import KafkaError

from schemas import records
from streams.audit import verify
from streams.common.errors import UsageError
from streams.kafka import connection, reading

EVENTS, RECORDS = "events", "records"
# Progress is redrawn at most this often (and only on a terminal).
PROGRESS_INTERVAL_S = 0.25


class Exporter:
    """Writes one topic's records as JSONL lines and counts what it did."""

    def __init__(self, out: IO[bytes], *, cluster: str | None, label: str) -> None:
        self.out = out
        self.cluster = cluster
        self.label = label
        self.kind: str | None = None
        self.read = 0  # records read from the topic
        self.lines = 0  # lines written
        self.skipped: list[str] = []
        self._shown = 0.0
        self._tty = sys.stderr.isatty()

    def add(self, where: str, value: bytes, key: bytes | None = None) -> None:
        self.read += 1
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            self._skip(where, f"not JSON ({exc})")
            return
        kind = EVENTS if isinstance(parsed, dict) and "events" in parsed else RECORDS
        if self.kind is None:
            self.kind = kind
        elif kind != self.kind:
            self._skip(where, f"a {kind} record in a topic of {self.kind}")
            return
        if kind == EVENTS:
            self._events(where, value, key)
        elif self.cluster is None or (isinstance(parsed, dict) and parsed.get("cluster") == self.cluster):
            # The topic's bytes unchanged, so an audit of the file checks what the topic holds;
            # only a value spread over several lines (never written by preemptctl) is re-encoded.
            line = value.strip()
            self.out.write((orjson.dumps(parsed) if b"\n" in line else line) + b"\n")
            self.lines += 1
        self._tick()

    def _events(self, where: str, value: bytes, key: bytes | None) -> None:
        # What the worker dead-letters (a record, or one event of it) is left out, and the
        # worker decides without it; so does replay of the export (streams.kafka.logio).
        try:
            batch = records.decode_envelope(value)
        except records.DecodeError as exc:
            self._skip(where, str(exc))
            return
        problem = records.key_problem(key, batch)
        if problem:
            self._skip(where, problem)
            return
        if self.cluster is not None and batch["cluster"] != self.cluster:
            return
        for i, event in enumerate(batch["events"]):
            problem = records.event_problem(event)
            if problem:
                self._skip(f"{where} event {i}", problem)
                continue
            self.out.write(orjson.dumps({**event, "cluster": batch["cluster"]}) + b"\n")
            self.lines += 1

    def _skip(self, where: str, why: str) -> None:
        self.skipped.append(f"{where}: {why}")
        # Over the progress line on a terminal; a plain line in a log.
        print(f"{chr(13) if self._tty else ''}skipped {self.label} {where}: {why}", file=sys.stderr)

    def _tick(self) -> None:
        now = time.monotonic()
        if self._tty and now - self._shown >= PROGRESS_INTERVAL_S:
            self._shown = now
            sys.stderr.write(f"\rexport {self.label}: {self.read:,} records, {self.lines:,} lines")
            sys.stderr.flush()

    def close_progress(self) -> None:
        if self._tty and self._shown:
            sys.stderr.write("\r" + " " * 70 + "\r")


def export(
    location: str, out: IO[bytes], *, cluster: str | None, kafka: connection.KafkaConfig | None = None
) -> Exporter:
    config, topic = reading.topic_config(location, kafka)
    verify.quiet_client_logs()
    exporter = Exporter(out, cluster=cluster, label=topic)

    async def read() -> None:
        # read_committed: on Kafka, records of aborted transactions are not part of the log.
        async for m in reading.read_all(config, topic, read_committed=True):
            exporter.add(f"partition {m.partition} offset {m.offset}", m.value, m.key)

    try:
        asyncio.run(read())
    except BrokenPipeError:
        raise  # stdout closed by the reader (`| head`): not a problem with the topic
    except (KafkaError, OSError) as exc:
        raise UsageError(f"cannot read {location}: {exc}") from exc
    finally:
        exporter.close_progress()
    return exporter


def cmd(args: argparse.Namespace) -> int:
    if not args.topic.startswith("kafka://"):
        raise UsageError(f"export reads a topic: expected kafka://host:port/topic, got {args.topic}")
    kafka = connection.for_locations(args)
    reading.topic_config(args.topic, kafka)  # a bad URL or config fails before any file is created
    started = time.perf_counter()
    if args.out:
        target = Path(args.out)
        partial = target.with_name(target.name + ".partial")
        try:
            handle = partial.open("wb")
        except OSError as exc:
            raise UsageError(f"{target}: {exc.strerror or exc}") from exc
        try:
            with handle:
                result = export(args.topic, handle, cluster=args.cluster, kafka=kafka)
            os.replace(partial, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
    else:
        try:
            result = export(args.topic, sys.stdout.buffer, cluster=args.cluster, kafka=kafka)
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            # The reader has all it wanted; keep Python from complaining again when it flushes at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    what = "events" if result.kind == EVENTS else "records"
    scope = f" (cluster {args.cluster})" if args.cluster else ""
    target_note = f" to {args.out}" if args.out else ""
    skipped = f", {len(result.skipped)} skipped" if result.skipped else ""
    print(
        f"exported {result.lines} {what} from {result.read} record(s) of {result.label}{scope}{target_note} "
        f"in {time.perf_counter() - started:.2f}s{skipped}",
        file=sys.stderr,
    )
    return 0
