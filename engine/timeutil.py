"""Instants as integer microseconds since the Unix epoch, parsed from RFC 3339.

The engine never reads the clock: "now" is always an argument taken from the
event being handled (or a case's `now`). Integers keep comparisons exact.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime

from engine.errors import InvalidObject

SECOND = 1_000_000
# A pod without a start time is treated as started "now" by Kubernetes; a fixed
# latest instant gives the same order without making decisions depend on time.
NEVER = 2**62
# Go's zero time.Time, 0001-01-01T00:00:00Z: what a metav1.Time left unset reads as upstream.
GO_ZERO = -62_135_596_800 * SECOND


# Parsed instants by text: a log repeats the same timestamps many times over.
_PARSED: dict[str, int] = {}
_PARSED_MAX = 65_536


def parse(value: object, *, field: str = "time") -> int:
    """Parse an RFC 3339 string (or a datetime from YAML) to epoch microseconds."""
    if isinstance(value, str):
        hit = _PARSED.get(value)
        if hit is not None:
            return hit
        out = _parse(value, field)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[value] = out
        return out
    return _parse(value, field)


def _parse(value: object, field: str) -> int:
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError as exc:
            raise InvalidObject(f"{field}: invalid RFC 3339 time {value!r}") from exc
    else:
        raise InvalidObject(f"{field}: expected an RFC 3339 time, got {value!r}")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * SECOND + delta.microseconds


def parse_optional(value: object, *, field: str = "time") -> int | None:
    return None if value is None or value == "" else parse(value, field=field)


@functools.lru_cache(maxsize=65_536)
def render(us: int) -> str:
    """RFC 3339 with a Z suffix; microseconds only when present.

    Cached: explanations render the same start times (a node's pods) decision after decision.
    """
    dt = datetime.fromtimestamp(us // SECOND, tz=UTC).replace(microsecond=us % SECOND)
    text = dt.isoformat().replace("+00:00", "Z")
    return text
