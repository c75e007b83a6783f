"""Every case in ../shared/conformance through `preemptctl decide`, via its own runner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "run.py"


@pytest.mark.skipif(not RUNNER.exists(), reason="../shared/conformance is not beside this checkout")
def test_conformance_folder_passes() -> None:
    cmd = f"{sys.executable} -m streams.cli decide"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--cmd", cmd], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
