"""The package layout holds: every module imports on its own, and the import contracts are kept.

Importing each module by itself (not through the package that happens to have
imported it first) catches a module that only works because of import order.
Cycles, layers and purity are import-linter's contracts (pyproject.toml); running
it here makes a broken contract fail the test suite, not just `make lint`.
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import engine
import schemas
import streams

MODULES = sorted(
    info.name
    for package in (engine, schemas, streams)
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".")
    if not info.name.endswith(".__main__")  # runs the CLI when imported
)


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(module: str) -> None:
    code = f"import importlib; importlib.import_module({module!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_subpackage_says_what_it_owns() -> None:
    for info in pkgutil.walk_packages(streams.__path__, prefix="streams."):
        if info.ispkg:
            doc = importlib.import_module(info.name).__doc__ or ""
            assert "Owns:" in doc and "May use" in doc, info.name


def test_import_contracts_are_kept() -> None:
    linter = Path(sys.executable).parent / "lint-imports"
    exe = str(linter) if linter.exists() else shutil.which("lint-imports")
    assert exe, "lint-imports (import-linter) is a test dependency"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([exe], capture_output=True, text=True, check=False, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "0 broken" in proc.stdout
