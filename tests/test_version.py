"""One version from one place: engine.ENGINE_VERSION is the package's, every decision record's
(`engineVersion`), the chart's version and appVersion, and the image tag the chart runs."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import yaml

from engine import ENGINE_VERSION
from streams.sim import traces
from tests.k8s import helm
from tests.support import audit_traces

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_takes_its_version_from_the_engine() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "engine.ENGINE_VERSION"}
    assert version("preemptctl") == ENGINE_VERSION  # the installed distribution's metadata


def test_decision_records_carry_it() -> None:
    records = audit_traces.decisions(traces.example())
    assert records and {r["engineVersion"] for r in records} == {ENGINE_VERSION}


def test_the_chart_and_its_image_carry_it() -> None:
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "preemptctl" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == ENGINE_VERSION
    docs = helm.manifests(helm.values())
    images = {c["image"] for d in docs for c in _containers(d)}
    assert images == {f"ghcr.io/preemptctl/preemptctl:{ENGINE_VERSION}"}


def _containers(doc: dict) -> list[dict]:  # type: ignore[type-arg]
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec) if doc["kind"] != "Pod" else spec
    return list(pod.get("containers", []))


def test_the_cli_and_the_build_info_metric_say_it() -> None:
    done = subprocess.run([sys.executable, "-m", "streams.cli", "--version"], capture_output=True, text=True)
    assert done.stdout.strip() == f"preemptctl {ENGINE_VERSION}"
    from streams.common import health

    assert health._version() == ENGINE_VERSION


def test_the_changelog_and_license_are_there() -> None:
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{ENGINE_VERSION}]" in changelog or "## [Unreleased]" in changelog
