"""Each `preemptctl` subcommand imports only what it uses (streams/cli/main.py).

Checked in a fresh interpreter per command, since a test process has everything
imported already. The time `preemptctl --help` takes is measured by a benchmark
(docs/performance.md), never asserted here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from streams.cli import main as cli
from streams.sim import traces
from tests.support import audit_traces

ROOT = Path(__file__).resolve().parents[1]
CASE = ROOT / "examples" / "cases" / "01-example1-c-preempts-a-and-b.yaml"
# The runtime's heavy parts: the stream processor, the Kafka and Kubernetes clients and their
# HTTP stack, the store. A command that needs none of them must not pay for importing them.
# (prometheus_client is small and pure Python; the signing keyring that `audit` uses registers
# its key-age gauge with it.) numpy is the engine's node table (engine/nodetable.py), kept by
# long-lived indexes only: one decision pays more to import it than the arrays save.
HEAVY = ("faust", "mode", "aiokafka", "kubernetes_asyncio", "aiohttp", "rocksdict", "numpy")

PROBE = """
import json, sys
from streams.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
loaded = sorted({m.split(".")[0] for m in sys.modules})
print(json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
"""


def loaded_by(*args: str, cwd: Path = ROOT) -> tuple[int, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd, check=False
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return int(report["code"] or 0), set(report["loaded"])


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("--version",),
        ("decide", str(CASE)),
        ("decide", str(CASE), "--output", "json"),
        ("decide", "--help"),
        ("explain", "--help"),
        ("audit", "verify", "--help"),
        ("audit", "head", "--help"),
    ],
    ids=lambda a: " ".join(a).replace(str(CASE), "CASE"),
)
def test_light_commands_never_import_the_runtime(args: tuple[str, ...]) -> None:
    code, loaded = loaded_by(*args)
    assert code == 0
    assert not loaded & set(HEAVY), f"preemptctl {' '.join(args)} imported {sorted(loaded & set(HEAVY))}"


def test_explain_and_audit_on_files_never_import_the_runtime(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    log.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in audit_traces.decisions(traces.example())))
    for args in (
        ("audit", "verify", str(log)),
        ("audit", "head", str(log)),
        ("explain", "default/ex1-a", "--decisions", str(log)),
    ):
        code, loaded = loaded_by(*args)
        assert code == 0, args
        assert not loaded & set(HEAVY), f"preemptctl {' '.join(args)} imported {sorted(loaded & set(HEAVY))}"


def _pod(name: str, cpu: str, *, node: str | None = None, group: str | None = None) -> dict[str, object]:
    spec: dict[str, object] = {
        "priority": 1000 if node is None else 10,
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu}}}],
    }
    status: dict[str, object] = {"phase": "Pending"}
    if node is not None:
        spec["nodeName"] = node
        status = {"phase": "Running", "startTime": "2025-12-31T23:00:00Z"}
    labels = {"pod-group.scheduling.sigs.k8s.io": group} if group else {}
    meta = {"name": name, "namespace": "default", "uid": name + "-uid", "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def test_decide_of_a_job_of_several_shapes_never_imports_numpy(tmp_path: Path) -> None:
    """Members of different shapes rank twice in one decide: still one-shot work (no node table)."""
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
        }
        for n in ("n1", "n2")
    ]
    case = {
        "name": "job-of-shapes",
        "now": "2026-01-01T00:00:00Z",
        "objects": [*nodes, _pod("low-1", "3", node="n1"), _pod("low-2", "3", node="n2")],
        "preemptor": [_pod("job-0", "3", group="job"), _pod("job-1", "2", group="job")],
    }
    path = tmp_path / "job.yaml"
    path.write_bytes(orjson.dumps(case))  # JSON is YAML
    code, loaded = loaded_by("decide", str(path))
    assert code == 0
    assert "numpy" not in loaded


def test_heavy_commands_do_load_what_they_need() -> None:
    """The probe sees imports at all: `worker --help` defines its parser beside faust."""
    code, loaded = loaded_by("worker", "--help")
    assert code == 0 and "faust" in loaded


def test_every_command_module_defines_the_command_the_table_lists() -> None:
    for command in cli.COMMANDS:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(command.module).register(sub)
        assert list(sub.choices) == [command.name], command
        (action,) = sub._choices_actions
        assert action.help == command.help, f"{command.name}: the top-level help says {command.help!r}"
