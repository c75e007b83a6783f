"""The PreemptionToleration policy (scheduler-plugins): victims that tolerate a preemptor.

A PriorityClass may say, through annotations, that its pods cannot be preempted
by pods below a minimum priority for a while after they were scheduled. The
policy is a victim filter: every flow asks `tolerates(victim, preemptor, now)`
before counting a pod as a potential victim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from engine import timeutil

PREFIXES = (
    "preemption-toleration.scheduling.x-k8s.io/",
    # The KEP's first spelling; accepted so clusters annotated either way behave alike.
    "preemption-toleration.scheduling.sigs.k8s.io/",
)
MINIMUM = "minimum-preemptable-priority"
SECONDS = "toleration-seconds"


@dataclass(frozen=True, slots=True)
class Policy:
    minimum_preemptable_priority: int
    toleration_seconds: int  # < 0: forever; otherwise from the PodScheduled time, boundary included


class PolicyError(ValueError):
    """An annotation did not parse; the class then has no toleration at all."""


def _annotation(annotations: Mapping[str, str], name: str) -> str | None:
    for prefix in PREFIXES:
        if prefix + name in annotations:
            return annotations[prefix + name]
    return None


# Go's strconv.ParseInt(s, 10, bits) syntax: an optional sign, then ASCII digits only (no
# whitespace, no underscores, no other Unicode digits, which Python's int() would all accept).
_GO_DECIMAL = re.compile(r"[+-]?[0-9]+")


def parse_go_int(text: str, bits: int) -> int:
    """`strconv.ParseInt(text, 10, bits)`: ValueError on bad syntax or a value out of range."""
    if not _GO_DECIMAL.fullmatch(text):
        raise ValueError(f"invalid syntax: {text!r}")
    out = int(text)
    if not -(1 << (bits - 1)) <= out < 1 << (bits - 1):
        raise ValueError(f"value out of range for int{bits}: {text!r}")
    return out


def parse_policy(value: int, annotations: Mapping[str, str]) -> Policy | None:
    """The class's policy, None when it has none; PolicyError when an annotation is unparsable.

    Read as the plugin's parsePreemptionTolerationPolicy reads them: the minimum as a
    32-bit and the seconds as a 64-bit decimal integer in Go's syntax (`parse_go_int`).
    """
    minimum = _annotation(annotations, MINIMUM)
    seconds = _annotation(annotations, SECONDS)
    if minimum is None and seconds is None:
        return None
    try:
        min_value = value + 1 if minimum is None else parse_go_int(minimum, 32)
        sec_value = 0 if seconds is None else parse_go_int(seconds, 64)
    except ValueError as exc:
        raise PolicyError(f"unparsable preemption toleration annotation: {exc}") from exc
    return Policy(min_value, sec_value)


def tolerates(
    policy: Policy | None,
    *,
    victim_priority: int,
    preemptor_priority: int,
    scheduled_at: int | None,
    now: int,
) -> bool:
    """True when a victim of this class may not be preempted by the preemptor at `now`."""
    if policy is None or victim_priority >= preemptor_priority:
        return False
    if preemptor_priority >= policy.minimum_preemptable_priority:
        return False
    if policy.toleration_seconds < 0:
        return True
    if scheduled_at is None:
        # Not (yet) scheduled (no PodScheduled=True): the toleration window has not even
        # started, whatever its length; upstream's ExemptedFromPreemption asks this before
        # it reads toleration-seconds, so even a class with 0 seconds protects such a pod.
        # (PodScheduled=True without a time is scheduled at Go's zero time: `objects`.)
        return True
    # Inclusive boundary: a pod scheduled exactly toleration-seconds ago is still protected.
    # No case for 0 seconds: as upstream, a PodScheduled time still ahead of `now` (a skewed
    # clock) protects the pod until then. Compared in nanoseconds, as upstream's Duration.
    return (now - scheduled_at) * NANOS_PER_TICK <= window_nanos(policy.toleration_seconds)


# Event times are microseconds (engine.timeutil); Go durations are nanoseconds.
NANOS_PER_TICK = 1_000_000_000 // timeutil.SECOND


def window_nanos(seconds: int) -> int:
    """The plugin's `time.Duration(seconds) * time.Second`: nanoseconds in an int64 that wraps,
    as Go's multiplication does. Past 9,223,372,036 seconds (about 292 years) the window
    wraps around, often to a negative one that protects nothing; with the largest int64 it
    is -1 s. preemptctl reads the annotation as the plugin does, wrap included."""
    product = (seconds * 1_000_000_000) & (2**64 - 1)
    return product - 2**64 if product >= 2**63 else product


def expires_at(policy: Policy | None, *, scheduled_at: int | None) -> int | None:
    """The instant after which `tolerates` turns false for a bounded window, else None.

    The window's last protected instant (inclusive); with 0 seconds, the PodScheduled time itself.
    """
    if policy is None or policy.toleration_seconds < 0 or scheduled_at is None:
        return None
    return scheduled_at + window_nanos(policy.toleration_seconds) // NANOS_PER_TICK
