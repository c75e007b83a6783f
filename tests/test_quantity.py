from fractions import Fraction

import pytest

from engine import quantity
from engine.errors import InvalidQuantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("500m", Fraction(1, 2)),
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("1Ki", 1024),
        ("1Mi", 2**20),
        ("1Gi", 2**30),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("100n", Fraction(1, 10**7)),
        ("5u", Fraction(5, 10**6)),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2e-3", Fraction(2, 1000)),
        ("1.5e+2", 150),
        ("+3", 3),
        ("-1", -1),
        (3, 3),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_every_suffix_and_exponent(text: object, value: Fraction) -> None:
    assert quantity.parse(text) == value


@pytest.mark.parametrize("bad", ["", "1x", "Gi", "1.2.3", "1 Gi", "e3", True, None, [1]])
def test_invalid_quantities_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidQuantity):
        quantity.parse(bad)


def test_amounts_round_up_like_kubernetes() -> None:
    assert quantity.amount("cpu", "100m") == 100
    assert quantity.amount("cpu", "1") == 1000
    assert quantity.amount("cpu", "0.0001") == 1  # MilliValue rounds up
    assert quantity.amount("memory", "1.5") == 2  # Value rounds up
    assert quantity.amount("memory", "1Gi") == 2**30
    assert quantity.amount("nvidia.com/gpu", "2") == 2


def test_render_round_trips_common_amounts() -> None:
    assert quantity.render("cpu", 1500) == "1500m"
    assert quantity.render("cpu", 2000) == "2"
    assert quantity.render("memory", 2**30) == "1Gi"


@pytest.mark.parametrize(
    ("huge", "check"),
    [
        ("1e200", "exponent beyond"),
        (
            "1e20000000",
            "exponent beyond",
        ),  # issue 19 #8: exact arithmetic on this froze the worker for minutes
        ("-1e-200", "exponent beyond"),
        ("9223372036854775808", r"larger than 2\^63-1"),  # 2^63: Kubernetes' quantities stop at 2^63-1
        ("8Ei", r"larger than 2\^63-1"),
        ("1" * 65, "longer than 64 characters"),
        (10**19, r"larger than 2\^63-1"),
        (1.8e19, r"larger than 2\^63-1"),
        # Last: without its own check it runs for hours rather than fail.
        ("1e999999999", "exponent beyond"),
    ],
)
def test_quantities_beyond_kubernetes_bounds_are_rejected_before_any_arithmetic(
    huge: object, check: str
) -> None:
    """Each by its own check, named in the message: a later check would still reject the value, but
    only after the exact arithmetic the bound is there to prevent (34 s for 1e20000000)."""
    with pytest.raises(InvalidQuantity, match=check):
        quantity.parse(huge)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("9223372036854775807", 2**63 - 1),
        ("7Ei", 7 * 2**60),
        ("0e999999999", 0),
        ("1e-9", Fraction(1, 10**9)),
    ],
)
def test_quantities_at_the_bounds_are_exact(text: str, value: Fraction) -> None:
    assert quantity.parse(text) == value
