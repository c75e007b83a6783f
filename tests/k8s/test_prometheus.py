"""A real Prometheus scraping a real pipeline on loopback: dashboard queries, alert rules, lag under SIGSTOP.

The source, the worker and the actuator run as `preemptctl` processes against an
embedded broker of their own and the kmock API server (a node full of
low-priority pods, a pending high-priority one, one victim whose eviction a PDB
keeps refusing), each with its /metrics. Prometheus (Debian's package; `make
test` installs it) scrapes them every second and loads the chart's rule file.
The test reads only Prometheus' HTTP API:
- every query of every dashboard panel returns at least one series;
- the rules load and evaluate, the two the scenario calls for fire, the others do not;
- the worker's lag rises while it is stopped (SIGSTOP) and falls once it resumes.
It also reads each topic with the CloudEvents SDK's Kafka binding: typed
events whose ids are the decision records' (and decision + victim uid for outcomes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiokafka import AIOKafkaProducer
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from kubernetes_asyncio import client

from schemas import chain, records
from streams.brokers import embedded
from streams.brokers import process as process_mod
from streams.kafka import reading, topics
from tests.k8s import objects
from tests.k8s.commands import MAIN, kubeconfig, ready, until
from tests.k8s.fakeapi import FakeApi
from tests.support import tools

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "deploy" / "helm" / "preemptctl" / "files"
# Prometheus scrapes and evaluates the rules this often: the test waits in seconds, not minutes.
SCRAPE_INTERVAL = "1s"
# What Grafana puts in for $__rate_interval; a few scrapes wide.
RATE_INTERVAL = "30s"
# The source's TICK period: a steady flow of records, so lag builds up while the worker is stopped.
TICK_SECONDS = "0.1"
LAG_INTERVAL_SECONDS = "0.5"
# Prometheus starts in about a second; this covers a loaded machine.
PROMETHEUS_READY_TIMEOUT_S = 30.0
# From the components' start to every panel having data: group joins on tansu (docs/architecture.md §6),
# the decision, and a PDB-blocked eviction's retries (~15 s, streams.kube.eviction).
SCENARIO_TIMEOUT_S = 120.0
# The worker stays stopped at most this long: below its 6 s session timeout, so the group
# does not rebalance, and long enough for ~20 TICK records to pile up.
PAUSE_MAX_S = 5.0
# Lag the stopped worker must reach, in records, for "rises" to mean something.
LAG_RISE = 5
# A caught-up worker: the committed offset trails the log end by at most this (commits every 1 s).
CAUGHT_UP = 12
# After SIGCONT the worker folds the backlog and commits within this long.
RECOVERY_TIMEOUT_S = 45.0
POLL_S = 0.25
# Every component logs JSON here, and the test reads it back (streams.common.logs).
LOGS = ("--log-format", "json", "--log-level", "INFO")
HELM_TEST = FILES / "helm-test.py"
WORKER_GROUP = "preemptctl-worker"
# Low pods: three at priority 5 and one at 0. The preemptor needs three of them gone; the
# reprieve gives a priority-5 pod back, so `low-0` is always a victim, and its eviction is the
# one a PDB blocks (the fake API answers 429 every time).
LOW_PODS = {"low-0": 0, "low-1": 5, "low-2": 5, "low-3": 5}
BLOCKED = "low-0"


def prometheus_binary() -> str:
    return tools.need("prometheus", "prometheus")


class Prometheus:
    """A Prometheus server on loopback and its HTTP API."""

    def __init__(self, tmp_path: Path, targets: dict[str, int]) -> None:
        self.port = process_mod.free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {
                "scrape_interval": SCRAPE_INTERVAL,
                "scrape_timeout": "900ms",
                "evaluation_interval": SCRAPE_INTERVAL,
            },
            "rule_files": [str(FILES / "prometheus-rules.yaml")],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in targets.items()
            ],
        }
        path = tmp_path / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = tmp_path / "prometheus.log"
        self.process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    async def ready(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + PROMETHEUS_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-2000:]
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{self.url}/-/ready") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(POLL_S)
        raise AssertionError(f"prometheus not ready: {self.log.read_text()[-2000:]}")

    async def api(self, http: aiohttp.ClientSession, path: str, **params: str) -> Any:
        async with http.get(f"{self.url}/api/v1/{path}", params=params) as response:
            body = await response.json()
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, http: aiohttp.ClientSession, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = (await self.api(http, "query", query=expr))["result"]
        return result

    async def value(self, http: aiohttp.ClientSession, expr: str) -> float | None:
        result = await self.query(http, expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def world(fake: FakeApi) -> None:
    fake.create("nodes", objects.node("n1"))
    for name, priority in LOW_PODS.items():
        fake.create("pods", objects.pod(name, node="n1", priority=priority))
    fake.evictions_answer("default", BLOCKED, [429] * 100)


def preemptor(fake: FakeApi) -> None:
    """Created once the source has listed the full node: an initial list may hold it first, and fit."""
    fake.create("pods", objects.pod("high", priority=1000, cpu="3", unschedulable=True))


# One record each stage must refuse, bytes that are not JSON. The worker also reads the
# decisions topic when it opens a partition, and must pass over this one.
POISON = {
    records.CLUSTER_EVENTS: b"\x00not json",
    records.DECISIONS: b"\x00not json either",
}


async def poison(bootstrap: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for topic, value in POISON.items():
            await producer.send_and_wait(topic, value, key=b"default")
    finally:
        await producer.stop()


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s: {what}")
        await asyncio.sleep(POLL_S)


def logs(tmp_path: Path) -> str:
    """The tail of every process' log, for a failure message."""
    return "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}" for log in sorted(tmp_path.glob("*.log"))
    )


