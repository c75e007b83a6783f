"""The `preemptctl decide` contract (docs/case-format.md), through the real console entry point."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.common import options

CASES = Path(__file__).resolve().parent / "conformance" / "cases"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cases"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", *args], capture_output=True, text=True, check=False
    )


def test_one_json_line_per_case_in_order() -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert files, "bundled example cases are missing"
    proc = run("decide", *map(str, files), "--output", "json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(files)
    answers = [json.loads(line) for line in lines]
    assert [a["name"] for a in answers] == [f.stem for f in files]
    for a in answers:
        assert a["outcome"] in ("preempt", "fits", "unschedulable", "wait")
        assert isinstance(a["victims"], list)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("objects: [\n  - {kind: Pod", "invalid YAML"),
        (
            "now: '2026-01-01T00:00:00Z'\nobjects: []\npreemptor: [{kind: Pod, metadata: {}}]\n",
            "Pod without metadata.name",
        ),
        ("objects: []\n", "preemptor"),
        (
            "config: {victimSelection: best}\nobjects: []\npreemptor: [{kind: Pod, metadata: {name: p}}]\n",
            "victimSelection",
        ),
    ],
)
def test_invalid_case_exits_2_with_one_line_and_no_stdout(tmp_path: Path, content: str, message: str) -> None:
    good = EXAMPLES / sorted(p.name for p in EXAMPLES.glob("*.yaml"))[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    proc = run("decide", str(good), str(bad), "--output", "json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert message in proc.stderr


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    proc = run("decide", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr and proc.stdout == ""


def test_text_output_explains() -> None:
    proc = run("decide", str(CASES / "k8s" / "k8s-preempt-basic.yaml"), "--output", "text")
    assert proc.returncode == 0
    assert "PREEMPT" in proc.stdout and "candidate node1" in proc.stdout and "rejected node2" in proc.stdout


def test_json_cases_take_the_fast_path(tmp_path: Path) -> None:
    import yaml

    raw = yaml.safe_load((CASES / "k8s" / "k8s-preempt-basic.yaml").read_text())
    path = tmp_path / "case.json"
    path.write_text(json.dumps(raw))
    proc = run("decide", str(path), "--output", "json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["node"] == "node1"


def test_a_case_on_standard_input() -> None:
    case = EXAMPLES / "01-example1-c-preempts-a-and-b.yaml"
    for content in (case.read_text(), json.dumps(__import__("yaml").safe_load(case.read_text()))):
        proc = subprocess.run(
            [sys.executable, "-m", "streams.cli", "decide", "-", "--output", "json"],
            input=content,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["victims"] == ["default/a", "default/b"]
    proc = run("decide", "-", "-")
    assert proc.returncode == 2 and "once" in proc.stderr


def test_a_closed_pipe_ends_quietly() -> None:
    """`preemptctl decide ... | head -1`: no traceback when the reader goes away."""
    case = str(EXAMPLES / "01-example1-c-preempts-a-and-b.yaml")
    process = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "decide", *[case] * 3000],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().startswith(b"01-example1")
    process.stdout.close()  # what head does after its first line
    stderr = process.stderr.read().decode()
    assert process.wait() == 141
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_version() -> None:
    from engine import ENGINE_VERSION

    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"preemptctl {ENGINE_VERSION}"


def test_the_source_refuses_a_cluster_name_the_worker_would_reject(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One cluster-name rule for every stage (issue 19 #5): not an empty key the worker dead-letters."""
    from streams.cli import main

    assert main.main(["source", "--broker", "kafka://127.0.0.1:1", "--cluster", ""]) == 2
    assert capsys.readouterr().err.strip() == "preemptctl: error: --cluster: empty cluster name"


@pytest.mark.parametrize("as_flow_yaml", [False, True])
def test_a_case_reads_the_same_whatever_its_name_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_flow_yaml: bool
) -> None:
    """JSON content under a .yaml name is read by orjson (PyYAML took 50 s on a 5,000-node case
    that orjson reads in under a second); a YAML flow mapping that is not JSON is still YAML."""
    import yaml

    from streams.cli import cases

    example = EXAMPLES / sorted(p.name for p in EXAMPLES.glob("*.yaml"))[0]
    raw = yaml.safe_load(example.read_text())
    text = yaml.safe_dump(raw, default_flow_style=True) if as_flow_yaml else json.dumps(raw)
    assert text.lstrip().startswith("{")
    case = tmp_path / "case.yaml"
    case.write_text(text)
    if not as_flow_yaml:
        monkeypatch.setattr(yaml, "load", lambda *_, **__: pytest.fail("JSON content went to PyYAML"))
    assert cases.read(case) == raw


@given(
    st.one_of(
        st.text(max_size=12),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(-(10**6), 10**6).map(str),
        st.sampled_from(["nan", "inf", "-inf", "1e999", " 3 ", "0", "1", "0.5", "1_000"]),
    ),
    st.sampled_from([int, float]),
    st.booleans(),
)
def test_a_bounded_number_is_within_its_bounds_or_one_clear_error(text: str, kind: type, above: bool) -> None:
    """Every command's numeric options read through `options.bounded`: whatever is typed, the
    value is finite and within bounds, or argparse gets one line naming what was expected."""
    parse = options.bounded(kind, least=0, most=500, above=above, what="a thing from 0 to 500")
    try:
        value = parse(text)
    except argparse.ArgumentTypeError as exc:
        assert str(exc).startswith("expected a thing from 0 to 500, got ")
        return
    assert isinstance(value, kind) and math.isfinite(value)
    assert (value > 0 if above else value >= 0) and value <= 500
