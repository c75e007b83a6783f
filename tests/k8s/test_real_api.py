"""The Kubernetes edge against a real kube-apiserver v1.34 (testbed/cluster.py), as the chart's accounts.

The chart is installed in the session's API server by a real `helm template`
and `kubectl apply --server-side`; the source and the actuator authenticate as
their own ServiceAccounts, so RBAC answers as in a cluster, and any 403 to a
component fails the test (the API server's audit log is checked after each
test). Network faults come from a TCP proxy in front of the server
(tests/k8s/proxy.py); the server's own answers are never faked here.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import yaml
from aiokafka import AIOKafkaProducer
from kubernetes_asyncio import client

from engine import projection
from schemas.records import DECISIONS, VictimRecord
from streams.brokers.process import free_loopback_port
from streams.common import health
from streams.kafka import topics as kafka_topics
from streams.kafka.sink import MemorySink
from streams.kube import api as kube
from streams.kube import eviction, lease, source
from streams.kube.actuator import Actuator
from streams.kube.ledger import Ledger
from streams.sim import apiserver
from testbed import cluster
from tests.k8s import decisions
from tests.k8s.cluster_events import fast_backoff
from tests.k8s.cluster_events import running as running_source
from tests.k8s.commands import command, metric, stop
from tests.k8s.decisions import FAST, KEY, ORIGIN, victim
from tests.k8s.helm import CHART, EVERYTHING
from tests.k8s.proxy import FaultProxy
from tests.k8s.real_api import get_pod, pod, preemptor
from tests.k8s.webhook import HoldingWebhook

STEP_TIMEOUT_S = 20.0
NO_TICKS = 3600.0
# Any 403 to a component during a test fails it (tests/k8s/conftest.py).
pytestmark = pytest.mark.usefixtures("no_component_is_forbidden")


# ---- scaffolding ---------------------------------------------------------------------------


def node(name: str) -> dict[str, Any]:
    capacity = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def pdb(name: str, namespace: str, app: str, *, allowed: int) -> dict[str, Any]:
    """A PDB with the status the disruption controller would write (none runs here)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": app}}, "minAvailable": 1},
        "status": {
            "observedGeneration": 1,
            "disruptionsAllowed": allowed,
            "currentHealthy": 1 + allowed,
            "desiredHealthy": 1,
            "expectedPods": 1 + allowed,
        },
    }


def decision(
    preemptor: dict[str, Any], victims: list[VictimRecord], decision_id: str, **fields: Any
) -> bytes:
    """A sealed decision record, as the worker writes it, for a real preemptor and real victims."""
    return orjson.dumps(decisions.decision(preemptor, victims, decision_id=decision_id, **fields))


def make_actuator(
    api: client.ApiClient, *, guard: Callable[[], None] = lambda: None
) -> tuple[Actuator, MemorySink]:
    sink = MemorySink()
    actions = eviction.Actions(api, identity="actuator-test", guard=guard, retry=FAST)
    return Actuator(actions, sink, Ledger(), hmac_key=KEY), sink


def outcome_nomination(sink: MemorySink) -> str:
    """What the one OUTCOME event written says of the nomination."""
    (batch,) = [orjson.loads(r.value) for r in sink.on("preemption.cluster-events")]
    (event,) = batch["events"]
    return str(event["outcome"]["nomination"])


def results(sink: MemorySink) -> dict[str, dict[str, Any]]:
    return {r["victim"]["name"]: r for r in (orjson.loads(x.value) for x in sink.on("preemption.evictions"))}


# ---- the chart, with the real helm and kubectl -----------------------------------------------


