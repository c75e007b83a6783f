"""Health and metrics over HTTP for every long-running component (source, actuator, worker).

This module owns the probe contract the Helm chart relies on:
- `/livez`: 200 while the event loop answers and every liveness check passes;
  a failing check names itself in the 503 body, so a restart has a reason;
- `/readyz`: 503 until the component says it is ready (the source after its
  initial list is in the log, the actuator after its ledger is recovered);
- `/metrics`: the Prometheus text format of the process's default registry;
- any further GET routes a component adds (`routes=`). The worker's table
  views are not among them: they are the whole cluster inventory and get their
  own server (`RouteServer`, the worker's `--tables-port`, bound to localhost),
  never the port Prometheus and the NetworkPolicy open.

Components record their own metrics where the effect happens; this module only
adds `preemptctl_ready` and `preemptctl_build_info`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Gauge, Info, generate_latest

from engine import ENGINE_VERSION

log = logging.getLogger(__name__)

# The port every component's probes and metrics listen on (the chart's containerPort).
DEFAULT_PORT = 9102
DEFAULT_HOST = "0.0.0.0"

READY = Gauge("preemptctl_ready", "1 when the component is ready to serve, else 0.", ["component"])
BUILD = Info("preemptctl_build", "The running preemptctl version.")

# A liveness check returns None when healthy, else a one-line reason.
LivenessCheck = Callable[[], str | None]
# An extra GET route: (path, handler), path in aiohttp's syntax ("/clusters/{cluster}/pods").
Route = tuple[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]


def _version() -> str:
    """preemptctl's one version (engine.ENGINE_VERSION; the package's and the chart's too)."""
    return ENGINE_VERSION


class Health:
    """Readiness and liveness of one component."""

    def __init__(self, component: str) -> None:
        self.component = component
        self._ready = False
        self._checks: list[tuple[str, LivenessCheck]] = []
        READY.labels(component).set(0)

    @property
    def ready(self) -> bool:
        return self._ready

    def set_ready(self, ready: bool = True) -> None:
        if ready != self._ready:
            log.info("%s is %s", self.component, "ready" if ready else "not ready")
        self._ready = ready
        READY.labels(self.component).set(1 if ready else 0)

    def add_liveness(self, name: str, check: LivenessCheck) -> None:
        self._checks.append((name, check))

    def liveness(self) -> list[str]:
        """The failing checks as `name: reason`; empty when live."""
        failures = []
        for name, check in self._checks:
            reason = check()
            if reason:
                failures.append(f"{name}: {reason}")
        return failures


# Where a server of views for operators binds unless told otherwise: only a port-forward
# (or a process in the pod) reaches it.
LOCALHOST = "127.0.0.1"


class RouteServer:
    """GET routes on their own address, nothing else: `async with RouteServer(routes, port=0) as s`."""

    def __init__(self, routes: Sequence[Route], *, host: str = LOCALHOST, port: int) -> None:
        self._routes = tuple(routes)
        self._host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def _described(self) -> str:
        return "views"

    async def start(self) -> Self:
        app = web.Application()
        for path, handler in self._routes:
            app.router.add_get(path, handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self.port).start()
        # Port 0 asks the OS for a free port; report the one actually bound.
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        log.info("%s on http://%s:%d", self._described(), self._host, self.port)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class HealthServer(RouteServer):
    """The HTTP endpoints of one Health; `async with HealthServer(health, port=0) as s: s.port`."""

    def __init__(
        self,
        health: Health,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        registry: CollectorRegistry = REGISTRY,
        routes: Sequence[Route] = (),
    ) -> None:
        probes: list[Route] = [("/livez", self._livez), ("/readyz", self._readyz)]
        super().__init__([*probes, ("/metrics", self._metrics), *routes], host=host, port=port)
        self.health = health
        self._registry = registry

    def _described(self) -> str:
        return f"{self.health.component} health and metrics"

    async def _livez(self, request: web.Request) -> web.Response:
        failures = self.health.liveness()
        if failures:
            return web.Response(status=503, text="\n".join(failures) + "\n")
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.health.ready:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"{self.health.component} is not ready\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> Self:
        BUILD.info({"version": _version()})
        return await super().start()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--health-host/--health-port`, shared by every component's subcommand."""
    parser.add_argument(
        "--health-port",
        type=int,
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"port of /metrics, /livez and /readyz (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    parser.add_argument(
        "--health-host",
        default=DEFAULT_HOST,
        metavar="HOST",
        help=f"address the health server binds (default {DEFAULT_HOST})",
    )
