"""What several commands take: the engine config (`--config`), the HMAC key (`--hmac-key-file`),
and numbers within bounds (`bounded`, an argparse `type=`).

One reading of each, so every command rejects the same bad input the same way:
one line naming the file or the value, exit 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml

from engine import config as config_mod
from engine.errors import InvalidConfig
from streams.common import logs
from streams.common.errors import UsageError

N = TypeVar("N", int, float)


def bounded(
    kind: type[N], *, least: float, most: float = math.inf, above: bool = False, what: str
) -> Callable[[str], N]:
    """An argparse `type=` for a whole number (`int`) or a finite number (`float`) from `least`
    (excluded when `above`) to `most`: NaN, infinities and words are refused alike, with one
    line saying what was `what` expected."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or (value <= least if above else value < least)
            or value > most
        ):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text[:40]!r}")
        return value

    return parse


def load_config(path: str | None) -> config_mod.Config:
    """The engine config in a YAML file (README, config keys); defaults without one."""
    if not path:
        return config_mod.Config()
    try:
        return config_mod.parse(yaml.safe_load(Path(path).read_text()))
    except (OSError, yaml.YAMLError, InvalidConfig) as exc:
        raise UsageError(f"{path}: {exc}") from exc


def load_key(path: str | None) -> bytes | None:
    """The HMAC key, or None without a file. An empty key is refused: it would sign
    every record with a key anyone can reproduce."""
    if not path:
        return None
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise UsageError(f"cannot read --hmac-key-file {path}: {exc.strerror or exc}") from exc
    if not key:
        raise UsageError(f"--hmac-key-file {path} is empty")
    logs.secret(key)  # whatever logs it by mistake (a record's repr, a library's debug line) masks it
    return key
