"""Reading conformance case files (YAML, or JSON for large cases) into engine questions."""

from __future__ import annotations

import contextlib
import sys
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

# The CASE argument that means standard input.
STDIN = "-"
# How a case read from standard input is named in errors (and in answers, when it has no `name`).
STDIN_NAME = "stdin"


def _parse(data: bytes, *, where: str, as_json: bool) -> Any:
    if as_json:
        # Fast path for large cases (5,000 nodes): orjson parses them in milliseconds.
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"{where}: invalid JSON: {exc}") from exc
    if data.lstrip()[:1] in (b"{", b"["):
        # JSON content under a .yaml name (`bench engine --write-case big.yaml` writes JSON):
        # PyYAML took 50 s on a 5,000-node case that orjson reads in a fraction of a second. A
        # flow mapping that is YAML but not JSON (`{name: x}`) falls through to the YAML parser.
        with contextlib.suppress(orjson.JSONDecodeError):
            return orjson.loads(data)
    try:
        return yaml.load(data, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{where}: invalid YAML{at}: {getattr(exc, 'problem', exc)}") from exc


def read(path: Path) -> Any:
    """A case file's content; `-` reads standard input (JSON when it starts with `{`, else YAML)."""
    if str(path) == STDIN:
        data = sys.stdin.buffer.read()
        return _parse(data, where=STDIN_NAME, as_json=False)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    return _parse(data, where=str(path), as_json=path.suffix == ".json")


def load(path: Path) -> case_mod.Case:
    where = STDIN_NAME if str(path) == STDIN else str(path)
    try:
        return case_mod.load(read(path), where=where)
    except EngineError as exc:
        raise UsageError(str(exc)) from exc
