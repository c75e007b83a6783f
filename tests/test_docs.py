"""The docs match the code: their commands run, their Python imports, the files they name exist.

For README.md and every docs/*.md:
- every shell block (```sh, ```bash, ```console, or any block whose lines start with `$ `)
  is run, command by command, unless an HTML comment right above it says why not:
  `<!-- docs-check: needs-cluster -->` (a Kubernetes cluster, Docker, Maven or a Kafka
  other than the test's), `<!-- docs-check: starts-broker -->` (it starts the broker the test
  provides itself), `<!-- docs-check: runs-the-tests -->` (`make test` inside `make test`),
  `<!-- docs-check: runs-a-benchmark -->` (minutes of load on a control plane of its own:
  docs/performance.md shows what it printed).
  Commands run in one scratch directory per document (the repository's top-level entries
  linked into it, `.venv/bin` first on PATH), in document order, so a walk-through's later
  steps see the files its earlier ones wrote; audit.md runs after the walk-through it quotes.
  `kafka://127.0.0.1:9092` (and `-b 127.0.0.1:9092`) is a fresh embedded broker of the test.
  Each command must exit 0, or with the status a `# exit status N` line after its output says,
  and print the verdict lines its transcript shows (`intact: ...`, `FAILED at ...`) as shown;
- every ```python block compiles, and its imports import;
- every repository path a document or a `--help` names (docs/..., examples/..., deploy/...,
  streams/..., tests/..., testbed/..., a relative Markdown link) exists.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from streams.brokers import embedded
from streams.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Run first: later documents quote the files it writes (audit.md: decisions.jsonl, edited.jsonl).
RUN_ORDER = ["audit-walkthrough.md", "audit.md"]
MARKERS = {"needs-cluster", "starts-broker", "runs-the-tests", "runs-a-benchmark"}
SHELL = {"sh", "bash", "console", "shell"}
BLOCK = re.compile(r"(?:<!-- docs-check: ([\w-]+) -->\s*\n)?( *)```(\w*)\n(.*?)\n\2```", re.S)
EXIT_STATUS = re.compile(r"^# exit status (\d+)$")
# One documented command: `preemptctl run` starts a broker and a worker and plays a trace.
COMMAND_TIMEOUT_S = 180
DOC_BROKER = "127.0.0.1:9092"
# Repository paths as documents and --help name them.
REPO_PATH = re.compile(
    r"(?<![\w./~-])((?:docs|examples|deploy|streams|tests|testbed|schemas|engine|benchmarks|conformance)/[\w./-]*\w)"
)
# A path a document names as an example of its own, not a file of this repository.
NOT_FILES = {"deploy/helm/preemptctl/templates/", "tests/e2e", "tests/parity"}


@dataclass
class Block:
    doc: Path
    line: int
    lang: str
    marker: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


# Output lines a transcript shows that do not vary between runs (no timings, no ports): the
# command must print them exactly (a stale chain head in a doc fails here).
CHECKED_OUTPUT = ("intact: ", "FAILED at ", "0 decision(s) differ")


@dataclass
class Command:
    text: str
    status: int = 0
    block: Block | None = field(default=None, repr=False)
    output: list[str] = field(default_factory=list)


def blocks(doc: Path) -> Iterator[Block]:
    text = doc.read_text()
    for match in BLOCK.finditer(text):
        marker, indent, lang, body = match.group(1), match.group(2), match.group(3), match.group(4)
        body = "\n".join(line[len(indent) :] for line in body.splitlines())
        yield Block(doc, text[: match.start(3)].count("\n") + 1, lang, marker, body)


def is_shell(block: Block) -> bool:
    if block.lang in SHELL:
        return True
    return not block.lang and any(line.startswith("$ ") for line in block.text.splitlines())


def commands(block: Block) -> list[Command]:
    """The commands of a block: `$ ` lines of a transcript (output lines skipped), or every line."""
    lines = block.text.splitlines()
    transcript = any(line.startswith("$ ") for line in lines)
    found: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        status = EXIT_STATUS.match(line.strip())
        if status and found:
            found[-1].status = int(status.group(1))
            i += 1
            continue
        if transcript and not line.startswith("$ "):
            if found:
                found[-1].output.append(line)
            i += 1
            continue
        text = line[2:] if transcript else line
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        if text.strip() and not text.lstrip().startswith("#"):
            found.append(Command(text, block=block))
        i += 1
    return found


def test_every_marker_is_known_and_every_shell_block_is_classified() -> None:
    for doc in DOCS:
        for block in blocks(doc):
            assert block.marker is None or block.marker in MARKERS, f"{block.where}: {block.marker}"
            if block.marker:
                assert is_shell(block), f"{block.where}: a marker on a block that is not shell"
            if is_shell(block):
                assert commands(block), f"{block.where}: a shell block without a command"


def _scratch(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (work / entry.name).symlink_to(entry)
    return work


def _ordered_docs() -> list[Path]:
    first = [ROOT / "docs" / name for name in RUN_ORDER]
    return first + [d for d in DOCS if d not in first]


def test_every_runnable_shell_command_runs(tmp_path: Path) -> None:
    work = _scratch(tmp_path)
    env = dict(os.environ)
    env["PATH"] = (
        f"{ROOT / '.venv' / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    )
    env["PYTHONPATH"] = str(ROOT)
    ran, skipped = 0, []
    with embedded.EmbeddedBroker(log_path=tmp_path / "tansu.log") as tansu:
        for doc in _ordered_docs():
            for block in blocks(doc):
                if not is_shell(block):
                    continue
                if block.marker:
                    skipped.append(f"{block.where} ({block.marker})")
                    continue
                for command in commands(block):
                    text = command.text.replace(DOC_BROKER, tansu.bootstrap)
                    done = subprocess.run(
                        ["bash", "-o", "pipefail", "-c", text],
                        cwd=work, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                    )  # fmt: skip
                    assert done.returncode == command.status, (
                        f"{block.where}: `{command.text}` exited {done.returncode}, the doc says "
                        f"{command.status}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
                    )
                    for line in command.output:
                        if line.startswith(CHECKED_OUTPUT):
                            printed = (done.stdout + done.stderr).splitlines()
                            assert line in printed, f"{block.where}: `{command.text}` does not print {line!r}"
                    ran += 1
    print(f"\n{ran} documented commands ran; skipped as marked: {', '.join(skipped)}")
    assert ran > 40  # the walk-through alone has more: a parser that finds none fails here


def test_every_python_snippet_compiles_and_its_imports_import() -> None:
    snippets = [b for doc in DOCS for b in blocks(doc) if b.lang == "python"]
    assert snippets
    for block in snippets:
        import ast

        # Snippets may await at top level (they show the body of a coroutine).
        tree = compile(
            block.text, block.where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        imports = [
            ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
        ]
        assert imports, f"{block.where}: a snippet that imports nothing uses names from nowhere"
        done = subprocess.run(
            [sys.executable, "-c", "\n".join(imports)], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{block.where}: {done.stderr.strip().splitlines()[-1:]}"


def _help_texts() -> Iterator[tuple[str, str]]:
    yield "preemptctl --help", cli.build_parser().format_help()
    for command in cli.COMMANDS:
        parser = cli.build_parser([command.name])
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        stack = [(f"preemptctl {command.name}", sub.choices[command.name])]
        while stack:
            name, current = stack.pop()
            yield f"{name} --help", current.format_help()
            for action in current._actions:
                if isinstance(action, argparse._SubParsersAction):
                    stack += [(f"{name} {k}", v) for k, v in action.choices.items()]


def _named_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in REPO_PATH.findall(text)} - NOT_FILES


def test_every_file_a_doc_or_help_names_exists() -> None:
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for path in _named_paths(text):
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in link:
                continue
            if not (doc.parent / link).exists():
                missing.append(f"{doc.relative_to(ROOT)}: link {link}")
    for where, text in _help_texts():
        for path in _named_paths(text):
            if not (ROOT / path).exists():
                missing.append(f"{where}: {path}")
    for case in sorted((ROOT / "examples").rglob("*.yaml")):
        for path in _named_paths(case.read_text()):
            if not (ROOT / path).exists():
                missing.append(f"{case.relative_to(ROOT)}: {path}")
    assert not missing, "\n".join(missing)


def test_the_decision_record_docs_show_is_the_bundled_examples_first() -> None:
    """docs/topics.md says its example records come from a real run of the bundled example:
    its decision record (hash included) is the first one `run` decides, so a change of the
    engine, its version or the record's shape shows here."""
    from streams.sim import traces
    from tests.support import audit_traces

    text = (ROOT / "docs" / "topics.md").read_text()
    (shown,) = [b for b in re.findall(r"```json\n(.*?)\n```", text, re.S) if b.startswith('{\n  "v": 1,')]
    assert orjson.loads(shown) == audit_traces.decisions(traces.example())[0]


@pytest.mark.parametrize("text", ["see docs/nope.md", "preemptctl --config conformance/NOPE.md"])
def test_the_path_finder_sees_repository_paths(text: str) -> None:
    (path,) = _named_paths(text)
    assert not (ROOT / path).exists()


def test_the_command_parser_reads_transcripts_and_exit_statuses() -> None:
    block = Block(ROOT, 1, "console", None, "$ a \\\n    --b\nout\n# exit status 2\n$ c\n# a comment")
    assert [(c.text, c.status) for c in commands(block)] == [("a  --b", 2), ("c", 0)]
    plain = Block(ROOT, 1, "sh", None, "x --y   # why\n\n# only a comment\nz")
    assert [c.text for c in commands(plain)] == ["x --y   # why", "z"]
    assert shutil.which("bash")
