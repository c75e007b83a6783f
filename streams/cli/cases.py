"""Reading conformance case files (YAML, or JSON for large cases) into engine questions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import yaml

from engine import case as case_mod
from engine.errors import EngineError
from streams.common.errors import UsageError

try:  # libyaml when present: several times faster on large cases
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader


def read(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    if path.suffix == ".json":
        # Fast path for large cases (5,000 nodes): orjson parses them in milliseconds.
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"{path}: invalid JSON: {exc}") from exc
    try:
        return yaml.load(data, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from exc


def load(path: Path) -> case_mod.Case:
    try:
        return case_mod.load(read(path), where=str(path))
    except EngineError as exc:
        raise UsageError(str(exc)) from exc
