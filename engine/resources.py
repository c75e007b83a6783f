"""Resource vectors: integer amounts keyed by resource name, and the fit test."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine import quantity

Resources = dict[str, int]


def add(into: Resources, other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def sub(into: Resources, other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) - v


def take(total: Resources, part: Mapping[str, int]) -> None:
    """Take `part` out of a running total, forgetting resources the total no longer holds.

    A total kept across events (a node's used resources, a quota's usage) must be
    what a total built from the current pods would be: a key left at zero when
    the last pod requesting it goes would make a long-lived index render
    `"nvidia.com/gpu": "0"` where a rebuilt one renders nothing.
    """
    for k, v in part.items():
        left = total.get(k, 0) - v
        if left:
            total[k] = left
        else:
            total.pop(k, None)


def total(items: Iterable[Mapping[str, int]]) -> Resources:
    out: Resources = {}
    for item in items:
        add(out, item)
    return out


def fits(request: Mapping[str, int], free: Mapping[str, int]) -> bool:
    """Every requested amount is available (unrequested resources do not matter)."""
    for k, v in request.items():  # noqa: SIM110 - a plain loop beats all() on this hot path
        if v > free.get(k, 0):
            return False
    return True


def shortfall(request: Mapping[str, int], free: Mapping[str, int]) -> dict[str, str]:
    """What is missing, rendered for explanations."""
    return {
        k: quantity.render(k, v - free.get(k, 0)) for k, v in sorted(request.items()) if v > free.get(k, 0)
    }


def render(res: Mapping[str, int]) -> dict[str, str]:
    return {k: quantity.render(k, v) for k, v in sorted(res.items())}
