"""testbed.lifecycle, the start/stop lifecycle of every test server, on plain child processes.

The servers themselves (kube-apiserver + etcd, kube-scheduler, kwok, preemptctl's processes) are
exercised by the tests under tests/k8s, tests/e2e and tests/parity; this checks the steps they share
without them: a failed start stops what it started, readiness fails fast on an exited child and
after its deadline otherwise, a child that ignores SIGTERM is killed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import lifecycle


class Sleeper(lifecycle.Lifecycle):
    """A child that sleeps, ready once its log says so; `fail` makes the start raise after spawning."""

    def __init__(self, root: Path, *, fail: bool = False) -> None:
        self.root, self.fail = root, fail
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped = 0

    def start(self) -> None:
        code = "import time; print('up', flush=True); time.sleep(60)"
        self.process = lifecycle.spawn([sys.executable, "-c", code], self.root / "s.log", cwd=self.root)
        lifecycle.wait_ready(
            lambda: "up" in lifecycle.log_tail(self.root / "s.log", 1),
            "sleeper",
            30,
            children=[self.process],
            tail=lambda: lifecycle.log_tail(self.root / "s.log", 5),
        )
        if self.fail:
            raise RuntimeError("half started")

    def stop(self) -> None:
        self.stopped += 1
        if self.process is not None:
            lifecycle.terminate(self.process, 5)


def test_with_starts_and_stops(tmp_path: Path) -> None:
    with Sleeper(tmp_path) as running:
        assert running.process is not None and running.process.poll() is None
    assert running.process.poll() is not None and running.stopped == 1


def test_a_failed_start_stops_what_it_started(tmp_path: Path) -> None:
    server = Sleeper(tmp_path, fail=True)
    with pytest.raises(RuntimeError, match="half started"), server:
        pass
    assert server.stopped == 1
    assert server.process is not None and server.process.poll() is not None


def test_readiness_fails_at_once_when_a_child_exits(tmp_path: Path) -> None:
    child = lifecycle.spawn(
        [sys.executable, "-c", "print('broken'); raise SystemExit(3)"], tmp_path / "c.log", cwd=tmp_path
    )
    began = time.monotonic()
    with pytest.raises(AssertionError, match=r"child exited \(3\): broken"):
        lifecycle.wait_ready(
            lambda: False,
            "child",
            60,
            children=[child],
            tail=lambda: lifecycle.log_tail(tmp_path / "c.log", 5),
            error=AssertionError,
        )
    assert time.monotonic() - began < 30


def test_readiness_fails_after_its_deadline(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"never not ready after 0\.3s: the tail"):
        lifecycle.wait_ready(lambda: False, "never", 0.3, children=[], tail=lambda: "the tail")


def test_a_child_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    child = lifecycle.spawn([sys.executable, "-c", code], tmp_path / "c.log", cwd=tmp_path)
    lifecycle.wait_ready(
        lambda: "up" in lifecycle.log_tail(tmp_path / "c.log", 1), "child", 30, children=[child], tail=str
    )
    lifecycle.terminate(child, 0.5)
    assert child.returncode == -signal.SIGKILL
    lifecycle.terminate(child, 0.5)  # already gone: nothing to do


def test_log_tail_before_the_log_exists(tmp_path: Path) -> None:
    assert lifecycle.log_tail(tmp_path / "none.log", 3) == ""
