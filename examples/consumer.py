"""An example downstream consumer of preemptctl's topics: evictions (and optionally decisions).

It shows what a consumer outside this project needs, and nothing more: a plain
aiokafka consumer, the CloudEvents SDK's Kafka binding, the JSON Schema files
from `schemas/` (docs/topics.md) and the compatibility rules:
- every record carries CloudEvents 1.0 headers (binary content mode): the SDK
  reads them into an event, and the event's `type` (io.preemptctl.decision.v1,
  io.preemptctl.eviction.v1) says what the record is, whatever topic it came
  from; records without them (written before preemptctl added them) are taken
  to be what their topic holds;
- the envelope version `v` is checked first: a version this consumer does not
  know is rejected (a breaking change ships as v2; upgrade the consumer first);
- every record is validated against its topic's JSON Schema;
- unknown fields are accepted and ignored: within v1, fields are only added,
  so a newer producer never breaks an older consumer.

Run it next to `preemptctl run --broker ...` or a deployed pipeline:

    python examples/consumer.py --broker kafka://127.0.0.1:9092 --decisions --from-beginning

Valid records are printed one per line on stdout (or as JSON with --json);
rejected ones are reported on stderr with their position and the reason, and
the consumer carries on, as a long-running consumer should.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import jsonschema  # type: ignore[import-untyped]
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

SUPPORTED_VERSIONS = frozenset({1})
# CloudEvents `type` -> record kind, for every version this consumer knows.
EVENT_TYPES = {
    f"io.preemptctl.{name}.v{v}": kind
    for v in SUPPORTED_VERSIONS
    for name, kind in (("decision", "decisions"), ("eviction", "evictions"))
}
EVICTIONS_TOPIC = "preemption.evictions"
DECISIONS_TOPIC = "preemption.decisions"
SCHEMA_FILES = {"evictions": "evictions.schema.json", "decisions": "decisions.schema.json"}
DEFAULT_SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
# A poll returns after this long even when nothing arrived, so --idle-exit and Ctrl-C stay responsive.
POLL_MS = 200


class Rejected(ValueError):
    """A record this consumer must not act on; the message says why."""


def load_validators(schema_dir: Path) -> dict[str, Any]:
    """One Draft 2020-12 validator per record kind, from the schema files."""
    validators = {}
    for kind, name in SCHEMA_FILES.items():
        schema = orjson.loads((schema_dir / name).read_bytes())
        jsonschema.Draft202012Validator.check_schema(schema)
        validators[kind] = jsonschema.Draft202012Validator(schema)
    return validators


def as_event(headers: Sequence[tuple[str, bytes]], key: bytes | None, value: bytes | None) -> Any:
    """The CloudEvent the SDK reads from a message, None when it carries no CloudEvents headers."""
    if not any(name.lower().startswith("ce_") for name, _ in headers):
        return None
    message = ce_kafka.KafkaMessage(headers=dict(headers), key=key, value=value or b"")
    try:
        return ce_kafka.from_binary(message, JSONFormat(), CloudEvent)
    except Exception as exc:  # the SDK raises its own validation and parsing errors
        raise Rejected(f"not a valid CloudEvent: {exc}") from exc


def kind_of(event: Any) -> str:
    kind = EVENT_TYPES.get(event.get_type())
    if kind is None:
        raise Rejected(
            f"unknown event type {event.get_type()!r} (this consumer knows {', '.join(EVENT_TYPES)})"
        )
    return kind


def check(value: bytes | None, validator: Any) -> dict[str, Any]:
    """The record, parsed and valid; Rejected otherwise."""
    try:
        record = orjson.loads(value or b"")
    except orjson.JSONDecodeError as exc:
        raise Rejected(f"not JSON: {exc}") from exc
    return check_record(record, validator)


def check_record(record: Any, validator: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise Rejected("not a JSON object")
    # The version first: a v2 record may fail the v1 schema in confusing ways.
    if record.get("v") not in SUPPORTED_VERSIONS:
        known = ", ".join(str(v) for v in sorted(SUPPORTED_VERSIONS))
        raise Rejected(f"unsupported envelope version v={record.get('v')!r} (this consumer knows {known})")
    error = jsonschema.exceptions.best_match(validator.iter_errors(record))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(record)"
        raise Rejected(f"schema: {where}: {error.message}")
    return record


def describe(kind: str, record: dict[str, Any]) -> str:
    """One readable line; reads only the fields it needs, so added fields never matter."""
    if kind == "evictions":
        victim = record["victim"]
        dry = " (dry run)" if record.get("dryRun") else ""
        return (
            f"eviction {victim['namespace']}/{victim['name']} on {victim['node']}: {record['action']} -> "
            f"{record['result']} after {record['attempts']} attempt(s){dry}, decision {record['decisionId']}"
        )
    target = record.get("node") or ", ".join(
        f"{m}@{n}" for m, n in sorted(record.get("placements", {}).items())
    )
    victims = ", ".join(f"{v['namespace']}/{v['name']}" for v in record["victims"]) or "none"
    return (
        f"decision {record['id']}: {record['preemptor']} {record['outcome']}"
        f"{f' on {target}' if target else ''}; victims: {victims}"
    )


@dataclass
class Stats:
    valid: int = 0
    rejected: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


async def consume(
    bootstrap: str,
    topics: dict[str, str],
    validators: dict[str, Any],
    *,
    group: str | None = None,
    from_beginning: bool = False,
    max_records: int | None = None,
    idle_exit: float | None = None,
    as_json: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    stop: Callable[[], bool] = lambda: False,
) -> Stats:
    """Consume `topics` (name -> kind) until stopped, max_records, or idle_exit seconds without records."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=group is not None,
        auto_offset_reset="earliest" if from_beginning else "latest",
    )
    await consumer.start()
    stats = Stats()
    try:
        if group is not None:
            consumer.subscribe(list(topics))
        else:
            # No group: read every partition ourselves, no offsets stored (a tail, or a one-off read).
            parts = []
            await consumer._client.force_metadata_update()
            for name in topics:
                found = sorted(consumer.partitions_for_topic(name) or ())
                if not found:
                    print(f"warning: topic {name} not found (yet): nothing to read from it", file=err)
                parts += [TopicPartition(name, p) for p in found]
            consumer.assign(parts)
            if from_beginning:
                await consumer.seek_to_beginning(*parts)
            else:
                await consumer.seek_to_end(*parts)
        last = time.monotonic()
        while not stop():
            batch = await consumer.getmany(timeout_ms=POLL_MS)
            if not batch:
                if idle_exit is not None and time.monotonic() - last >= idle_exit:
                    break
                continue
            last = time.monotonic()
            for tp, messages in sorted(batch.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
                for m in messages:
                    try:
                        event = as_event(m.headers or (), m.key, m.value)
                        if event is None:
                            kind, record = topics[tp.topic], check(m.value, validators[topics[tp.topic]])
                        else:
                            kind = kind_of(event)
                            record = check_record(event.get_data(), validators[kind])
                    except Rejected as exc:
                        stats.rejected += 1
                        print(f"rejected {tp.topic}[{tp.partition}]@{m.offset}: {exc}", file=err)
                        continue
                    stats.valid += 1
                    stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
                    line = (
                        describe(kind, record)
                        if event is None
                        else f"{event.get_type()} {describe(kind, record)}"
                    )
                    print(orjson.dumps(record).decode() if as_json else line, file=out)
                    if max_records is not None and stats.valid + stats.rejected >= max_records:
                        return stats
    finally:
        await consumer.stop()
    return stats


def broker_address(url: str) -> str:
    if not url.startswith("kafka://") or not url[len("kafka://") :].strip("/"):
        raise ValueError(f"expected kafka://host:port, got {url!r}")
    return url[len("kafka://") :].strip("/")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Validate and print preemptctl eviction (and decision) records.",
        epilog="examples:\n"
        "  python examples/consumer.py --broker kafka://127.0.0.1:9092\n"
        "  python examples/consumer.py --broker kafka://127.0.0.1:9092 --decisions --from-beginning --json\n"
        "  python examples/consumer.py --broker kafka://k:9092 --group billing   committed offsets",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--broker", required=True, help="kafka://host:port")
    parser.add_argument("--evictions-topic", default=EVICTIONS_TOPIC, help="default %(default)s")
    parser.add_argument("--decisions", action="store_true", help=f"also consume {DECISIONS_TOPIC}")
    parser.add_argument("--decisions-topic", help="consume decisions from this topic (implies --decisions)")
    parser.add_argument("--group", help="consumer group (commits offsets); default: no group, no commits")
    parser.add_argument("--from-beginning", action="store_true", help="start at the oldest record")
    parser.add_argument("--max-records", type=int, help="stop after this many records")
    parser.add_argument(
        "--idle-exit", type=float, metavar="SECONDS", help="stop after this long without records"
    )
    parser.add_argument("--json", action="store_true", help="print valid records as JSON lines")
    parser.add_argument("--schemas", type=Path, default=DEFAULT_SCHEMAS, help="folder with *.schema.json")
    args = parser.parse_args(argv)
    try:
        bootstrap = broker_address(args.broker)
        validators = load_validators(args.schemas)
    except (ValueError, OSError) as exc:
        print(f"consumer: error: {exc}", file=sys.stderr)
        return 2
    topics = {args.evictions_topic: "evictions"}
    if args.decisions or args.decisions_topic:
        topics[args.decisions_topic or DECISIONS_TOPIC] = "decisions"
    try:
        stats = asyncio.run(
            consume(
                bootstrap,
                topics,
                validators,
                group=args.group,
                from_beginning=args.from_beginning,
                max_records=args.max_records,
                idle_exit=args.idle_exit,
                as_json=args.json,
            )
        )
    except KeyboardInterrupt:
        return 130
    print(f"consumed {stats.valid} valid, {stats.rejected} rejected record(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
