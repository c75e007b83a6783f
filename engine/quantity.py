"""Kubernetes resource quantities, parsed exactly.

A quantity (`500m`, `1Gi`, `1e3`, `0.5`) becomes a `Fraction`, so no binary
floating point ever touches capacity maths. Resources are then stored as
integers: cpu in millicores, everything else in whole units, both rounded up
the way Kubernetes' `MilliValue()` and `Value()` round.
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
# <sign><digits>[.<digits>] then one of: a binary suffix, a decimal exponent (e3/E-2), a decimal suffix.
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?\d+)|(?P<dec>[numkMGTPE]?))$"
)


def parse(value: object) -> Fraction:
    """Parse a quantity given as a string or a YAML/JSON number."""
    if isinstance(value, bool):
        raise InvalidQuantity(f"quantity must be a string or number, got {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        # YAML turns `0.5` into a float; its decimal text is what the user wrote.
        return parse(repr(value))
    if not isinstance(value, str):
        raise InvalidQuantity(f"quantity must be a string or number, got {value!r}")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise InvalidQuantity(f"invalid quantity {value!r}")
    number = Fraction(m.group("num"))
    if m.group("bin"):
        return number * _BINARY[m.group("bin")]
    if m.group("exp") is not None:
        return number * Fraction(10) ** int(m.group("exp"))
    return number * _DECIMAL[m.group("dec") or ""]


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