def test_helm_lint_and_server_side_dry_run(kube_cluster: cluster.TestCluster, tmp_path: Path) -> None:
    helm, kubectl = cluster.tool("helm"), cluster.tool("kubectl")
    lint = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "--set", "actuator.mode=dry-run"],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # A name that YAML reads as a number unless it is quoted (secretName: 12345 is refused); every
    # knob set (the helm test Pod's priority class goes through the server's Priority admission).
    everything = tmp_path / "everything.yaml"
    everything.write_text(yaml.safe_dump(EVERYTHING | {"priorityClassName": "system-cluster-critical"}))
    for values in (
        ["--set", "actuator.mode=act"],
        [
            "--set-string",
            "signing.existingSecret=12345",
            "--set",
            "signing.mode=hmac",
            "--set",
            "actuator.mode=dry-run",
        ],
        ["-f", str(everything)],
    ):
        rendered = subprocess.run(
            [helm, "template", "other", str(CHART), "--namespace", cluster.NAMESPACE, *values],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        applied = subprocess.run(
            [kubectl, "--kubeconfig", kube_cluster.kubeconfig("admin"), "apply", "--dry-run=server",
             "-f", "-"],
            input=rendered, capture_output=True, text=False,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr.decode()
        assert b"(server dry run)" in applied.stdout
    # The schema refuses what the server (or YAML) would have: helm itself says no.
    # Numbers from a values file reach templates as float64, which helm prints in exponent form
    # from 1e6 on: "--lease-duration=1e+06" (an integer flag: exit 2) and "replicas: 2e+06".
    huge = tmp_path / "huge.yaml"
    huge.write_text("lease: {durationSeconds: 1000000, renewDeadlineSeconds: 10, retryPeriodSeconds: 2}\n")
    huger = tmp_path / "huger.yaml"
    huger.write_text("actuator: {replicas: 2000000}\n")
    for bad in (
        ["--set", "source.resources.requests.cpu=lots"],
        ["--set", 'cluster=prod"eu'],
        ["-f", str(huge)],
        ["-f", str(huger)],
    ):
        refused = subprocess.run([helm, "template", "x", str(CHART), *bad], capture_output=True, text=True)
        assert refused.returncode != 0 and "values don't meet the specifications" in refused.stderr, bad


DEPLOY_DOC = CHART.parents[2] / "docs" / "deploy.md"


def documented_helm_commands() -> dict[str, list[str]]:
    """The first `helm install`, `helm upgrade` and `helm rollback` of docs/deploy.md, as argv."""
    text = DEPLOY_DOC.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    found: dict[str, list[str]] = {}
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line)
            if argv[:1] == ["helm"] and len(argv) > 1:
                found.setdefault(argv[1], argv)
    return found


def test_the_documented_install_upgrade_and_rollback(
    kube_cluster: cluster.TestCluster, tmp_path: Path
) -> None:
    """docs/deploy.md's commands as written, by the real helm against the test API server: install
    this chart in dry run, upgrade to a next version that adds a value with a default (as the
    `lease:` block was added once) while switching the actuator to act, roll back. Only the
    release, its namespace and the chart path are changed (the session's own install holds the
    documented names)."""
    helm = cluster.tool("helm")
    commands = documented_helm_commands()
    assert {"install", "upgrade", "rollback"} <= set(commands), sorted(commands)
    release, namespace = "doc", f"doc-{uuid.uuid4().hex[:6]}"
    following = tmp_path / "preemptctl"
    shutil.copytree(CHART, following)
    chart = yaml.safe_load((following / "Chart.yaml").read_text())
    (following / "Chart.yaml").write_text(yaml.safe_dump({**chart, "version": chart["version"] + "-next"}))
    with (following / "values.yaml").open("a") as out:
        out.write("\nnextOnly: added-later\n")
    schema = orjson.loads((following / "values.schema.json").read_bytes())
    schema["properties"]["nextOnly"] = {"type": "string"}
    schema["required"].append("nextOnly")
    (following / "values.schema.json").write_bytes(orjson.dumps(schema))
    (following / "templates" / "next.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ printf "%s-next" .Release.Name | quote }}\n'
        "  namespace: {{ .Release.Namespace | quote }}\ndata:\n  value: {{ .Values.nextOnly | quote }}\n"
    )

    def run(argv: list[str], chart_path: Path | None) -> None:
        argv = list(argv)
        argv[2] = release
        argv[argv.index("-n") + 1] = namespace
        if chart_path is not None:
            argv[argv.index(str(CHART.relative_to(CHART.parents[2])))] = str(chart_path)
        done = subprocess.run(
            [str(helm), *argv[1:], "--kubeconfig", str(kube_cluster.kubeconfig("admin"))],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr}"

    def actuator_args() -> list[str]:
        found = kube_cluster.request(
            "GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{release}-actuator"
        )
        return list(found["spec"]["template"]["spec"]["containers"][0]["args"])

    try:
        run(commands["install"], CHART)
        assert "--dry-run" in actuator_args()  # the documented install starts in dry run
        run(commands["upgrade"], following)
        configmap = kube_cluster.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{release}-next")
        assert configmap["data"]["value"] == "added-later"  # the new chart's default reached the release
        assert "--dry-run" not in actuator_args()  # and the upgrade's own --set did: it acts now
        run(commands["rollback"], None)
        assert "--dry-run" in actuator_args()
    finally:
        admin = str(kube_cluster.kubeconfig("admin"))
        subprocess.run(
            [str(helm), "uninstall", release, "-n", namespace, "--kubeconfig", admin], capture_output=True
        )


def test_components_can_do_exactly_what_the_code_calls(kube_cluster: cluster.TestCluster) -> None:
    kubectl = cluster.tool("kubectl")

    def can(identity: str, verb: str, resource: str, namespace: str = "default", sub: str = "") -> bool:
        """`kubectl auth can-i` as `identity`; resource is TYPE[.GROUP][/NAME]."""
        done = subprocess.run(
            [kubectl, "--kubeconfig", kube_cluster.kubeconfig(identity), "auth", "can-i", verb, resource,
             "-n", namespace, *([f"--subresource={sub}"] if sub else [])],
            capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout.strip() == "yes"

    def required(identity: str, rules: tuple[tuple[str, str, tuple[str, ...]], ...]) -> None:
        for group, resource, verbs in rules:
            plural, _, sub = resource.partition("/")
            for verb in verbs:
                assert can(identity, verb, f"{plural}.{group}" if group else plural, sub=sub), (
                    identity,
                    verb,
                    resource,
                )

    from streams.kube import actuator

    # ElasticQuotas are left out: their CRD is not installed here, and can-i says no for a kind
    # the server does not serve.
    required("source", tuple(r for r in source.REQUIRED_RBAC if r[0] != source.ELASTIC_QUOTAS.group))
    required("actuator", actuator.REQUIRED_RBAC)
    assert can("actuator", "update", "leases/preemptctl-actuator", cluster.NAMESPACE)
    assert can("source", "update", "leases/preemptctl-source", cluster.NAMESPACE)
    assert not can("actuator", "update", "leases/preemptctl-source", cluster.NAMESPACE)
    assert not can("source", "delete", "pods") and not can("worker", "list", "pods")
    # The source lists and watches; it never reads one object by name.
    assert not [kind for kind in ("pods", "nodes", "namespaces", "priorityclasses.scheduling.k8s.io",
                                  "poddisruptionbudgets.policy") if can("source", "get", kind)]  # fmt: skip
    assert not can("actuator", "create", "events")  # core/v1 Events: not what the code writes


# ---- the actuator --------------------------------------------------------------------------


async def test_delete_evict_label_nominate_and_events(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, ns: str
) -> None:
    high = preemptor(kube_cluster, "high", ns)
    pods = {
        n: kube_cluster.apply(pod(n, ns, node_name="n1", grace=17))
        for n in ("v-delete", "v-evict", "v-label")
    }
    act, sink = make_actuator(as_actuator)
    victims = [
        victim(pods["v-delete"], "delete"),
        victim(pods["v-evict"], "evict"),
        victim(pods["v-label"], "label"),
    ]
    written = await act.handle(decision(high, victims, f"default/1/{ns}"), key=b"default", origin=ORIGIN)

    found = results(sink)
    assert {n: (r["result"], r["attempts"]) for n, r in found.items()} == {
        "v-delete": ("done", 1),
        "v-evict": ("done", 1),
        "v-label": ("done", 1),
    }
    # Each outcome is keyed by its victim's uid (one outcome per victim, whatever the decision;
    # the victims are acted on concurrently, so in the order they finished).
    assert sorted(r.key for r in sink.on("preemption.evictions")) == sorted(
        r["victim"]["uid"].encode() for r in written
    )
    # A delete sets DisruptionTarget before deleting, as kube-scheduler; that mark may go while the
    # preemptor is nominated, but every delete, eviction and label waits for the nomination.
    requests = [
        e for e in sorted(kube_cluster.audit(), key=lambda e: e["requestReceivedTimestamp"])
        if e.get("objectRef", {}).get("namespace") == ns and e["user"]["uid"] == "actuator-a"
        and e["objectRef"].get("resource") == "pods" and e["verb"] != "get"
    ]  # fmt: skip
    writes = [(e["objectRef"]["name"], e["objectRef"].get("subresource"), e["verb"]) for e in requests]
    (nominated,) = [e["stageTimestamp"] for e in requests if e["objectRef"]["name"] == "high"]
    acting = [e for e in requests if e["objectRef"].get("subresource") != "status"]
    assert len(acting) == 3 and all(e["requestReceivedTimestamp"] > nominated for e in acting)
    assert [w for w in writes if w[0] == "v-delete"] == [
        ("v-delete", "status", "patch"),
        ("v-delete", None, "delete"),
    ]
    deleted = get_pod(kube_cluster, ns, "v-delete")
    assert (
        deleted is not None and deleted["metadata"]["deletionGracePeriodSeconds"] == 17
    )  # no kubelet: terminating
    (target,) = [c for c in deleted["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert (target["status"], target["reason"]) == ("True", "PreemptionByScheduler")
    evicted = get_pod(kube_cluster, ns, "v-evict")
    assert evicted is not None and evicted["metadata"].get("deletionTimestamp")
    labelled = get_pod(kube_cluster, ns, "v-label")
    assert labelled is not None and labelled["metadata"]["labels"][eviction.SOFT_EVICTION] == "true"
    assert orjson.loads(labelled["metadata"]["annotations"][eviction.SOFT_EVICTION]) == {
        "preemptJob": "",
        "preemptor": f"{ns}/high",
        "decisionId": f"default/1/{ns}",
        "reason": "preempting lower-priority pods",
    }
    assert get_pod(kube_cluster, ns, "high")["status"]["nominatedNodeName"] == "n1"  # type: ignore[index]
    # Events as kube-scheduler writes them, through events.k8s.io/v1.
    events = {
        e["regarding"]["name"]: e
        for e in kube_cluster.request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    }
    assert sorted(events) == ["v-delete", "v-evict", "v-label"]
    event = events["v-evict"]
    assert (event["reason"], event["action"], event["type"]) == ("Preempted", "Preempting", "Normal")
    assert event["note"] == f"Preempted by pod {high['metadata']['uid']} on node n1"
    assert event["regarding"]["uid"] == pods["v-evict"]["metadata"]["uid"]
    assert (event["related"]["name"], event["related"]["uid"]) == ("high", high["metadata"]["uid"])
    assert event["metadata"]["annotations"][eviction.DECISION_ANNOTATION] == f"default/1/{ns}"
    assert event["eventTime"].endswith("Z") and event["reportingController"] == "preemptctl"


async def test_events_are_accepted_at_the_limits_of_names_and_times(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Event of a victim whose name is as long as a pod's may be, cut where a '-' ends the cut;
    an instance identity longer than reportingInstance's 128; a clock on a whole second (eventTime
    is MicroTime, which the server parses only with its six fraction digits). A refused Event is
    only logged, so the test looks for the Event itself."""
    monkeypatch.setattr(kube, "now", lambda: datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC))
    high = preemptor(kube_cluster, "high", ns)
    long_name = "a" * 235 + "-" + "b" * 17  # 253 characters; an Event name keeps 236 of them
    target = kube_cluster.apply(pod(long_name, ns, node_name="n1"))
    sink = MemorySink()
    actions = eviction.Actions(as_actuator, identity="pod-" + "i" * 200, retry=FAST)
    act = Actuator(actions, sink, Ledger(), hmac_key=KEY)
    await act.handle(decision(high, [victim(target, "label")], f"default/ev/{ns}"), key=None, origin=ORIGIN)
    assert [r["result"] for r in results(sink).values()] == ["done"]
    (event,) = kube_cluster.request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    assert event["regarding"]["name"] == long_name and event["eventTime"] == "2026-01-01T12:00:00.000000Z"
    assert len(event["reportingInstance"]) <= eviction.REPORTING_INSTANCE_LIMIT


async def test_eviction_answers_of_real_pdbs(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, ns: str
) -> None:
    high = preemptor(kube_cluster, "high", ns)
    one = kube_cluster.apply(pod("one-pdb", ns, node_name="n1", labels={"app": "web"}))
    two = kube_cluster.apply(pod("two-pdbs", ns, node_name="n1", labels={"app": "db"}))
    kube_cluster.apply(pdb("web", ns, "web", allowed=0))
    kube_cluster.apply(pdb("db-a", ns, "db", allowed=1))
    kube_cluster.apply(pdb("db-b", ns, "db", allowed=1))
    act, sink = make_actuator(as_actuator)
    await act.handle(
        decision(high, [victim(one, "evict"), victim(two, "evict")], f"default/2/{ns}"),
        key=None,
        origin=ORIGIN,
    )
    found = results(sink)
    # One PDB at its limit: 429 with the budget's reason in details.causes, retried, then blocked.
    assert (found["one-pdb"]["result"], found["one-pdb"]["attempts"]) == (
        "blocked-by-pdb",
        FAST.eviction_attempts,
    )
    assert found["one-pdb"]["message"] == "The disruption budget web needs 1 healthy pods and has 1 currently"
    # Two PDBs: the server answers 500 and never evicts such a pod: one attempt, no retry.
    assert (found["two-pdbs"]["result"], found["two-pdbs"]["attempts"]) == ("blocked-by-pdb", 1)
    assert "more than one PodDisruptionBudget" in found["two-pdbs"]["message"]
    evictions = [
        e for e in kube_cluster.audit() if e.get("objectRef", {}).get("subresource") == "eviction"
        and e.get("objectRef", {}).get("namespace") == ns
    ]  # fmt: skip
    assert sorted(e["responseStatus"]["code"] for e in evictions) == [429] * FAST.eviction_attempts + [500]
    for name in ("one-pdb", "two-pdbs"):
        held = get_pod(kube_cluster, ns, name)
        assert held is not None and not held["metadata"].get("deletionTimestamp")
    warning = [
        e for e in kube_cluster.request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
        if e["regarding"]["name"] == "one-pdb"
    ]  # fmt: skip
    assert [(w["type"], w["reason"]) for w in warning] == [("Warning", "PreemptionBlocked")]


async def test_a_pod_recreated_between_read_and_write_is_never_touched(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, ns: str
) -> None:
    """Each pod is replaced (same name, new uid) after the actuator read it and before its write: the
    write's uid precondition (eviction: 409) or the uid in its patch (status, labels: 422) refuses
    the new pod, and the victim's outcome is uid-changed. A recreated preemptor stops its decision."""
    high = preemptor(kube_cluster, "high", ns)
    old = {n: kube_cluster.apply(pod(n, ns, node_name="n1")) for n in ("e", "d", "l", "x")}

    def replace_once(name: str) -> Callable[[], None]:
        """A guard (it runs before each write) that replaces `name` the first time it runs."""
        replaced: list[str] = []

        def guard() -> None:
            if not replaced:
                kube_cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", gracePeriodSeconds="0")
                again = (
                    preemptor(kube_cluster, name, ns)
                    if name == "high"
                    else kube_cluster.apply(pod(name, ns, node_name="n1"))
                )
                replaced.append(again["metadata"]["uid"])

        return guard

    found: dict[str, dict[str, Any]] = {}
    for name, action in (("e", "evict"), ("d", "delete"), ("l", "label")):
        act, sink = make_actuator(as_actuator, guard=replace_once(name))
        # The preemptor is nominated too (a decision without a node is refused): the guard's first
        # run, before the nomination or the victim's own write, replaces the victim already read.
        record = decision(high, [victim(old[name], action)], f"default/r-{name}/{ns}")
        await act.handle(record, key=None, origin=ORIGIN)
        found |= results(sink)
    # The preemptor replaced between its read and its nomination: no victim is touched.
    act, sink = make_actuator(as_actuator, guard=replace_once("high"))
    await act.handle(
        decision(high, [victim(old["x"], "evict")], f"default/r-x/{ns}"), key=None, origin=ORIGIN
    )
    found |= results(sink)
    assert {n: r["result"] for n, r in found.items()} == {
        "e": "uid-changed",
        "d": "uid-changed",
        "l": "uid-changed",
        "x": "error",
    }
    assert "was recreated" in found["x"]["message"] and "no victim was touched" in found["x"]["message"]
    writes = sorted(
        (e["objectRef"]["name"], e["objectRef"].get("subresource"), e["responseStatus"]["code"])
        for e in kube_cluster.audit()
        if e.get("objectRef", {}).get("namespace") == ns and e["user"]["uid"] == "actuator-a"
        and e["verb"] in ("create", "patch", "delete")
    )  # fmt: skip
    # Every write to a replaced pod was refused; what succeeded is the three nominations of the
    # original preemptor (decisions r-e, r-d and r-l).
    assert writes == [
        ("d", "status", 422),
        ("e", "eviction", 409),
        ("high", "status", 200),
        ("high", "status", 200),
        ("high", "status", 200),
        ("high", "status", 422),
        ("l", None, 422),
    ]
    for name in ("e", "d", "l", "x"):
        held = get_pod(kube_cluster, ns, name)
        assert held is not None and not held["metadata"].get("deletionTimestamp")
        assert eviction.SOFT_EVICTION not in (held["metadata"].get("labels") or {})
    # A delete's precondition answers 409 (the actuator reads the pod again and finds out why).
    with pytest.raises(client.ApiException) as refused_delete:
        await client.CoreV1Api(as_actuator).delete_namespaced_pod(
            "x",
            ns,
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=old["e"]["metadata"]["uid"])
            ),
        )
    assert refused_delete.value.status == 409


def bound_meanwhile(kube_cluster: cluster.TestCluster, ns: str) -> type[eviction.Actions]:
    """Actions whose nomination finds `high` bound to n2 by kube-scheduler between the actuator's
    read of it (the victims are read, and may be marked, from then on) and its nomination."""

    class BoundMeanwhile(eviction.Actions):
        async def nominate(
            self,
            member: str,
            node: str,
            *,
            uid: str | None,
            scope: tuple[str, ...] | None = None,
            checked: Callable[[], None] = lambda: None,
        ) -> eviction.Nomination:
            def bind_then_go_on() -> None:
                checked()  # the victims may be marked from now on...
                binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "high"},
                           "target": {"kind": "Node", "name": "n2"}}  # fmt: skip
                kube_cluster.request("POST", f"/api/v1/namespaces/{ns}/pods/high/binding", binding)

            return await super().nominate(member, node, uid=uid, scope=scope, checked=bind_then_go_on)

    return BoundMeanwhile


