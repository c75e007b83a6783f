from typing import Any

import pytest

from engine import objects, timeutil, toleration

X = "preemption-toleration.scheduling.x-k8s.io/"
SIGS = "preemption-toleration.scheduling.sigs.k8s.io/"
NOW = timeutil.parse("2026-01-01T00:00:00Z")


def _tolerates(policy: toleration.Policy | None, *, pre: int, ago: int | None, victim: int = 100) -> bool:
    return toleration.tolerates(
        policy,
        victim_priority=victim,
        preemptor_priority=pre,
        scheduled_at=None if ago is None else NOW - ago * timeutil.SECOND,
        now=NOW,
    )


def test_defaults_minimum_is_value_plus_one_and_seconds_zero() -> None:
    assert toleration.parse_policy(100, {X + "toleration-seconds": "5"}) == toleration.Policy(101, 5)
    assert toleration.parse_policy(100, {X + "minimum-preemptable-priority": "200"}) == toleration.Policy(
        200, 0
    )
    assert toleration.parse_policy(100, {}) is None


def test_both_annotation_spellings() -> None:
    assert toleration.parse_policy(1, {SIGS + "minimum-preemptable-priority": "9"}) == toleration.Policy(9, 0)


@pytest.mark.parametrize("bad", ["a", "1.5", ""])
def test_unparsable_annotation_is_an_error(bad: str) -> None:
    with pytest.raises(toleration.PolicyError):
        toleration.parse_policy(1, {X + "toleration-seconds": bad})


# Issue 28, 6: Go's strconv.ParseInt(s, 10, bits), not Python's int(s.strip()): each of these
# protected pods in preemptctl and none upstream, where an unparsable policy protects nothing.
NOT_GO_INTEGERS = [
    " 2000",
    "2000 ",
    "2000\n",
    "\t5",
    "100_000",
    "\uff12\uff10\uff10\uff10",  # full-width digits
    "\u0662",  # Arabic-Indic digit two
    "+",
    "-",
    "0x10",
    "1e3",
    "++1",
]


@pytest.mark.parametrize("bad", NOT_GO_INTEGERS)
@pytest.mark.parametrize("name", ["minimum-preemptable-priority", "toleration-seconds"])
def test_annotations_are_read_as_go_integers(name: str, bad: str) -> None:
    with pytest.raises(toleration.PolicyError):
        toleration.parse_policy(1, {X + name: bad})


def test_go_integer_syntax_and_ranges() -> None:
    parse = toleration.parse_policy
    assert parse(1, {X + "minimum-preemptable-priority": "+2000"}) == toleration.Policy(2000, 0)
    assert parse(1, {X + "minimum-preemptable-priority": "-0007"}) == toleration.Policy(-7, 0)
    # minimum-preemptable-priority is an int32, toleration-seconds an int64.
    assert parse(1, {X + "minimum-preemptable-priority": str(2**31 - 1)}) == toleration.Policy(2**31 - 1, 0)
    assert parse(1, {X + "minimum-preemptable-priority": str(-(2**31))}) == toleration.Policy(-(2**31), 0)
    for bad in (str(2**31), str(-(2**31) - 1), str(2**63)):
        with pytest.raises(toleration.PolicyError):
            parse(1, {X + "minimum-preemptable-priority": bad})
    assert parse(1, {X + "toleration-seconds": str(2**63 - 1)}) == toleration.Policy(2, 2**63 - 1)
    assert parse(1, {X + "toleration-seconds": str(-(2**63))}) == toleration.Policy(2, -(2**63))
    for bad in (str(2**63), str(-(2**63) - 1)):
        with pytest.raises(toleration.PolicyError):
            parse(1, {X + "toleration-seconds": bad})


