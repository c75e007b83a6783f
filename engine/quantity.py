"""Kubernetes resource quantities, parsed exactly.

A quantity (`500m`, `1Gi`, `1e3`, `0.5`) becomes a `Fraction`, so no binary
floating point ever touches capacity maths. Resources are then stored as
integers: cpu in millicores, everything else in whole units, both rounded up
the way Kubernetes' `MilliValue()` and `Value()` round.

Parsing is bounded in time: exact arithmetic on `1e20000000` took minutes (and
`1e999999999` hours). Kubernetes' own limits are the reference: no quantity is
larger than 2^63-1 in magnitude (resource.Quantity caps there), and none is
written with more digits than an int64 and nano precision need. Beyond
MAX_CHARS, MAX_EXPONENT or MAX_MAGNITUDE a quantity is invalid, checked before
any big-number arithmetic.
"""

from __future__ import annotations

import re
from fractions import Fraction

from engine.errors import InvalidQuantity

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# The longest quantity text: an int64's 19 digits, a point and 9 decimals (nano), a sign, an
# exponent, with room to spare. Longer text is garbage, and Fraction() of it is not O(1).
MAX_CHARS = 64
# The largest decimal exponent (`e` form) in magnitude: an int64 is below 1e19 and nothing is
# finer than 1e-9, so with MAX_CHARS digits any exponent beyond this is out of range.
MAX_EXPONENT = 100
# Kubernetes' largest quantity (resource.Quantity caps at an int64).
MAX_MAGNITUDE = 2**63 - 1
# <sign><digits>[.<digits>] then one of: a binary suffix, a decimal exponent (e3/E-2), a decimal suffix.
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?\d+)|(?P<dec>[numkMGTPE]?))$"
)


def parse(value: object) -> Fraction:
    """Parse a quantity given as a string or a YAML/JSON number."""
    if isinstance(value, bool):
        raise InvalidQuantity(f"quantity must be a string or number, got {value!r}")
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:
            raise InvalidQuantity(f"quantity {value} is larger than 2^63-1, Kubernetes' largest")
        return Fraction(value)
    if isinstance(value, float):
        # YAML turns `0.5` into a float; its decimal text is what the user wrote.
        return parse(repr(value))
    if not isinstance(value, str):
        raise InvalidQuantity(f"quantity must be a string or number, got {type(value).__name__}")
    if len(value) > MAX_CHARS:
        raise InvalidQuantity(f"quantity longer than {MAX_CHARS} characters")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise InvalidQuantity(f"invalid quantity {value!r}")
    number = Fraction(m.group("num"))
    if m.group("bin"):
        result = number * _BINARY[m.group("bin")]
    elif m.group("exp") is not None:
        exponent = int(m.group("exp"))  # at most MAX_CHARS digits: cheap
        if abs(exponent) > MAX_EXPONENT and number:
            raise InvalidQuantity(f"quantity {value!r} has an exponent beyond ±{MAX_EXPONENT}")
        result = number * Fraction(10) ** exponent if number else Fraction(0)
    else:
        result = number * _DECIMAL[m.group("dec") or ""]
    if abs(result) > MAX_MAGNITUDE:
        raise InvalidQuantity(f"quantity {value!r} is larger than 2^63-1, Kubernetes' largest")
    return result


def _ceil(q: Fraction) -> int:
    return -((-q.numerator) // q.denominator)


def amount(resource: str, value: object) -> int:
    """The integer amount of `resource` a quantity stands for (cpu in milli, else units, rounded up)."""
    q = parse(value)
    return _ceil(q * 1000) if resource == "cpu" else _ceil(q)


def render(resource: str, value: int) -> str:
    """The canonical text of an integer amount, for explanations."""
    if resource == "cpu":
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value and value % factor == 0 and resource in ("memory", "ephemeral-storage"):
            return f"{value // factor}{suffix}"
    return str(value)
