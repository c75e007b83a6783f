"""What every stage does when it dead-letters a record: the headers it sends and the count it keeps.

A stage (the worker, the actuator) builds its origin headers (origin-topic,
-partition, -offset, error-class, error; DESIGN §5) and sends the rejected bytes
with `headers(...)`: those plus the record's CloudEvents attributes
(schemas.cloudevent). Once the broker has the record, `sent(...)` counts it in
`preemptctl_dead_letters_total{stage, reason}`, reason being the error class:
one metric, so one dashboard panel and one alert cover every stage.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter

from schemas import cloudevent

DEAD_LETTERS = Counter(
    "preemptctl_dead_letters_total",
    "Records or events written to preemption.dead-letter, by the stage that rejected them and why "
    "(the error class).",
    ["stage", "reason"],
)

Headers = list[tuple[str, bytes]]


def headers(key: bytes | None, value: bytes, origin: Sequence[tuple[str, bytes]]) -> Headers:
    """The origin headers followed by the dead letter's CloudEvents headers."""
    return [*origin, *cloudevent.dead_letter_headers(key, value, origin)]


def sent(stage: str, origin: Sequence[tuple[str, bytes]]) -> None:
    reason = dict(origin).get("error-class", b"unknown").decode("utf-8", "replace")
    DEAD_LETTERS.labels(stage, reason).inc()