def dashboard_queries() -> list[tuple[str, str]]:
    """Every panel's query as Grafana sends it with each variable at All (`.*`: the components run
    outside Kubernetes here, so their series have no namespace label, which `.*` matches)."""
    board = json.loads((FILES / "grafana-dashboard.json").read_text())
    variables = {f"${v['name']}": v["allValue"] for v in board["templating"]["list"] if "allValue" in v}
    queries = []
    for p in board["panels"]:
        for t in p.get("targets", []) if p["type"] != "row" else []:
            expr = t["expr"].replace("$__rate_interval", RATE_INTERVAL)
            for name, value in variables.items():
                expr = expr.replace(name, value)
            queries.append((p["title"], expr))
    return queries


@contextlib.asynccontextmanager
async def spawn(log: Path, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`preemptctl ARGS` as the console script runs it, output to a file (an unread pipe fills up)."""
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", MAIN, *args, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
        try:
            yield process
        finally:
            if process.returncode is None:
                process.kill()  # SIGKILL ends a stopped process too
                await process.wait()


@contextlib.asynccontextmanager
async def components(
    bootstrap: str, tmp_path: Path, kube: Path, ports: dict[str, int]
) -> AsyncIterator[dict[str, asyncio.subprocess.Process]]:
    broker = f"kafka://{bootstrap}"
    health = ("--health-host", "127.0.0.1")
    # Signed as deployed (Ed25519): the worker holds the private key, the actuator the public one.
    private = chain.new_private_pem()
    for where, key in (("worker-key", private), ("signing-keys", chain.public_pem(private))):
        (tmp_path / where).mkdir()
        (tmp_path / where / "k1").write_bytes(key)
    async with (
        spawn(
            tmp_path / "source.log", "source", "--broker", broker, "--kubeconfig", str(kube),
            "--tick-seconds", TICK_SECONDS, "--health-port", str(ports["source"]), *health, *LOGS,
            "--lease-name", "preemptctl-source", "--lease-namespace", "ops", "--identity", "source-0",
        ) as source,
        spawn(
            tmp_path / "worker.log", "worker", "--broker", broker, "--store-dir", str(tmp_path / "store"),
            "--config", str(tmp_path / "engine.yaml"), "--health-port", str(ports["worker"]), *health, *LOGS,
            "--hmac-key-file", str(tmp_path / "worker-key" / "k1"),
        ) as worker,
        spawn(
            tmp_path / "actuator.log", "actuator", "--broker", broker, "--kubeconfig", str(kube),
            "--lease-name", "preemptctl-actuator", "--lease-namespace", "ops", "--identity", "actuator-0",
            "--lag-interval-seconds", LAG_INTERVAL_SECONDS, "--health-port", str(ports["actuator"]), *health,
            *LOGS, "--signing-keys-dir", str(tmp_path / "signing-keys"), "--any-scheduler",
        ) as actuator,
    ):  # fmt: skip
        yield {"source": source, "worker": worker, "actuator": actuator}


async def test_prometheus_scrapes_the_pipeline(
    served: tuple[FakeApi, client.ApiClient], tmp_path: Path
) -> None:
    prometheus_binary()  # skip before anything starts when Prometheus cannot be had
    fake, api = served
    world(fake)
    (tmp_path / "engine.yaml").write_text("victimAction: evict\n")
    kube = kubeconfig(tmp_path, api)
    ports = {name: process_mod.free_loopback_port() for name in ("source", "worker", "actuator")}
    started = time.monotonic()
    with embedded.EmbeddedBroker(log_path=tmp_path / "tansu.log") as tansu:
        await topics.ensure_topics(tansu.bootstrap)
        await poison(tansu.bootstrap)
        prometheus = Prometheus(tmp_path, ports)
        try:
            async with (
                aiohttp.ClientSession() as http,
                components(tansu.bootstrap, tmp_path, kube, ports) as procs,
            ):
                try:
                    await prometheus.ready(http)
                    for name, proc in procs.items():
                        await until(lambda name=name: ready(ports[name]), f"{name} ready", proc)
                    preemptor(fake)
                    await check_lag_under_sigstop(prometheus, http, procs["worker"])
                    await check_dashboard_and_rules(prometheus, http)
                    check_helm_test(ports)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{logs(tmp_path)}") from None
            await check_cloudevents(tansu.bootstrap)
            check_logs(tmp_path)
        finally:
            prometheus.stop()
    print(f"\nprometheus scenario: {time.monotonic() - started:.1f} s")


async def check_lag_under_sigstop(
    prometheus: Prometheus, http: aiohttp.ClientSession, worker: asyncio.subprocess.Process
) -> None:
    lag = f'max(preemptctl_consumer_group_lag_records{{group="{WORKER_GROUP}"}})'

    async def caught_up() -> bool:
        behind = await prometheus.value(http, lag)
        decided = await prometheus.value(http, "sum(preemptctl_decisions_total)")
        return behind is not None and behind <= CAUGHT_UP and bool(decided)

    await eventually(caught_up, "the worker decides and catches up with the log", SCENARIO_TIMEOUT_S)
    before = await prometheus.value(http, lag)
    assert before is not None
    os.kill(worker.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    seen, up = [before], 1.0
    try:
        # Until the lag has risen while Prometheus can no longer scrape the stopped worker:
        # what it shows then is the broker's view, exported by the actuator.
        while time.monotonic() - stopped < PAUSE_MAX_S and (seen[-1] < before + LAG_RISE or up != 0.0):
            await asyncio.sleep(POLL_S)
            seen.append(await prometheus.value(http, lag) or 0.0)
            up = await prometheus.value(http, 'up{job="worker"}') or 0.0
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert seen[-1] >= before + LAG_RISE, f"lag while stopped: {seen}"
    assert up == 0.0, "the stopped worker was still scraped"
    peak = seen[-1]

    async def recovered() -> bool:
        behind = await prometheus.value(http, lag)
        return behind is not None and behind <= CAUGHT_UP and behind < peak

    await eventually(recovered, f"the lag falls after SIGCONT (peak {peak:g})", RECOVERY_TIMEOUT_S)
    # The worker's own view came back too, with its scrapes.
    await eventually(
        lambda: _has(prometheus, http, 'preemptctl_worker_lag_records and on() up{job="worker"} == 1'),
        "the worker's own lag is scraped again",
        RECOVERY_TIMEOUT_S,
    )


async def _has(prometheus: Prometheus, http: aiohttp.ClientSession, expr: str) -> bool:
    return bool(await prometheus.query(http, expr))


async def check_dashboard_and_rules(prometheus: Prometheus, http: aiohttp.ClientSession) -> None:
    queries = dashboard_queries()

    async def every_panel_has_data() -> bool:
        return all([await _has(prometheus, http, expr) for _, expr in queries])

    try:
        await eventually(every_panel_has_data, "every dashboard query returns a series", SCENARIO_TIMEOUT_S)
    except AssertionError:
        empty = [f"{title}: {expr}" for title, expr in queries if not await _has(prometheus, http, expr)]
        raise AssertionError("panels without data:\n" + "\n".join(empty)) from None

    groups = (await prometheus.api(http, "rules", type="alert"))["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert len(rules) == len(
        yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())["groups"][0]["rules"]
    )
    assert all(r["health"] == "ok" for r in rules.values()), rules

    async def alerts() -> set[str]:
        found = (await prometheus.api(http, "alerts"))["alerts"]
        return {a["labels"]["alertname"] for a in found if a["state"] == "firing"}

    expected = {"PreemptctlDeadLettersRising", "PreemptctlEvictionsBlockedByPDB"}

    async def fired() -> bool:
        return expected <= await alerts()

    await eventually(fired, f"{sorted(expected)} fire", SCENARIO_TIMEOUT_S)
    assert await alerts() == expected  # a leader holds the Lease, every component is up and writing
    stages = {r["metric"]["stage"] for r in await prometheus.query(http, "preemptctl_dead_letters_total")}
    assert stages == {"worker", "actuator"}


async def check_cloudevents(bootstrap: str) -> None:
    """Every record on the three topics, read as a CloudEvent by the SDK's Kafka binding."""

    async def read(topic: str) -> list[tuple[Any, reading.Message]]:
        out = []
        async for m in reading.read_all(bootstrap, topic):
            headers = dict(m.headers)
            if "ce_specversion" not in headers:
                assert m.value == POISON[topic], m  # only the test's own records come without
                continue
            message = ce_kafka.KafkaMessage(headers=headers, key=m.key, value=m.value)
            out.append((ce_kafka.from_binary(message, JSONFormat(), CloudEvent), m))
        return out

    decisions = await read(records.DECISIONS)
    assert decisions
    ids = set()
    for event, m in decisions:
        record = orjson.loads(m.value)
        assert (event.get_id(), event.get_type()) == (record["id"], "io.preemptctl.decision.v1")
        assert event.get_data() == record
        ids.add(record["id"])
    assert ids
    outcomes = await read(records.EVICTIONS)
    assert outcomes
    for event, m in outcomes:
        record = orjson.loads(m.value)
        assert record["decisionId"] in ids
        assert event.get_id() == f"{record['decisionId']}/{record['victim']['uid']}"
        assert (event.get_type(), event.get_subject()) == (
            "io.preemptctl.eviction.v1",
            f"default/{record['victim']['name']}",
        )
    # The blocked victim's preemptor is decided again (issue 22): the victim already evicted is
    # then listed as terminating, and the blocked one is tried again.
    results = {orjson.loads(m.value)["result"] for _, m in outcomes}
    assert {"done", "blocked-by-pdb"} <= results <= {"done", "blocked-by-pdb", "already-terminating"}
    dead = {event.get_id(): event for event, _ in await read(records.DEAD_LETTER)}
    assert set(dead) == {"preemption.cluster-events/0/0", "preemption.decisions/0/0"}
    assert {e.get_type() for e in dead.values()} == {"io.preemptctl.deadletter.v1"}


def check_helm_test(ports: dict[str, int]) -> None:
    """The chart's `helm test` script, against the running components: all ready; a dead one is named."""
    targets = [f"127.0.0.1:{port}" for port in ports.values()]
    ok = subprocess.run(
        [sys.executable, str(HELM_TEST), *targets], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("ok ") == 3
    dead = f"127.0.0.1:{process_mod.free_loopback_port()}"
    failed = subprocess.run(
        [sys.executable, str(HELM_TEST), *targets, dead], capture_output=True, text=True, timeout=60
    )
    assert failed.returncode == 1 and f"FAIL 127.0.0.1 {dead}" in failed.stdout, failed.stdout


def check_logs(tmp_path: Path) -> None:
    """Each component's output is JSON lines only (no escape codes, no faust banner or spinner),
    and its decision lines carry the decision id, the cluster and the pod."""
    for component in ("source", "worker", "actuator"):
        text = (tmp_path / f"{component}.log").read_text()
        assert "\x1b" not in text, component
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert lines, component
        assert all({"ts", "level", "logger", "component", "msg"} <= line.keys() for line in lines), component
        assert {line["component"] for line in lines} == {component}
        if component == "source":
            continue
        decided = [line for line in lines if "decision" in line]
        assert decided, f"{component}: no decision line"
        for line in decided:
            assert line["cluster"] == "default" and line["decision"].startswith("default/")
            assert "/" in line["pod"]
        if component == "worker":
            assert any(line["msg"].startswith("preempt default/") for line in decided)
        else:
            assert {line["pod"] for line in decided} >= {f"default/{BLOCKED}"}
