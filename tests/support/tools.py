"""Programs some tests need (Debian's packages, the kube tools), and what to do when one is missing.

Plain `pytest` is friendly to a contributor without them: the tests that need a
missing program skip and say where to get it. `make test` sets REQUIRE_TOOLS_ENV,
and then a missing program fails those tests instead: a run that was meant to
exercise everything never passes by silently leaving parts out.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

# Set (to anything but "" or "0") by the Makefile's test targets.
REQUIRE_TOOLS_ENV = "PREEMPTCTL_REQUIRE_TOOLS"


def required() -> bool:
    return os.environ.get(REQUIRE_TOOLS_ENV, "") not in ("", "0")


def unavailable(reason: str) -> NoReturn:
    """Skip with `reason`, or fail with it when the run requires every tool."""
    if required():
        pytest.fail(f"{reason} [{REQUIRE_TOOLS_ENV} is set: this run needs every tool]", pytrace=False)
    pytest.skip(reason)


def need(program: str, package: str) -> str:
    """The path of `program`; without it the test skips (or fails, see above) and says where to get it."""
    found = shutil.which(program)
    if found is None:
        unavailable(
            f"{program} not found: install Debian's {package} package "
            f"(make test does: apt-get install {package})"
        )
    return found


# helm 3, built from its Go module by deploy/kube/build-helm3.sh (make kube-tools) into the kube
# tools' cache: the chart is linted and rendered with it as well as with helm 4 (tests/k8s/test_deploy.py).
HELM3_VERSION = "3.19.0"


def helm3() -> str:
    """The cached helm 3; without it the test skips (or fails, see above) and says how to build it."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "preemptctl" / "kube"
    binary = cache / f"helm-v{HELM3_VERSION}"
    if not binary.exists():
        unavailable(
            f"helm {HELM3_VERSION} not found at {binary}: make kube-tools builds it "
            "(deploy/kube/build-helm3.sh, from the Go module proxy; needs go)"
        )
    return str(binary)
