"""The one lifecycle of the servers a test or a benchmark runs: start, wait until ready, stop, clean up.

`Lifecycle` is `with` over a server's `start()` and `stop()`: a start that fails part-way
stops what it had started before the error goes on, and leaving the block stops everything.
The steps every server repeats are here once:
- `spawn`: a child process whose output goes to a log file (kept for the failure message);
- `wait_ready`: poll a readiness check, failing at once when a child exits meanwhile, and
  after a deadline otherwise, with the log's tail in the message;
- `terminate`: a signal (SIGTERM), a bounded wait, then SIGKILL; to the child or its group;
- `log_tail`: the last lines of a log.
`TestCluster` (etcd + kube-apiserver), `KubeScheduler`, `ControlPlane` (those and kwok) and
`Stack` (preemptctl's components) are each a `Lifecycle` built from these.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Self


class Lifecycle:
    """`with server:` starts it and stops it; `stop()` is safe on a server started part-way or not at all."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn(argv: Sequence[Any], log: Path, *, cwd: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """`argv` as a child process in `cwd`, its stdout and stderr written to `log` until it ends."""
    with open(log, "wb") as out:  # the child holds its own descriptor: ours may close
        return subprocess.Popen(
            [str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, cwd=cwd, **popen
        )


def wait_ready(
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
    *,
    children: Iterable[subprocess.Popen[bytes]],
    tail: Callable[[], str],
    every_s: float = 0.1,
    error: type[Exception] = RuntimeError,
) -> None:
    """Poll `ready` every `every_s` until it holds; `error` (with `tail()`) when one of `children`
    exits first, or when `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        for child in children:
            if child.poll() is not None:
                raise error(f"{what} exited ({child.returncode}): {tail()}")
        if time.monotonic() > deadline:
            raise error(f"{what} not ready after {timeout_s:g}s: {tail()}")
        time.sleep(every_s)


def terminate(
    process: subprocess.Popen[bytes],
    timeout_s: float,
    *,
    sig: signal.Signals = signal.SIGTERM,
    group: bool = False,
) -> None:
    """`sig` to a running `process` (to its whole process group with `group`), then SIGKILL when
    it has not ended within `timeout_s`; returns once it is gone."""
    if process.poll() is not None:
        return

    def send(signum: signal.Signals) -> None:
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)

    send(sig)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()


def log_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of the log at `path` ("" before it exists)."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
