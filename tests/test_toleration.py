import pytest

from engine import timeutil, toleration

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


def test_rules() -> None:
    p = toleration.Policy(200, 100)
    assert _tolerates(p, pre=199, ago=10)
    assert _tolerates(p, pre=199, ago=100)  # inclusive boundary
    assert not _tolerates(p, pre=199, ago=101)
    assert not _tolerates(p, pre=200, ago=10)  # at the minimum: not tolerated
    assert _tolerates(p, pre=199, ago=None)  # not scheduled yet
    assert not _tolerates(toleration.Policy(200, 0), pre=199, ago=0)  # 0 = no toleration once scheduled
    # ...but a pod not scheduled yet tolerates whatever the seconds: upstream's
    # ExemptedFromPreemption checks PodScheduled=True before it reads toleration-seconds.
    assert _tolerates(toleration.Policy(200, 0), pre=199, ago=None)
    assert not _tolerates(toleration.Policy(200, 0), pre=200, ago=None)  # not below the minimum
    assert _tolerates(toleration.Policy(200, -1), pre=199, ago=10**9)  # negative = forever
    assert not _tolerates(p, pre=100, ago=10, victim=100)  # equal priority is never a victim anyway
    assert toleration.expires_at(p, scheduled_at=NOW) == NOW + 100 * timeutil.SECOND
