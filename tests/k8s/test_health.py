"""The probe and metrics endpoints, and the source's and actuator's command lines."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from streams.cli import actuator as actuator_cli
from streams.cli import main
from streams.cli import source as source_cli
from streams.common import health
from streams.common.errors import UsageError
from streams.kube import api as kube
from streams.kube import component, lease


async def test_probes_and_metrics() -> None:
    state = health.Health("test-component")
    stalled: list[str] = []
    state.add_liveness("publisher", lambda: stalled[0] if stalled else None)
    async with (
        health.HealthServer(state, host="127.0.0.1", port=0) as server,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://127.0.0.1:{server.port}"

        async def get(path: str) -> tuple[int, str]:
            async with http.get(base + path) as response:
                return response.status, await response.text()

        assert await get("/livez") == (200, "ok\n")
        assert (await get("/readyz"))[0] == 503  # not ready until the component says so
        state.set_ready()
        assert await get("/readyz") == (200, "ok\n")
        stalled.append("no progress for 120 s")
        assert await get("/livez") == (503, "publisher: no progress for 120 s\n")
        status, metrics = await get("/metrics")
        assert status == 200
        assert 'preemptctl_ready{component="test-component"} 1.0' in metrics
        assert "preemptctl_build_info{" in metrics
        # Metrics of the components are in the same registry, with units and _total.
        assert "# TYPE preemptctl_source_events_total counter" in metrics
        assert "# TYPE preemptctl_actuator_outcomes_total counter" in metrics
        assert "# TYPE preemptctl_source_send_duration_seconds histogram" in metrics


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="preemptctl")
    sub = top.add_subparsers(dest="command")
    source_cli.register(sub)
    actuator_cli.register(sub)
    return top


def test_source_command_line() -> None:
    args = parser().parse_args(
        ["source", "--broker", "kafka://k:9092", "--namespace", "a,b", "--namespace", "c",
         "--label-selector", "tier=batch", "--scheduler-name", "batch", "--tick-seconds", "2",
         "--cluster", "eu1", "--kubeconfig", "/kube/config", "--health-port", "0"]
    )  # fmt: skip
    assert args.func is source_cli.cmd_source
    assert (args.namespace, args.label_selector, args.scheduler_name) == (["a,b", "c"], "tier=batch", "batch")
    assert (args.tick_seconds, args.cluster, args.kubeconfig, args.health_port) == (
        2.0,
        "eu1",
        "/kube/config",
        0,
    )
    with pytest.raises(UsageError, match="expected kafka://host:port"):
        source_cli.cmd_source(parser().parse_args(["source", "--broker", "localhost:9092"]))
    with pytest.raises(SystemExit):
        parser().parse_args(["source", "--broker", "kafka://k:9092", "--tick-seconds", "0"])


def test_actuator_command_line(tmp_path: Path) -> None:
    args = parser().parse_args(
        ["actuator", "--broker", "kafka://k:9092", "--dry-run", "--hmac-key-file", "/k", "--lease-name", "l",
         "--lease-namespace", "ns", "--identity", "me", "--ledger-file", "/var/lib/l.jsonl"]
    )  # fmt: skip
    assert args.func is actuator_cli.cmd_actuator
    assert (args.dry_run, args.lease_name, args.lease_namespace, args.identity) == (True, "l", "ns", "me")
    with pytest.raises(UsageError, match="cannot read --hmac-key-file"):
        actuator_cli.cmd_actuator(args)
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    with pytest.raises(UsageError, match="is empty"):
        actuator_cli.cmd_actuator(
            parser().parse_args(["actuator", "--broker", "kafka://k:1", "--hmac-key-file", str(empty)])
        )
    with pytest.raises(UsageError, match="go together"):
        actuator_cli.cmd_actuator(
            parser().parse_args(["actuator", "--broker", "kafka://k:1", "--lease-name", "l"])
        )


def test_lease_timings_are_flags_and_nonsense_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    defaults = parser().parse_args(["actuator", "--broker", "kafka://k:1"])
    assert (defaults.lease_duration, defaults.renew_deadline, defaults.retry_period) == (
        lease.LEASE_DURATION_S,
        lease.RENEW_DEADLINE_S,
        lease.RETRY_PERIOD_S,
    )
    tuned = parser().parse_args(
        ["source", "--broker", "kafka://k:1", "--lease-duration", "30", "--renew-deadline", "20",
         "--retry-period", "4"]
    )  # fmt: skip
    assert (tuned.lease_duration, tuned.renew_deadline, tuned.retry_period) == (30, 20.0, 4.0)
    for command in ("source", "actuator"):
        for timings, why in (
            (["--renew-deadline", "15"], "need retry period < renew deadline < lease duration"),
            (["--retry-period", "10"], "need retry period < renew deadline < lease duration"),
            (["--retry-period", "0"], "retry period must be positive"),
            (["--renew-deadline", "4", "--retry-period", "1"], "must exceed the 5s write timeout"),
        ):
            code = main.main([command, "--broker", "kafka://k:1", "--lease-name", "l", "--lease-namespace",
                              "ns", *timings])  # fmt: skip
            err = capsys.readouterr().err
            assert code == 2 and err.count("\n") == 1 and why in err, (command, timings, err)
    with pytest.raises(SystemExit):  # the Lease records whole seconds
        parser().parse_args(["actuator", "--broker", "kafka://k:1", "--lease-duration", "12.5"])


class _Stop(BaseException):
    """Not an Exception: ends the Lease loop, as nothing of one round may."""


@pytest.mark.parametrize("command", ["source", "actuator"])
async def test_a_dead_lease_loop_turns_livez_red(command: str) -> None:
    """The elector the commands build is a /livez check of their Health from the start."""
    args = parser().parse_args(
        [command, "--broker", "kafka://k:1", "--lease-name", "l", "--lease-namespace", "ns"]
    )
    state = health.Health(command)
    api = kube.for_host("http://127.0.0.1:9")  # nothing listens: the release on the way out fails, logged
    try:
        elected = component.elector(args, api, state)
        assert elected is not None and state.liveness() == []

        async def dies() -> bool:
            raise _Stop

        elected.try_acquire_or_renew = dies  # type: ignore[method-assign]
        with pytest.raises(_Stop):
            await elected.run()
        assert [f for f in state.liveness() if f.startswith("lease: Lease loop ended")]
    finally:
        await api.close()


async def test_the_lease_loop_survives_a_stray_cancellation_but_obeys_a_real_one() -> None:
    """A CancelledError out of one round that nobody asked for (a library cancelling its own inner
    future and letting the error escape) is a failed round like any other: the loop goes on. A
    cancellation of the loop's task ends it, and is not swallowed."""
    api = kube.for_host("http://127.0.0.1:9")
    try:
        elected = lease.LeaseElector(api, name="l", namespace="ns", identity="me", retry_period_s=0.01,
                                     renew_deadline_s=6, lease_duration_s=7)  # fmt: skip
        rounds: list[int] = []

        async def stray() -> bool:
            rounds.append(1)
            if len(rounds) == 1:
                raise asyncio.CancelledError  # not a cancellation of the loop's task
            return False

        elected.try_acquire_or_renew = stray  # type: ignore[method-assign]
        task = asyncio.create_task(elected.run())
        deadline = time.monotonic() + 5
        while len(rounds) < 3:
            assert time.monotonic() < deadline and not task.done(), "the loop ended at a stray CancelledError"
            await asyncio.sleep(0.01)
        assert elected.liveness() is None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await api.close()