def test_rules() -> None:
    p = toleration.Policy(200, 100)
    assert _tolerates(p, pre=199, ago=10)
    assert _tolerates(p, pre=199, ago=100)  # inclusive boundary
    assert not _tolerates(p, pre=199, ago=101)
    assert not _tolerates(p, pre=200, ago=10)  # at the minimum: not tolerated
    assert _tolerates(p, pre=199, ago=None)  # not scheduled yet
    zero = toleration.Policy(200, 0)
    assert not _tolerates(zero, pre=199, ago=1)  # 0 = no toleration once scheduled...
    assert _tolerates(zero, pre=199, ago=0)  # ...past the (inclusive) boundary, the scheduled instant
    # No special case for 0 (issue 28, 6): a PodScheduled time ahead of now (a skewed clock)
    # protects the pod, as upstream's scheduledAt + 0 s is after now.
    assert _tolerates(zero, pre=199, ago=-30)
    assert not _tolerates(zero, pre=200, ago=-30)  # not below the minimum
    assert toleration.expires_at(zero, scheduled_at=NOW) == NOW
    # A pod not scheduled yet tolerates whatever the seconds: upstream's
    # ExemptedFromPreemption checks PodScheduled=True before it reads toleration-seconds.
    assert _tolerates(toleration.Policy(200, 0), pre=199, ago=None)
    assert not _tolerates(toleration.Policy(200, 0), pre=200, ago=None)  # not below the minimum
    assert _tolerates(toleration.Policy(200, -1), pre=199, ago=10**9)  # negative = forever
    assert not _tolerates(p, pre=100, ago=10, victim=100)  # equal priority is never a victim anyway
    assert toleration.expires_at(p, scheduled_at=NOW) == NOW + 100 * timeutil.SECOND


def test_scheduled_without_a_transition_time_counts_from_gos_zero_time() -> None:
    """Issue 28, 6: PodScheduled=True without lastTransitionTime reads as 0001-01-01T00:00:00Z
    upstream (a metav1.Time left unset), long past any window: not protected. Not as "not
    scheduled yet", which protects whatever the seconds."""
    raw: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "v", "namespace": "default", "uid": "v-uid"},
        "spec": {"nodeName": "n1", "priorityClassName": "guarded", "containers": []},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    pod = objects.pod(raw)
    assert pod.scheduled_at == timeutil.GO_ZERO == timeutil.parse("0001-01-01T00:00:00Z")
    policy = toleration.Policy(200, 3600)
    assert not toleration.tolerates(
        policy, victim_priority=1, preemptor_priority=199, scheduled_at=pod.scheduled_at, now=NOW
    )
    # Without PodScheduled=True at all the pod is not scheduled yet: it still tolerates.
    raw["status"]["conditions"] = []
    unscheduled = objects.pod(raw)
    assert unscheduled.scheduled_at is None
    assert toleration.tolerates(
        policy, victim_priority=1, preemptor_priority=199, scheduled_at=unscheduled.scheduled_at, now=NOW
    )


def test_seconds_past_292_years_wrap_as_gos_duration_does() -> None:
    """The plugin multiplies into a time.Duration (int64 nanoseconds), which wraps: 9,223,372,036 s
    is +292 years, one more second is -292 years, and the largest int64 is -1 s (parity seeds
    137 and 870 against the real scheduler-plugins found preemptctl protecting such pods)."""
    assert toleration.window_nanos(9_223_372_036) == 9_223_372_036_000_000_000
    assert toleration.window_nanos(9_223_372_037) < -(10**18)
    assert toleration.window_nanos(2**63 - 1) == -1_000_000_000
    at = timeutil.parse("2026-01-01T00:00:00Z")

    def protected(seconds: int, now: int) -> bool:
        policy = toleration.Policy(minimum_preemptable_priority=10_000, toleration_seconds=seconds)
        return toleration.tolerates(
            policy, victim_priority=1, preemptor_priority=100, scheduled_at=at, now=now
        )

    five_minutes_later = at + 300 * timeutil.SECOND
    assert protected(9_223_372_036, five_minutes_later)
    assert not protected(9_223_372_037, five_minutes_later)
    assert not protected(2**63 - 1, five_minutes_later)
    # -1 s: the pod is protected only while its scheduled time is over a second ahead of `now`.
    assert protected(2**63 - 1, at - 2 * timeutil.SECOND)
    int64_max = toleration.Policy(10_000, 2**63 - 1)
    assert toleration.expires_at(int64_max, scheduled_at=at) == at - timeutil.SECOND
