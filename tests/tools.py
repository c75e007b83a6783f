"""Programs some tests need from Debian's packages (`make test` installs them when absent)."""

from __future__ import annotations

import shutil

import pytest


def need(program: str, package: str) -> str:
    """The path of `program`; without it the test skips and says where to get it (never a silent pass)."""
    found = shutil.which(program)
    if found is None:
        pytest.skip(
            f"{program} not found: install Debian's {package} package "
            f"(make test does: apt-get install {package})"
        )
    return found
