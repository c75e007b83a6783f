"""The PreemptionToleration policy (scheduler-plugins): victims that tolerate a preemptor.

A PriorityClass may say, through annotations, that its pods cannot be preempted
by pods below a minimum priority for a while after they were scheduled. The
policy is a victim filter: every flow asks `tolerates(victim, preemptor, now)`
before counting a pod as a potential victim.
"""

from __future__ import annotations

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
    toleration_seconds: int  # < 0: forever; 0: none once scheduled


class PolicyError(ValueError):
    """An annotation did not parse; the class then has no toleration at all."""


def _annotation(annotations: Mapping[str, str], name: str) -> str | None:
    for prefix in PREFIXES:
        if prefix + name in annotations:
            return annotations[prefix + name]
    return None


def parse_policy(value: int, annotations: Mapping[str, str]) -> Policy | None:
    """The class's policy, None when it has none; PolicyError when an annotation is unparsable."""
    minimum = _annotation(annotations, MINIMUM)
    seconds = _annotation(annotations, SECONDS)
    if minimum is None and seconds is None:
        return None
    try:
        min_value = value + 1 if minimum is None else int(minimum.strip())
        sec_value = 0 if seconds is None else int(seconds.strip())
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
        return True
    if policy.toleration_seconds == 0:
        return False
    # Inclusive boundary: a pod scheduled exactly toleration-seconds ago is still protected.
    return now - scheduled_at <= policy.toleration_seconds * timeutil.SECOND


def expires_at(policy: Policy | None, *, scheduled_at: int | None) -> int | None:
    """The instant after which `tolerates` turns false for a bounded window, else None."""
    if policy is None or policy.toleration_seconds <= 0 or scheduled_at is None:
        return None
    return scheduled_at + policy.toleration_seconds * timeutil.SECOND
