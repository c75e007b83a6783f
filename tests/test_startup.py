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
from tests import audit_traces

ROOT = Path(__file__).resolve().parents[1]
CASE = ROOT / "examples" / "cases" / "01-example1-c-preempts-a-and-b.yaml"
# The runtime's heavy parts: the stream processor, the Kafka and Kubernetes clients and their
# HTTP stack, the store. A command that needs none of them must not pay for importing them.
# (prometheus_client is small and pure Python; the signing keyring that `audit` uses registers
# its key-age gauge with it.)
HEAVY = ("faust", "mode", "aiokafka", "kubernetes_asyncio", "aiohttp", "rocksdict")

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
