"""What every stage does when it dead-letters a record: the headers it sends and the count it keeps.

A stage (the worker, the actuator) names where the rejected bytes came from
(`Origin`), and `headers(...)` gives what to send with them: the origin headers
(origin-topic, -partition, -offset, -index for one event of a batch,
error-class, error; docs/topics.md) followed by the record's CloudEvents
attributes (schemas.cloudevent). Once the broker has the record, `sent(...)`
counts it in `preemptctl_dead_letters_total{stage, reason}`, reason being the
error class: one metric, so one dashboard panel and one alert cover every stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import Counter

from schemas import cloudevent

DEAD_LETTERS = Counter(
    "preemptctl_dead_letters_total",
    "Records or events written to preemption.dead-letter, by the stage that rejected them and why "
    "(the error class).",
    ["stage", "reason"],
)

Headers = list[tuple[str, bytes]]
# The first this many characters of an error go into a dead letter's `error` header.
ERROR_HEADER_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a rejected record or event came from."""

    topic: str
    partition: int
    offset: int
    index: int | None = None  # the event's position in its record; None: the whole record


def origin_headers(origin: Origin, error_class: str, error: str) -> Headers:
    found = [
        ("origin-topic", origin.topic.encode()),
        ("origin-partition", str(origin.partition).encode()),
        ("origin-offset", str(origin.offset).encode()),
        # "replace": an error may quote input that is not valid UTF-8 (a lone surrogate).
        ("error-class", error_class.encode("utf-8", "replace")),
        ("error", error[:ERROR_HEADER_CHARS].encode("utf-8", "replace")),
    ]
    if origin.index is not None:
        found.append(("origin-index", str(origin.index).encode()))
    return found


def headers(key: bytes | None, value: bytes, origin: Sequence[tuple[str, bytes]]) -> Headers:
    """The origin headers followed by the CloudEvents headers of `value`, the bytes sent."""
    return [*origin, *cloudevent.dead_letter_headers(key, value, origin)]


def sent(stage: str, origin: Sequence[tuple[str, bytes]]) -> None:
    reason = dict(origin).get("error-class", b"unknown").decode("utf-8", "replace")
    DEAD_LETTERS.labels(stage, reason).inc()