async def test_a_preemptor_bound_while_its_victims_are_marked_keeps_them(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, ns: str
) -> None:
    """A victim is marked DisruptionTarget while its preemptor is nominated. kube-scheduler binds
    the preemptor between the actuator's read of it and its nomination: the nomination's JSON
    patch tests (uid, no nodeName) make the server refuse it (422), the victim is not deleted and
    its mark is set back to False, and the outcome says so."""
    high = preemptor(kube_cluster, "high", ns)
    target = kube_cluster.apply(pod("t", ns, node_name="n1"))
    evicted = kube_cluster.apply(pod("e", ns, node_name="n1"))

    sink = MemorySink()
    actions = bound_meanwhile(kube_cluster, ns)(as_actuator, identity="actuator-test", retry=FAST)
    act = Actuator(actions, sink, Ledger(), hmac_key=KEY)
    record = decision(high, [victim(target, "delete"), victim(evicted, "evict")], f"default/b/{ns}")
    await act.handle(record, key=None, origin=ORIGIN)

    found = results(sink)
    assert {n: r["result"] for n, r in found.items()} == {"t": "error", "e": "error"}
    assert found["t"]["message"].endswith("is already bound to n2: not deleted, DisruptionTarget withdrawn")
    assert found["e"]["message"].endswith(eviction.UNTOUCHED)
    kept = get_pod(kube_cluster, ns, "t")
    assert kept is not None and not kept["metadata"].get("deletionTimestamp")
    (mark,) = [c for c in kept["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert (mark["status"], mark["reason"]) == ("False", eviction.WITHDRAWN_REASON)
    untouched = get_pod(kube_cluster, ns, "e")
    assert untouched is not None and not untouched["metadata"].get("deletionTimestamp")
    writes = sorted(
        (e["requestReceivedTimestamp"], e["objectRef"]["name"], e["objectRef"].get("subresource"),
         e["verb"], e["responseStatus"]["code"])
        for e in kube_cluster.audit()
        if e.get("objectRef", {}).get("namespace") == ns and e["user"]["uid"] == "actuator-a"
        and e["objectRef"].get("resource") == "pods" and e["verb"] != "get"
    )  # fmt: skip
    assert sorted(w[1:] for w in writes) == [
        ("high", "status", "patch", 422),
        ("t", "status", "patch", 200),
        ("t", "status", "patch", 200),
    ]
    assert outcome_nomination(sink) == "bound"


@pytest.mark.parametrize("bound", ["before", "meanwhile"])
async def test_a_redelivered_decision_withdraws_the_mark_an_earlier_delivery_left(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, ns: str, bound: str
) -> None:
    """A delivery cut short after marking its victim (a lost Lease, the stop's cancel, a crash)
    leaves DisruptionTarget=True behind. Redelivered once the preemptor is bound elsewhere, the
    decision's mark is still its own to withdraw: set back to False, the pod kept. A mark with
    another message (kube-scheduler's, another decision's) is not ours and stays."""
    decision_id = f"default/b/{ns}"
    # Bound before the redelivery reads it, or between that read and its nomination.
    high = preemptor(kube_cluster, "high", ns, node_name="n2" if bound == "before" else None)

    def marked(name: str, message: str) -> dict[str, Any]:
        obj = pod(name, ns, node_name="n1")
        obj["status"] = {"conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": eviction.PREEMPTION_REASON,
            "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]}  # fmt: skip
        return kube_cluster.apply(obj)

    ours = marked("ours", eviction._mark_message(decision_id))
    theirs = marked("theirs", eviction._mark_message("default/a/other"))
    if bound == "before":
        act, sink = make_actuator(as_actuator)
    else:
        sink = MemorySink()
        actions = bound_meanwhile(kube_cluster, ns)(as_actuator, identity="actuator-test", retry=FAST)
        act = Actuator(actions, sink, Ledger(), hmac_key=KEY)
    record = decision(high, [victim(ours, "delete"), victim(theirs, "delete")], decision_id)
    await act.handle(record, key=None, origin=ORIGIN)
    found = results(sink)
    assert found["ours"]["message"].endswith("not deleted, DisruptionTarget withdrawn")
    assert found["theirs"]["message"].endswith(eviction.UNTOUCHED)
    for name, status in (("ours", "False"), ("theirs", "True")):
        kept = get_pod(kube_cluster, ns, name)
        assert kept is not None and not kept["metadata"].get("deletionTimestamp")
        (mark,) = [c for c in kept["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert mark["status"] == status, name


async def test_dry_run_writes_nothing(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, ns: str
) -> None:
    high = preemptor(kube_cluster, "high", ns)
    pods = {n: kube_cluster.apply(pod(n, ns, node_name="n1")) for n in ("a", "b", "c")}
    sink = MemorySink()
    act = Actuator(
        eviction.Actions(as_actuator, dry_run=True, identity="t", retry=FAST), sink, Ledger(), hmac_key=KEY
    )
    before = {n: get_pod(kube_cluster, ns, n)["metadata"]["resourceVersion"] for n in (*pods, "high")}  # type: ignore[index]
    victims = [victim(pods["a"], "delete"), victim(pods["b"], "evict"), victim(pods["c"], "label")]
    await act.handle(decision(high, victims, f"default/3/{ns}"), key=None, origin=ORIGIN)
    assert {(r["result"], r.get("dryRun")) for r in results(sink).values()} == {("done", True)}
    after = {n: get_pod(kube_cluster, ns, n)["metadata"]["resourceVersion"] for n in (*pods, "high")}  # type: ignore[index]
    assert after == before
    assert kube_cluster.request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"] == []
    # The writes were sent and admitted, only not persisted: nomination, status, delete, eviction, label.
    sent = [
        e for e in kube_cluster.audit()
        if e.get("objectRef", {}).get("namespace") == ns and e["user"]["uid"] == "actuator-a"
        and e["verb"] != "get"
    ]  # fmt: skip
    assert len(sent) >= 5 and all(e["responseStatus"]["code"] < 300 for e in sent)
    # A dry run's outcomes never stand in for the real actuator's, nor the other way round.
    real, _ = make_actuator(as_actuator)
    assert real.recover(r.value for r in sink.on("preemption.evictions")) == 0
    assert act.recover(r.value for r in sink.on("preemption.evictions")) == 3


# ---- the Lease -----------------------------------------------------------------------------


def elector(api: client.ApiClient, name: str, identity: str, **kwargs: Any) -> lease.LeaseElector:
    return lease.LeaseElector(api, name=name, namespace=cluster.NAMESPACE, identity=identity, **kwargs)


async def test_lease_times_are_micro_time(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient
) -> None:
    """renewTime with a zero microsecond: isoformat() leaves out the fraction, and the server says 400."""
    whole_second = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    a = elector(as_actuator, "preemptctl-actuator", "micro", now=lambda: whole_second)
    assert await a.try_acquire_or_renew()  # create
    assert await a.try_acquire_or_renew()  # update
    held = kube_cluster.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{cluster.NAMESPACE}/leases/preemptctl-actuator"
    )
    assert held["spec"]["renewTime"] == "2026-01-01T12:00:00.000000Z"
    await a.release()


@pytest.mark.parametrize("release", [True, False])
async def test_a_holder_leaving_releases_its_lease_or_leaves_it_to_expire(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, release: bool
) -> None:
    """Cancelled, the election loop hands the Lease over at once; an actuator whose stop cut
    writes short (`release_on_exit = False`) leaves it to expire, so no successor acts before
    those writes are past the server's deadline."""
    name = "preemptctl-actuator"  # the one Lease the actuator's RBAC may touch
    a = elector(as_actuator, name, "leaving")
    a.release_on_exit = release
    running = asyncio.create_task(a.run())
    await asyncio.wait_for(a.wait_leader(), STEP_TIMEOUT_S)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    path = f"/apis/coordination.k8s.io/v1/namespaces/{cluster.NAMESPACE}/leases/{name}"
    assert kube_cluster.request("GET", path)["spec"]["holderIdentity"] == ("" if release else "leaving")
    assert not a.is_leader()
    await a.release()  # for the tests after this one, which would wait out its duration
    assert kube_cluster.request("GET", path)["spec"]["holderIdentity"] == ""


@asynccontextmanager
async def proxied(
    kube_cluster: cluster.TestCluster, identity: str
) -> AsyncIterator[tuple[FaultProxy, client.ApiClient]]:
    host, _, port = kube_cluster.url.removeprefix("https://").partition(":")
    async with FaultProxy(host, int(port)) as proxy:
        api = await kube.connect(str(kube_cluster.kubeconfig(identity, server=proxy.url)))
        try:
            yield proxy, api
        finally:
            await api.close()


def timeouts() -> float:
    """Lease rounds that ended at a timeout (aiohttp names its timeout errors variously)."""
    return sum(
        m.value
        for m in lease.LEASE_ERRORS.collect()[0].samples
        if m.name.endswith("_total") and "Timeout" in m.labels["reason"]
    )


async def test_lease_loop_survives_dropped_connections_and_hangs(kube_cluster: cluster.TestCluster) -> None:
    async with proxied(kube_cluster, "actuator") as (proxy, api):
        a = elector(
            api,
            "preemptctl-actuator",
            "survivor",
            retry_period_s=0.2,
            renew_deadline_s=9,
            lease_duration_s=14,
        )
        running = asyncio.create_task(a.run())
        try:
            await asyncio.wait_for(a.wait_leader(), STEP_TIMEOUT_S)
            errors = lease.LEASE_ERRORS.labels("ServerDisconnectedError")._value.get()
            # The server closes the connection mid-request: aiohttp's ServerDisconnectedError, which
            # is neither an ApiException nor an OSError.
            proxy.refuse(3)
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while lease.LEASE_ERRORS.labels("ServerDisconnectedError")._value.get() < errors + 1:
                assert time.monotonic() < deadline and not running.done(), (
                    "no disconnect reached the loop",
                    [(m.labels, m.value) for m in lease.LEASE_ERRORS.collect()[0].samples],
                )
                await asyncio.sleep(0.05)
            # A half-open connection: each round ends at its timeout instead of hanging the loop.
            proxy.hang()
            started, before = time.monotonic(), timeouts()
            while timeouts() < before + 1:
                assert time.monotonic() - started < kube.WRITE_TIMEOUT_S + 5, "a hung round never timed out"
                await asyncio.sleep(0.1)
            proxy.resume()
            proxy.drop()
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while not (a.is_leader() and a.remaining_s() > 8):
                assert time.monotonic() < deadline, "the loop did not renew after the faults"
                await asyncio.sleep(0.1)
            assert not running.done() and a.liveness() is None
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    # A loop that dies is reported to /livez.
    broken = elector(api, "preemptctl-actuator", "broken")

    async def explode() -> bool:
        raise KeyboardInterrupt  # not an Exception: the loop ends

    broken.try_acquire_or_renew = explode  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        await broken.run()
    assert "Lease loop ended" in (broken.liveness() or "")


async def test_a_write_needs_more_lease_than_its_timeout(
    kube_cluster: cluster.TestCluster, as_actuator: client.ApiClient, ns: str
) -> None:
    """Fencing: with less validity left than api.WRITE_TIMEOUT_S the write is not even sent."""
    clock = [0.0]
    a = elector(as_actuator, "preemptctl-actuator", "fenced", monotonic=lambda: clock[0])
    assert await a.try_acquire_or_renew()
    high = preemptor(kube_cluster, "high", ns)
    target = kube_cluster.apply(pod("v", ns, node_name="n1"))
    act, sink = make_actuator(as_actuator, guard=a.check)
    clock[0] = lease.RENEW_DEADLINE_S - kube.WRITE_TIMEOUT_S + 0.5  # still leader, but not for a whole write
    assert a.is_leader()
    with pytest.raises(lease.NotLeader):
        await act.handle(
            decision(high, [victim(target, "delete")], f"default/4/{ns}"), key=None, origin=ORIGIN
        )
    held = get_pod(kube_cluster, ns, "v")
    assert held is not None and not held["metadata"].get("deletionTimestamp") and sink.records == []
    clock[0] = 0.0
    await a.release()


async def test_every_call_has_a_timeout(kube_cluster: cluster.TestCluster) -> None:
    """A hung connection ends the call at its timeout (kubernetes-asyncio's default is none at all)."""
    async with proxied(kube_cluster, "actuator") as (proxy, api):
        core = client.CoreV1Api(api)
        proxy.hang()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                core.create_namespaced_pod_eviction(
                    "x", "default", client.V1Eviction(metadata=client.V1ObjectMeta(name="x")),
                    _request_timeout=kube.write_timeout(),
                ),
                kube.WRITE_TIMEOUT_S + 10,
            )  # fmt: skip
        assert time.monotonic() - started < kube.WRITE_TIMEOUT_S + 2
        started = time.monotonic()
        with pytest.raises(TimeoutError):  # a read without a named timeout gets REQUEST_TIMEOUT_S
            await asyncio.wait_for(core.read_namespaced_pod("x", "default"), kube.REQUEST_TIMEOUT_S + 10)
        assert time.monotonic() - started < kube.REQUEST_TIMEOUT_S + 2
        proxy.resume()


# ---- two actuator processes, the leader frozen ------------------------------------------------

# Lease timings of the two processes: a takeover ~13 s after the leader's last renewal instead of
# ~17 s, with margins like the defaults' (each renewal leaves 4 s to start writes in, and 3 s pass
# between the holder's renew deadline and anyone's takeover).
FAILOVER_LEASE = ("--lease-duration", "12", "--renew-deadline", "9", "--retry-period", "1")
# One step of the failover: a process starts and joins the consumer group (tansu's join alone takes
# about half the 10 s session timeout), or a successor waits out the Lease and the frozen member's
# session, then joins; a loaded CI machine gets several times what it takes here (~20 s).
FAILOVER_STEP_TIMEOUT_S = 90.0
WRITE_VERBS = ("create", "update", "patch", "delete")
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def moment(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def actuator_lease(kube_cluster: cluster.TestCluster) -> dict[str, Any]:
    """The actuators' Lease spec; empty before anyone created it."""
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{cluster.NAMESPACE}/leases/preemptctl-actuator"
    try:
        return cast(dict[str, Any], kube_cluster.request("GET", lease_path)["spec"])
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        return {}


async def eventually(check: Callable[[], Any], what: str, *logs: Path) -> Any:
    """Poll `check` until it returns something true; fail saying what, with the processes' logs.

    A plain function runs in a thread: its blocking calls to the API server must not stall this
    event loop, which serves the webhook the API server may be calling meanwhile.
    """
    deadline = time.monotonic() + FAILOVER_STEP_TIMEOUT_S
    while not (found := await (check() if inspect.iscoroutinefunction(check) else asyncio.to_thread(check))):
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in logs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        await asyncio.sleep(0.2)
    return found


async def webhook_serving(kube_cluster: cluster.TestCluster, webhook: HoldingWebhook, ns: str) -> None:
    """Wait until kube-apiserver calls the webhook (its registrations reach it through an informer)."""

    def probed() -> bool:
        with contextlib.suppress(urllib.error.HTTPError):  # 404: no such pod, after admission
            kube_cluster.request(
                "POST", f"/api/v1/namespaces/{ns}/pods/probe/eviction",
                {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "probe"}},
            )  # fmt: skip
        return any(r.get("name") == "probe" for r in webhook.reviews)

    await eventually(probed, "the webhook to be called")


# A write's deadline in the probe below, and how long the webhook holds it: well past it.
PROBE_DEADLINE = "1s"
PROBE_HOLD_S = 3.0


async def test_the_api_server_gives_a_write_up_at_its_deadline(
    kube_cluster: cluster.TestCluster, ns: str, tmp_path: Path
) -> None:
    """What the actuator's fencing stands on (docs/deploy.md §5): kube-apiserver counts a write's
    `?timeout=` from when it took the request in, answers 504 at it and does not land the write,
    for each kind of write the actuator makes to a victim (DELETE, eviction, status PATCH), even
    when what held it (a slow admission webhook) lets it through afterwards. Without the
    deadline the same held DELETE lands when the webhook answers."""
    _, _, openssl = cluster.prerequisites()
    deadline = {"timeout": PROBE_DEADLINE}
    condition = {"type": "DisruptionTarget", "status": "True"}
    eviction_body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p-evict"}}
    writes = {
        "delete": ("DELETE", "", {"gracePeriodSeconds": 30}, deadline),
        "evict": ("POST", "/eviction", eviction_body, deadline),
        "status": ("PATCH", "/status", {"status": {"conditions": [condition]}}, deadline),
        "delete-without-deadline": ("DELETE", "", {"gracePeriodSeconds": 30}, {}),
    }  # fmt: skip
    for case in writes:
        kube_cluster.apply(pod(f"p-{case}", ns, node_name="n1"))
    async with HoldingWebhook(tmp_path, openssl) as webhook:
        registration = webhook.configuration(f"hold-all-{ns}", ns)
        registration["webhooks"][0]["rules"][0].update(
            operations=["CREATE", "DELETE", "UPDATE"], resources=["pods/eviction", "pods", "pods/status"]
        )
        kube_cluster.request("POST", WEBHOOKS, registration)
        try:
            await webhook_serving(kube_cluster, webhook, ns)
            for case, (method, sub, body, query) in writes.items():
                path = f"/api/v1/namespaces/{ns}/pods/p-{case}{sub}"
                webhook.hold(cluster.IDENTITIES["admin"][1])
                webhook.arrived.clear()
                sending = asyncio.create_task(
                    asyncio.to_thread(
                        lambda m=method, p=path, b=body, q=query: kube_cluster.request(m, p, b, **q)
                    )
                )
                arrived = asyncio.create_task(webhook.arrived.wait())
                await asyncio.wait(
                    {sending, arrived}, timeout=STEP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
                )
                arrived.cancel()
                assert webhook.arrived.is_set(), f"{case}: not held ({sending})"
                await asyncio.sleep(PROBE_HOLD_S)  # the held write's deadline passes meanwhile
                webhook.release()  # ... and the webhook allows it
                # A 504 (an HTTPError), or on a loaded server a connection closed without an
                # answer: what the server did is read from its audit log below either way.
                with contextlib.suppress(urllib.error.HTTPError, ConnectionError):
                    await sending
        finally:
            kube_cluster.request("DELETE", f"{WEBHOOKS}/hold-all-{ns}")
    verbs = {"DELETE": "delete", "POST": "create", "PATCH": "patch"}

    def answered() -> dict[str, list[dict[str, Any]]]:
        events = kube_cluster.audit()
        return {
            case: [
                e for e in events
                if (e.get("objectRef") or {}).get("namespace") == ns
                and e["objectRef"].get("name") == f"p-{case}" and e["verb"] == verbs[method]
                and (e["objectRef"].get("subresource") or "") == sub.strip("/")
                and ("timeout=" in e["requestURI"]) == bool(query)
            ]
            for case, (method, sub, _, query) in writes.items()
        }  # fmt: skip

    # A timed-out request's audit event is written when its handler ends (after the webhook's
    # answer), which a loaded machine may put after the last write returned.
    stop_at = time.monotonic() + STEP_TIMEOUT_S
    while any(not found for found in answered().values()) and time.monotonic() < stop_at:
        await asyncio.sleep(0.2)
    answers = {}
    for case, found in answered().items():
        (answers[case],) = found
    for case in ("delete", "evict", "status"):
        answer = answers[case]
        waited = moment(answer["stageTimestamp"]) - moment(answer["requestReceivedTimestamp"])
        assert answer["responseStatus"]["code"] == 504, answer
        assert waited < timedelta(seconds=PROBE_HOLD_S), answer  # given up before the webhook answered
        got = kube_cluster.request("GET", f"/api/v1/namespaces/{ns}/pods/p-{case}")
        assert got["metadata"].get("deletionTimestamp") is None, got  # not deleted, not evicted
        assert [c["type"] for c in got["status"].get("conditions") or ()] == ["Ready"], got  # not patched
    assert answers["delete-without-deadline"]["responseStatus"]["code"] == 200
    got = kube_cluster.request("GET", f"/api/v1/namespaces/{ns}/pods/p-delete-without-deadline")
    assert got["metadata"].get("deletionTimestamp") is not None  # the same hold, no deadline: it lands


async def test_a_frozen_leader_lands_no_write_after_its_successor_took_over(
    kube_cluster: cluster.TestCluster, ns: str, tansu: str, tmp_path: Path
) -> None:
    """Two `preemptctl actuator` processes, each as its own ServiceAccount token, contend for the
    Lease. The leader is frozen (SIGSTOP) while its eviction waits inside the API server (a slow
    admission webhook); the other takes the Lease over and acts; then the frozen one is woken
    (SIGCONT). Its other victim's delete goes out concurrently with the eviction, so it may have
    landed before the freeze, be in flight, or not have left the process yet: the test holds
    whichever happened to what docs/deploy.md §5 guarantees, read from the audit log. Every write
    of the frozen process carried its deadline (?timeout=5s) and was received while its Lease had
    more than that left, so the server answered or gave it up before the takeover (the held
    eviction: 504 at its deadline); once awake it sends nothing (each write is checked again as
    its bytes leave, api.checked_when_sent), and it exits on SIGTERM. Each victim is acted on
    once: a victim the frozen leader deleted is found terminating by the successor, not deleted
    again."""
    _, _, openssl = cluster.prerequisites()
    high = preemptor(kube_cluster, "high", ns)
    evicted = kube_cluster.apply(pod("v-evict", ns, node_name="n1"))
    deleted = kube_cluster.apply(pod("v-delete", ns, node_name="n1"))
    key_file = tmp_path / "hmac.key"
    key_file.write_bytes(KEY)
    await kafka_topics.ensure_topics(tansu)
    frozen_uid, successor_uid = cluster.IDENTITIES["actuator"][1], cluster.IDENTITIES["actuator-b"][1]
    logs = {name: tmp_path / f"actuator-{name}.log" for name in ("a", "b")}
    ports = {name: free_loopback_port() for name in ("a", "b")}

    def argv(name: str, token: str) -> list[str]:
        return [
            "actuator", "--broker", f"kafka://{tansu}", "--cluster", ns, "--group-id", f"actuator-{ns}",
            "--hmac-key-file", str(key_file), "--lease-name", "preemptctl-actuator",
            "--lease-namespace", cluster.NAMESPACE, *FAILOVER_LEASE, "--identity", f"actuator-{name}",
            "--kubeconfig", str(kube_cluster.kubeconfig(token)),
            "--ledger-file", str(tmp_path / f"{name}.jsonl"),
            "--health-host", "127.0.0.1", "--health-port", str(ports[name]), "--any-scheduler",
        ]  # fmt: skip

    async with HoldingWebhook(tmp_path, openssl) as webhook:
        kube_cluster.request("POST", WEBHOOKS, webhook.configuration(f"hold-{ns}", ns))
        try:
            await webhook_serving(kube_cluster, webhook, ns)
            webhook.hold(frozen_uid)
            async with command(*argv("a", "actuator"), log=logs["a"]) as leader:
                await eventually(
                    lambda: actuator_lease(kube_cluster).get("holderIdentity") == "actuator-a",
                    "a to lead",
                    logs["a"],
                )
                transitions = actuator_lease(kube_cluster).get("leaseTransitions", 0)
                async with command(*argv("b", "actuator-b"), log=logs["b"]) as successor:
                    producer = AIOKafkaProducer(bootstrap_servers=tansu, acks="all")
                    await producer.start()
                    try:
                        # Decided now: `preemptctl actuator` refuses a decision older than its
                        # --max-decision-age (issue 29, 3).
                        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                        record = decision(
                            high, [victim(evicted, "evict"), victim(deleted, "delete")], f"{ns}/1/high",
                            cluster=ns, ts=now,
                        )  # fmt: skip
                        await producer.send_and_wait(DECISIONS, record, key=ns.encode())
                        forged = decisions.decision(
                            high,
                            [victim(deleted, "delete")],
                            decision_id=f"{ns}/2/high",
                            cluster=ns,
                            ts=now,
                            key=b"wrong",
                        )
                        await producer.send_and_wait(DECISIONS, orjson.dumps(forged), key=ns.encode())
                    finally:
                        await producer.stop()
                    await asyncio.wait_for(webhook.arrived.wait(), FAILOVER_STEP_TIMEOUT_S)
                    leader.send_signal(signal.SIGSTOP)  # its eviction is inside the API server now
                    try:
                        await eventually(
                            lambda: actuator_lease(kube_cluster).get("holderIdentity") == "actuator-b",
                            "b to take the Lease over", logs["b"],
                        )  # fmt: skip
                        spec = actuator_lease(kube_cluster)
                        takeover = moment(spec["acquireTime"])
                        webhook.release()  # the server gets to the frozen process's eviction only now

                        def ledger(name: str) -> list[dict[str, Any]]:
                            path = tmp_path / f"{name}.jsonl"
                            lines = path.read_bytes().splitlines() if path.exists() else []
                            entries = [orjson.loads(line) for line in lines if line.endswith(b"}")]
                            return [e for e in entries if "decisionId" in e]  # not the chain head lines

                        def outcomes() -> int:  # of decision 1, by either process
                            return len({
                                e["subject"] for name in ("a", "b") for e in ledger(name)
                                if e["decisionId"] == f"{ns}/1/high" and e["state"] == "recorded"
                                and e["subject"] in (evicted["metadata"]["uid"], deleted["metadata"]["uid"])
                            })  # fmt: skip

                        async def acted() -> bool:
                            return (
                                outcomes() == 2
                                and await metric(ports["b"], "preemptctl_dead_letters_total") >= 1
                            )

                        await eventually(acted, "b to act and refuse the forged decision", logs["b"])
                        assert await metric(ports["b"], "preemptctl_leader") == 1
                    finally:
                        leader.send_signal(signal.SIGCONT)
                    # Awake, it finds its Lease gone on its own clock and starts nothing.
                    await eventually(
                        lambda: "pausing until the Lease is held again" in logs["a"].read_text(),
                        "a to notice it lost the Lease", logs["a"],
                    )  # fmt: skip
                    # Released on SIGTERM. The other process is still a candidate and may take an
                    # empty holder at once (before b has even exited), so the Lease's holder alone
                    # does not say whether b released it; b's own log does, and no one else could
                    # hold it within a lease duration of b's last renewal otherwise.
                    stopped = await stop(successor, logs["b"])
                    assert "released Lease" in stopped
                    assert actuator_lease(kube_cluster)["holderIdentity"] in ("", "actuator-a")
                await stop(leader, logs["a"])
        finally:
            kube_cluster.request("DELETE", f"{WEBHOOKS}/hold-{ns}")

    def writes(uid: str) -> list[dict[str, Any]]:
        return [
            e for e in kube_cluster.audit()
            if e["user"].get("uid") == uid and e["verb"] in WRITE_VERBS
            and e.get("objectRef", {}).get("namespace") == ns and e["objectRef"].get("name") != "probe"
        ]  # fmt: skip

    def said(e: dict[str, Any]) -> str:
        return (
            f"{e['verb']} {e['requestURI']} -> {e['responseStatus']['code']}, "
            f"received {e['requestReceivedTimestamp']}, answered {e['stageTimestamp']}"
        )

    frozen = writes(frozen_uid)
    everything = (
        f"takeover at {spec['acquireTime']}; the frozen actuator's writes: {[said(e) for e in frozen]}"
    )
    deadline = timedelta(seconds=kube.WRITE_TIMEOUT_S)
    assert all(f"timeout={kube.WRITE_TIMEOUT_S:g}s" in e["requestURI"] for e in frozen), everything
    # No write of the frozen process could land after the takeover: each was received with the
    # margin, its deadline passed before the takeover, and it was answered before it.
    late = [
        said(e) for e in frozen
        if moment(e["requestReceivedTimestamp"]) + deadline >= takeover
        or moment(e["stageTimestamp"]) >= takeover
    ]  # fmt: skip
    assert not late, f"the frozen actuator wrote too late: {late}; {everything}"
    # How, for the write held in the server: given up there at its deadline.
    (cut,) = [e for e in frozen if e["objectRef"].get("subresource") == "eviction"]
    assert cut["responseStatus"]["code"] == 504, everything
    done = {
        (e["verb"], e["objectRef"]["name"], e["objectRef"].get("subresource"))
        for e in writes(successor_uid)
        if e["responseStatus"]["code"] < 300
    }
    assert ("create", "v-evict", "eviction") in done
    # v-delete is deleted once, by whichever got to it: the successor finds a pod the frozen
    # leader deleted terminating, and leaves it.
    deletes = [
        e for uid in (frozen_uid, successor_uid) for e in writes(uid)
        if (e["verb"], e["objectRef"]["name"]) == ("delete", "v-delete") and e["responseStatus"]["code"] < 300
    ]  # fmt: skip
    assert len(deletes) == 1, everything
    # ... and wrote nothing while it was a standby.
    assert not [e for e in writes(successor_uid) if moment(e["requestReceivedTimestamp"]) < takeover]
    assert spec["leaseTransitions"] == transitions + 1
    assert spec["leaseDurationSeconds"] == int(FAILOVER_LEASE[1])  # the flag reached the Lease
    # An outcome per victim: the successor's, or the frozen leader's written before it froze (the
    # successor read it back on taking over and left that victim alone). Kafka has no fencing
    # either: an outcome whose send was in flight at the freeze could reach the log on waking,
    # beside the successor's (docs/deploy.md §5), so "only one of them" is not asserted.
    recorded = {
        name: {
            e["subject"]
            for e in ledger(name)
            if e["decisionId"] == f"{ns}/1/high" and e["state"] == "recorded"
        }
        for name in ("a", "b")
    }
    for uid in (evicted["metadata"]["uid"], deleted["metadata"]["uid"]):
        assert uid in recorded["a"] | recorded["b"], recorded


# ---- the source ----------------------------------------------------------------------------


def events_of(sink: MemorySink) -> list[dict[str, Any]]:
    return [e for r in sink.records for e in orjson.loads(r.value)["events"]]


async def until(sink: MemorySink, condition: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    await sink.wait_for(lambda _: condition(events_of(sink)), timeout=STEP_TIMEOUT_S)
    return events_of(sink)


def pod_events(events: list[dict[str, Any]], name: str) -> list[str]:
    return [
        e["type"] for e in events
        if e.get("object", {}).get("kind") == "Pod" and e["object"]["metadata"]["name"] == name
    ]  # fmt: skip


async def test_source_lists_then_watches_each_kind_in_turn(
    kube_cluster: cluster.TestCluster, as_source: client.ApiClient, ns: str
) -> None:
    kube_cluster.apply(pod("listed", ns, node_name="n1"))
    sink = MemorySink()
    before = len(kube_cluster.audit("ResponseStarted", "ResponseComplete"))
    async with running_source(as_source, sink, scope=source.Scope(namespaces=(ns,))):
        kube_cluster.apply(pod("watched", ns, node_name="n1"))
        events = await until(sink, lambda ev: "ADDED" in pod_events(ev, "watched"))
    assert events[0]["type"] == "RESYNC" and pod_events(events, "listed") == ["ADDED"]
    # managedFields (the server sets them on every write) never reach the log.
    assert all("managedFields" not in e["object"]["metadata"] for e in events if "object" in e)
    # Each kind's watch is opened right after its own list, not after every list.
    user = cluster.service_account("pc-source")
    calls = sorted(
        (
            e
            for e in kube_cluster.audit("ResponseStarted", "ResponseComplete")[before:]
            if e["user"]["username"] == user
            and (e["verb"], e["stage"]) in (("list", "ResponseComplete"), ("watch", "ResponseStarted"))
        ),
        key=lambda e: e["requestReceivedTimestamp"],
    )
    kinds = ("nodes", "priorityclasses", "namespaces", "poddisruptionbudgets", "pods")
    order = [(e["verb"], e["objectRef"]["resource"]) for e in calls][: 2 * len(kinds)]
    assert order == [(verb, kind) for kind in kinds for verb in ("list", "watch")]


async def test_the_source_writes_what_decisions_read_of_a_real_pod(
    kube_cluster: cluster.TestCluster, as_source: client.ApiClient, ns: str
) -> None:
    """A pod as the API server holds it (managedFields, last-applied-configuration, env, command,
    volumes) is written as its projection: nothing the server added or the manifest held beyond it."""
    held = kube_cluster.apply(apiserver.dress(pod("kept", ns, node_name="n1"), secret="zq9-s3cr3t"))
    assert held["metadata"]["managedFields"] and "zq9-s3cr3t" in orjson.dumps(held).decode()
    sink = MemorySink()
    async with running_source(as_source, sink, scope=source.Scope(namespaces=(ns,))):
        events = await until(sink, lambda ev: "ADDED" in pod_events(ev, "kept"))
    (kept,) = [e for e in events if e.get("object", {}).get("metadata", {}).get("name") == "kept"]
    assert kept["object"] == projection.project(held)
    assert "zq9-s3cr3t" not in orjson.dumps(kept).decode()


# The source's watches in the bookmark test end after this long: the watch cache sends a BOOKMARK
# 2 s before a watch's timeoutSeconds (and otherwise once a minute, too slow for a test).
BOOKMARK_WATCH_TIMEOUT_S = 4


async def test_bookmarks_move_the_version_and_write_nothing(
    kube_cluster: cluster.TestCluster, as_source: client.ApiClient, ns: str
) -> None:
    """PDBs are served from the watch cache (pods are not, cluster.py), which sends bookmarks. A PDB
    created in another namespace moves the cache's version on, but is no event of this namespace's
    watch: only a BOOKMARK carries that version, and the watch resumes from it when the server ends
    it, with nothing written and no relist."""
    other = f"{ns}-other"
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    sink = MemorySink()
    before = len(kube_cluster.audit("ResponseStarted"))
    resyncs = sum(s.value for s in source.RESYNCS.collect()[0].samples if s.name.endswith("_total"))
    async with running_source(
        as_source, sink, scope=source.Scope(namespaces=(ns,)), watch_timeout_s=BOOKMARK_WATCH_TIMEOUT_S
    ):
        elsewhere = kube_cluster.apply(pdb("elsewhere", other, "x", allowed=1))
        version = int(elsewhere["metadata"]["resourceVersion"])

        def pdb_watches() -> list[dict[str, str]]:
            return [
                dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(e["requestURI"]).query))
                for e in kube_cluster.audit("ResponseStarted")[before:]
                if e["user"]["username"] == cluster.service_account("pc-source") and e["verb"] == "watch"
                and e["objectRef"]["resource"] == "poddisruptionbudgets"
            ]  # fmt: skip

        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not [w for w in pdb_watches() if int(w["resourceVersion"]) >= version]:
            assert time.monotonic() < deadline, (
                f"no watch resumed from a bookmark at {version}: {pdb_watches()}"
            )
            await asyncio.sleep(0.2)
    first, *resumed = pdb_watches()
    assert first["allowWatchBookmarks"] == "true" and int(first["resourceVersion"]) < version
    assert resumed and all(w["allowWatchBookmarks"] == "true" for w in resumed)
    events = events_of(sink)
    assert [e["type"] for e in events].count("RESYNC") == 1 and "BOOKMARK" not in {e["type"] for e in events}
    assert not [e for e in events if e.get("object", {}).get("kind") == "PodDisruptionBudget"]
    assert (
        sum(s.value for s in source.RESYNCS.collect()[0].samples if s.name.endswith("_total")) == resyncs + 1
    )


async def test_410_after_compaction_relists_with_tombstones(
    kube_cluster: cluster.TestCluster, ns: str
) -> None:
    """A partition (pods deleted, one recreated under its name, etcd compacted): a resumed watch gets
    410, and a relist writes RESYNC, the ADDED run, then a tombstone for each uid that vanished."""
    kube_cluster.apply(pod("stays", ns, node_name="n1"))
    gone = kube_cluster.apply(pod("gone", ns, node_name="n1"))
    reused = kube_cluster.apply(pod("reused", ns, node_name="n1"))
    sink = MemorySink()
    resyncs = source.RESYNCS.labels("expired")._value.get()
    async with (
        proxied(kube_cluster, "source") as (proxy, api),
        running_source(api, sink, scope=source.Scope(namespaces=(ns,))),
    ):
        proxy.hang()
        for name in ("gone", "reused"):
            kube_cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", gracePeriodSeconds="0")
        renewed = kube_cluster.apply(pod("reused", ns, node_name="n1"))  # same name, new uid
        new = kube_cluster.apply(pod("new", ns, node_name="n1"))
        kube_cluster.compact()
        proxy.resume()
        proxy.drop()  # the watches reconnect from versions etcd no longer has
        await until(sink, lambda ev: "DELETED" in pod_events(ev, "gone") and "ADDED" in pod_events(ev, "new"))
        kube_cluster.apply(pod("after", ns, node_name="n1"))  # the relist's watches follow on
        events = await until(sink, lambda ev: "ADDED" in pod_events(ev, "after"))
    assert source.RESYNCS.labels("expired")._value.get() == resyncs + 1
    assert [e["type"] for e in events].count("RESYNC") == 2
    second = max(i for i, e in enumerate(events) if e["type"] == "RESYNC")
    # Nothing of the gap leaked out before the relist.
    assert not [e for e in events[:second] if e["type"] == "DELETED" or "new" in pod_events([e], "new")]
    relist = [e for e in events[second + 1 :] if e.get("object", {}).get("kind") == "Pod"]
    added = [e["object"]["metadata"]["uid"] for e in relist if e["type"] == "ADDED"]
    tombstones = [e for e in relist if e["type"] == "DELETED"]
    # The relist: stays, reused (its new uid) and new, then the two tombstones, then what follows.
    assert [e["type"] for e in relist][:5] == ["ADDED"] * 3 + ["DELETED"] * 2
    assert sorted(e["object"]["metadata"]["uid"] for e in tombstones) == sorted(
        [gone["metadata"]["uid"], reused["metadata"]["uid"]]
    )
    assert renewed["metadata"]["uid"] in added and reused["metadata"]["uid"] not in added
    # Tombstones carry the relist's version: newer than anything before the gap, so a fold applies them.
    for tombstone in tombstones:
        assert int(tombstone["object"]["metadata"]["resourceVersion"]) >= int(
            new["metadata"]["resourceVersion"]
        )
    assert pod_events(events[second:], "stays") == ["ADDED"]


async def test_only_the_lease_holder_writes_the_log(
    kube_cluster: cluster.TestCluster, as_source: client.ApiClient, ns: str
) -> None:
    kube_cluster.apply(pod("p", ns, node_name="n1"))
    first, second = MemorySink(), MemorySink()
    clock = [0.0]
    a = elector(as_source, "preemptctl-source", "source-a", retry_period_s=0.2)
    b = elector(
        as_source,
        "preemptctl-source",
        "source-b",
        retry_period_s=0.2,
        monotonic=lambda: time.monotonic() + clock[0],
    )
    scope = source.Scope(namespaces=(ns,))
    state = health.Health("standby-source")
    async with running_source(as_source, first, scope=scope, elector=a):
        other = source.Source(
            as_source,
            second,
            scope=scope,
            elector=b,
            tick_seconds=NO_TICKS,
            backoff=fast_backoff,
            health_state=state,
        )
        task = asyncio.create_task(other.run())
        try:
            await asyncio.sleep(1.0)
            assert second.records == [] and not other.ready.is_set()  # a standby writes nothing
            # ... and is ready: a healthy standby (otherwise `helm --wait` and `kubectl rollout
            # status` never finish for source.replicas=2).
            assert state.ready
        finally:
            other.stop()
            await asyncio.wait_for(task, STEP_TIMEOUT_S)
    assert events_of(first)[0]["type"] == "RESYNC"
