"""The package layout holds: every module imports on its own, and the import contracts are kept.

Importing each module by itself (not through the package that happens to have
imported it first) catches a module that only works because of import order.
Cycles, layers and purity are import-linter's contracts (pyproject.toml); running
it here makes a broken contract fail the test suite, not just `make lint`.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import engine
import fold
import schemas
import streams
import testbed

MODULES = sorted(
    info.name
    for package in (engine, schemas, fold, streams, testbed)
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


def _modules_of(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return sorted(
        info.name.rsplit(".", 1)[1] for info in pkgutil.iter_modules(pkg.__path__, prefix=package + ".")
    )


STREAMS_PACKAGES = sorted(
    ["fold"]  # the fold layer says what it owns the same way
    + [info.name for info in pkgutil.walk_packages(streams.__path__, prefix="streams.") if info.ispkg]
)


@pytest.mark.parametrize("package", STREAMS_PACKAGES)
def test_every_module_is_named_in_its_packages_owns(package: str) -> None:
    """A newcomer reads a package's docstring to find a module: every module must be in it."""
    doc = importlib.import_module(package).__doc__ or ""
    owns = doc.split("Owns:", 1)[1].split("May use", 1)[0] if "Owns:" in doc else ""
    missing = [m for m in _modules_of(package) if m != "__main__" and f"`{m}`" not in owns]
    assert not missing, f"{package}'s docstring does not name {missing} under Owns:"


ROOT = Path(__file__).resolve().parents[1]
# A docs page, and the section cited in it (`§n`, or `\xA7n` as YAML escapes it).
DOC_REF = re.compile(r"\b(docs/[a-z0-9_-]+\.md)(?: (?:§|\\xA7)(\d+))?")
# The checks' own examples of what they refuse.
SELF_EXAMPLES = {"tests/test_layout.py", "tests/test_docs.py"}
# Folders of the checkout that are not the repository's: version control, virtualenvs, builds.
NOT_THE_REPOSITORY = {".git", ".venv", "venv", ".hypothesis", "__pycache__", "node_modules", "build", "dist"}


def _repository_text() -> list[tuple[str, str]]:
    """(path, text) of every text file of the checkout: code, docs, charts, cases, build files;
    not the version control, the virtualenv or the tools' caches."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d for d in dirs if d not in NOT_THE_REPOSITORY and not d.endswith((".egg-info", "_cache"))
        )
        for name in sorted(files):
            path = Path(folder) / name
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue  # binary
            found.append((str(path.relative_to(ROOT)), text))
    return found


def test_every_docs_reference_resolves() -> None:
    """The repository cites docs/ (never a file outside it): each page named exists, and each
    `§n` named is a numbered section of it; in the code, the docs, the chart, the cases alike."""
    bad = []
    for where, text in _repository_text():
        if where in SELF_EXAMPLES:
            continue
        for match in DOC_REF.finditer(text):
            page, section = match.group(1), match.group(2)
            target = ROOT / page
            if not target.exists():
                bad.append(f"{where}: {page}")
            elif section and not re.search(rf"^#+ {section}\. ", target.read_text(), re.MULTILINE):
                bad.append(f"{where}: {page} §{section}")
    assert not bad, bad


def test_the_repository_cites_no_design_file_outside_it() -> None:
    pattern = re.compile(
        r"DESIGN(\.md)? (§|\\xA7)|conformance/FORMAT\.md|\bTRACE\.md|docs/traces\.md|\.\./shared"
    )
    hits = [
        where for where, text in _repository_text() if where not in SELF_EXAMPLES and pattern.search(text)
    ]
    assert not hits, hits


def test_pyproject_packages_and_names_only_what_exists() -> None:
    """The distribution packages real packages, and every repository path pyproject.toml's
    comments name is a file or folder of the repository."""
    text = (ROOT / "pyproject.toml").read_text()
    found = tomllib.loads(text)["tool"]["setuptools"]["packages"]["find"]["include"]
    missing = [
        n for n in found if not (ROOT / n.removesuffix(".*").replace(".", "/") / "__init__.py").exists()
    ]
    named = re.findall(
        r"\b((?:benchmarks|deploy|docs|engine|examples|fold|schemas|streams|testbed|tests)/[\w./-]*\w)", text
    )
    missing += [path for path in named if not (ROOT / path).exists()]
    assert not missing, missing


# ---- the tests and the benchmarks ---------------------------------------------------------------


def _imported(path: Path) -> set[str]:
    """Every module `path` imports, function-level imports too and relative ones resolved; for
    `from a import b`, both `a` and `a.b` (b may be a module)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return found


def _is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") or p == "conftest" for p in parts)


def test_no_test_module_imports_another_test_module() -> None:
    """What tests share is in plain modules (tests/support/, a suite's own helpers such as
    tests/k8s/helm.py) and shared fixtures in a conftest.py: nothing under tests/ imports a test
    module or a conftest, so running, moving or deleting one test module never breaks another."""
    bad = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in ROOT.glob("tests/**/*.py")
        for name in _imported(path)
        if _is_test_module(name)
    )
    assert not bad, bad


def test_the_benchmarks_and_the_testbed_import_nothing_from_the_tests() -> None:
    """benchmarks/ and testbed/ (the control plane both the tests and benchmarks/e2e.py run on)
    stand on their own: a test may import them, never the other way round."""
    bad = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in [*ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("testbed/**/*.py")]
        for name in _imported(path)
        if name == "tests" or name.startswith("tests.")
    )
    assert not bad, bad
