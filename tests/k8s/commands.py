"""preemptctl's commands as child processes, for the command tests (tests/k8s/test_commands.py,
test_prometheus.py, test_real_api.py, test_forged_events.py, test_secure_pipeline.py).

- `command(*args)`: the real entry point (`MAIN`) in a child process until the block ends;
- `ready`, `metric`, `until`: its /readyz, a metric's sum over its labels on /metrics, and a
  bounded wait for either; `stop`: SIGTERM as a kubelet sends it, a clean exit required;
- `kubeconfig(tmp_path, api)`: a kubeconfig file for the kmock API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import yaml
from kubernetes_asyncio import client

# The real entry point, as the console script runs it.
MAIN = "import sys; from streams.cli.main import main; sys.exit(main(sys.argv[1:]))"
# A child process imports, connects and joins a consumer group within this (tansu's
# group join alone takes about half the session timeout, docs/architecture.md §6).
START_TIMEOUT_S = 30.0


def kubeconfig(tmp_path: Path, api: client.ApiClient) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": api.configuration.host}}],
                "users": [{"name": "test", "user": {"token": "test-token"}}],
                "contexts": [{"name": "test", "context": {"cluster": "kmock", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return path


@asynccontextmanager
async def command(*args: str, log: Path | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    """The command in a child process; its stderr goes to `log` when given (a long run's logs
    would fill a pipe nobody reads, and the child would block on it), else to a pipe."""
    with contextlib.ExitStack() as files:
        stderr = files.enter_context(log.open("wb")) if log else asyncio.subprocess.PIPE
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", MAIN, *args, stdout=asyncio.subprocess.DEVNULL, stderr=stderr
        )
        try:
            yield process
        finally:
            if process.returncode is None:
                process.kill()  # SIGKILL ends a stopped (SIGSTOP) child too
                await process.wait()


async def metric(port: int, name: str) -> float:
    """The sum of a metric's samples over all its labels."""
    total = 0.0
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def until(check: Callable[[], object], what: str, process: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if await check():  # type: ignore[misc]
                return
        except aiohttp.ClientError:
            pass  # not listening yet
        if process.returncode is not None or time.monotonic() > deadline:
            stderr = (await process.stderr.read()).decode() if process.stderr else ""
            raise AssertionError(f"{what}: exit {process.returncode}\n{stderr[-3000:]}")
        await asyncio.sleep(0.1)


async def ready(port: int) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/readyz") as response:
        return response.status == 200


async def stop(process: asyncio.subprocess.Process, log: Path | None = None) -> str:
    """SIGTERM, as a kubelet stops a container: a clean exit (0); returns what it logged."""
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), START_TIMEOUT_S)
    except TimeoutError:
        logged = log.read_text(errors="replace")[-3000:] if log else ""
        raise AssertionError(f"no exit {START_TIMEOUT_S:g}s after SIGTERM\n{logged}") from None
    logged = log.read_text(errors="replace") if log else stderr.decode()
    assert process.returncode == 0, logged[-3000:]
    return logged
