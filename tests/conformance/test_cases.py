"""Every case in tests/conformance/cases through `preemptctl decide`, as an outside tool calls it.

The command runs once, as a subprocess, over all case files (the contract of
docs/case-format.md: one JSON answer per line, in order), and each case is then
checked as its own test, so a failure names the case and what differed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

CASES_DIR = Path(__file__).resolve().parent / "cases"
CASES = sorted(CASES_DIR.rglob("*.yaml"))


def mismatch(expect: dict[str, Any], got: dict[str, Any]) -> str | None:
    """None when `got` answers the case as `expect` requires (docs/case-format.md), else why not."""
    if got.get("outcome") != expect["outcome"]:
        return f"outcome {got.get('outcome')!r}, expected {expect['outcome']!r}"
    victims = sorted(got.get("victims") or [])
    if expect["outcome"] != "preempt":
        if victims:
            return f"a {expect['outcome']} answer has no victims, got {victims}"
        if expect["outcome"] == "fits" and expect.get("node") and got.get("node") != expect["node"]:
            return f"fits on {got.get('node')!r}, expected {expect['node']!r}"
        return None
    # Ties: the main answer or any listed alternative; an alternative inherits what it omits.
    for option in [expect, *(expect.get("anyOf") or [])]:
        if victims != sorted(option.get("victims", expect.get("victims") or [])):
            continue
        if "placements" in option and (got.get("placements") or {}) != option["placements"]:
            continue
        if "node" in option and got.get("node") != option["node"]:
            continue
        return None
    return f"node={got.get('node')!r} placements={got.get('placements')!r} victims={victims}"


@pytest.fixture(scope="module")
def answers() -> dict[Path, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "streams.cli", "decide", *map(str, CASES), "--output", "json"],
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == len(CASES), f"{len(lines)} answers for {len(CASES)} cases"
    return {path: orjson.loads(line) for path, line in zip(CASES, lines, strict=True)}


def test_the_bundled_cases_are_all_there() -> None:
    # The 71 cases of the shared conformance set at the time they were copied in.
    assert len(CASES) >= 71


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_case(case: Path, answers: dict[Path, dict[str, Any]]) -> None:
    spec = yaml.safe_load(case.read_text())
    got = answers[case]
    assert got.get("name") == spec["name"]
    problem = mismatch(spec["expect"], got)
    assert problem is None, f"{spec['name']} ({spec.get('source', '')}): {problem}"
