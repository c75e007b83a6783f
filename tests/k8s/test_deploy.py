"""Everything under deploy/ and docker-compose.yml parses, and grants and runs exactly what the code needs.

Helm is not needed here: `render` implements the small part of Go templates the chart
uses (values, release fields, if/else/end, quote, printf, toYaml, nindent, default), and
fails on anything else, so the chart cannot grow a construct this test cannot
check. Rendered args are parsed by the real command line, so a renamed flag
breaks this test rather than a deployment.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
import yaml

from streams.kube import actuator, source

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "preemptctl"
RELEASE = {"Name": "pc", "Namespace": "preemption", "Service": "Helm"}
TOKEN = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)
WILDCARD = "*"


# ---- a tiny Go-template renderer --------------------------------------------------------


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def _lookup(path: str, context: dict[str, Any]) -> Any:
    value: Any = context
    for part in path.strip(".").split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"template refers to missing .{path.strip('.')}")
        value = value[part]
    return value


def _term(token: str, context: dict[str, Any]) -> Any:
    if token.startswith("."):
        return _lookup(token, context)
    if token.isdigit():
        return int(token)
    return token  # a string literal, already unquoted by shlex


def _indent(n: int, text: str) -> str:
    return "\n".join(" " * n + line if line else line for line in str(text).split("\n"))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quote": lambda v: json.dumps(str(v)),
    "toYaml": lambda v: yaml.safe_dump(v, default_flow_style=False, sort_keys=False).rstrip("\n"),
    "nindent": lambda n, v: "\n" + _indent(n, v),
    "indent": _indent,
    "default": lambda d, v: v if _truthy(v) else d,
    # Go's %s/%v print strings and integers as Python's str() does.
    "printf": lambda fmt, *args: fmt.replace("%v", "%s") % tuple(str(a) for a in args),
}


def _evaluate(expression: str, context: dict[str, Any]) -> Any:
    value: Any = None
    for i, stage in enumerate(part.strip() for part in expression.split("|")):
        name, *args = shlex.split(stage)
        if name in FUNCTIONS:
            values = [_term(a, context) for a in args] + ([value] if i else [])
            value = FUNCTIONS[name](*values)
        elif i == 0 and not args:
            value = _term(name, context)
        else:
            raise ValueError(f"unsupported template expression {expression!r}")
    return value


def render(text: str, context: dict[str, Any]) -> str:
    out: list[str] = []
    active: list[bool] = []
    position, trim_next = 0, False
    for match in TOKEN.finditer(text):
        literal = text[position : match.start()]
        if trim_next:
            literal = literal.lstrip()
        if match.group(1):
            literal = literal.rstrip()
        if all(active):
            out.append(literal)
        position, trim_next = match.end(), bool(match.group(3))
        action = match.group(2)
        if action.startswith("/*"):
            continue
        if action.startswith("if "):
            active.append(all(active) and _truthy(_evaluate(action[3:], context)))
        elif action == "else":
            active[-1] = not active[-1]
        elif action == "end":
            active.pop()
        elif all(active):
            value = _evaluate(action, context)
            out.append("" if value is None else str(value))
    assert not active, "unterminated if"
    tail = text[position:]
    out.append(tail.lstrip() if trim_next else tail)
    return "".join(out)


def values(**overrides: Any) -> dict[str, Any]:
    merged: dict[str, Any] = copy.deepcopy(yaml.safe_load((CHART / "values.yaml").read_text()))
    for dotted, value in overrides.items():
        target = merged
        *parents, leaf = dotted.split("__")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return merged


def manifests(chart_values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    context = {
        "Values": chart_values,
        "Release": RELEASE,
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
    }
    docs = []
    for template in sorted((CHART / "templates").glob("*.yaml")):
        rendered = render(template.read_text(), context)
        docs += [d for d in yaml.safe_load_all(rendered) if d is not None]
    return docs


DEFAULTS = values()
EVERYTHING = values(
    hmacSecret="preemptctl-hmac",
    lease={"durationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 2.5},
    actuator__dryRun=True,
    source__extraArgs=["--namespace=team-a", "--scheduler-name=batch"],
    podAnnotations={"team": "sched"},
    nodeSelector={"pool": "system"},
    tolerations=[{"key": "system", "operator": "Exists"}],
)


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def permissions(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def declared(required: tuple[tuple[str, str, tuple[str, ...]], ...]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g, r, verbs in required for v in verbs}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return cast(dict[str, Any], only)


def cli() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="preemptctl")
    sub = top.add_subparsers(dest="command")
    source.register(sub)
    actuator.register(sub)
    worker = importlib.util.find_spec("streams.pipeline.app")
    if worker is not None:  # the worker's command line, where it exists
        importlib.import_module("streams.pipeline.app").register(sub)
    return top


# ---- the chart --------------------------------------------------------------------------


def test_chart_metadata_and_values_schema() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["name"], chart["type"]) == ("v2", "preemptctl", "application")
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)  # the draft Helm validates values with
    for good in (DEFAULTS, EVERYTHING):
        validator.validate(good)
    for bad in (
        values(broker="localhost:9092"),
        values(source__replicas=3),
        values(actuator__extraArgs=["x"]),
        # What the server refused, or what broke the YAML, before the schema said no:
        values(source__resources={"requests": {"cpu": "lots"}}),
        values(cluster='prod"eu'),
        values(cluster="Prod_EU"),
        values(actuator__leaseName="l" * 254),
        values(source__leaseName="Not-A-Name"),
        values(hmacSecret='key" --dry-run'),
        values(image__tag="1.0 --x"),
        values(lease__durationSeconds=12.5),  # the Lease records whole seconds
        values(lease__renewDeadlineSeconds=5),  # no room for one 5 s write
        values(lease__retryPeriodSeconds=0),
        values(worker__persistence={"size": "10Gi", "storageClassName": "Fast SSD"}),
    ):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)
    for good in (
        values(source__resources={"requests": {"cpu": "1.5", "memory": "512Mi"}, "limits": {"cpu": 2}}),
        values(actuator__leaseName="preemptctl.actuator-" + "l" * 200),
    ):
        validator.validate(good)


@pytest.mark.parametrize("chart_values", [DEFAULTS, EVERYTHING], ids=["defaults", "everything"])
def test_chart_renders_to_the_expected_objects(chart_values: dict[str, Any]) -> None:
    docs = manifests(chart_values)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["Deployment"] * 2 + ["StatefulSet", "Service"] + ["ServiceAccount"] * 3 + ["ClusterRole"] * 2
        + ["ClusterRoleBinding"] * 2 + ["Role"] * 2 + ["RoleBinding"] * 2
    )  # fmt: skip
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "pc"
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "preemption"


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def test_rbac_is_least_privilege_and_matches_the_code() -> None:
    docs = manifests(DEFAULTS)
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert WILDCARD not in rule.get(field, []), (
                        f"{doc['metadata']['name']}: wildcard in {field}"
                    )
                    assert not [v for v in rule.get(field, []) if "*" in str(v)]
    cluster_roles = by_kind(docs, "ClusterRole")
    assert set(cluster_roles) == {"pc-source", "pc-actuator"}
    assert permissions(cluster_roles["pc-source"]["rules"]) == declared(source.REQUIRED_RBAC)
    assert permissions(cluster_roles["pc-actuator"]["rules"]) == declared(actuator.REQUIRED_RBAC)
    roles = by_kind(docs, "Role")
    assert set(roles) == {"pc-actuator-lease", "pc-source-lease"}
    for component, required in (
        ("actuator", actuator.REQUIRED_LEASE_RBAC),
        ("source", source.REQUIRED_LEASE_RBAC),
    ):
        role = roles[f"pc-{component}-lease"]
        assert permissions(role["rules"]) == declared(required)
        named = [r for r in role["rules"] if r.get("resourceNames")]
        assert named and all(r["resourceNames"] == [f"preemptctl-{component}"] for r in named)
        assert {v for r in named for v in r["verbs"]} == {"get", "update"}
    # Bindings: each component's role to its own ServiceAccount, and none for the worker.
    bindings = list(by_kind(docs, "ClusterRoleBinding").values()) + list(
        by_kind(docs, "RoleBinding").values()
    )
    bound = {(b["roleRef"]["name"], s["name"]) for b in bindings for s in b["subjects"]}
    assert bound == {
        ("pc-source", "pc-source"),
        ("pc-source-lease", "pc-source"),
        ("pc-actuator", "pc-actuator"),
        ("pc-actuator-lease", "pc-actuator"),
    }
    assert all(
        s["namespace"] == "preemption" and s["kind"] == "ServiceAccount"
        for b in bindings
        for s in b["subjects"]
    )
    accounts = by_kind(docs, "ServiceAccount")
    assert accounts["pc-worker"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("chart_values", [DEFAULTS, EVERYTHING], ids=["defaults", "everything"])
def test_deployments_run_the_right_component_with_probes(chart_values: dict[str, Any]) -> None:
    docs = manifests(chart_values)
    deployments = {
        **by_kind(docs, "Deployment"),
        **by_kind(docs, "StatefulSet"),
    }  # the worker's is a StatefulSet
    assert set(deployments) == {"pc-source", "pc-worker", "pc-actuator"}
    port = chart_values["metricsPort"]
    for name, deployment in deployments.items():
        component = name.removeprefix("pc-")
        pod = deployment["spec"]["template"]
        assert pod["spec"]["serviceAccountName"] == name
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        main = container(deployment)
        assert main["args"][0] == component
        assert f"--health-port={port}" in main["args"]
        assert main["ports"] == [{"name": "metrics", "containerPort": port}]
        assert main["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert main["image"] == f"{chart_values['image']['repository']}:{chart_values['image']['tag']}"
    assert deployments["pc-source"]["spec"]["strategy"] == {"type": "Recreate"}
    assert deployments["pc-worker"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False

    # The rendered args are what the command line accepts.
    src = cli().parse_args(container(deployments["pc-source"])["args"])
    assert (src.broker, src.cluster, src.tick_seconds) == (chart_values["broker"], "default", 1.0)
    if importlib.util.find_spec("streams.pipeline.app") is not None:
        cli().parse_args(container(deployments["pc-worker"])["args"])
    act = cli().parse_args(container(deployments["pc-actuator"])["args"])
    assert (act.lease_name, act.lease_namespace, act.identity) == (
        "preemptctl-actuator",
        "preemption",
        "$(POD_NAME)",
    )
    assert act.dry_run is chart_values["actuator"]["dryRun"]
    timings = chart_values["lease"]
    for parsed in (src, act):
        assert (parsed.lease_duration, parsed.renew_deadline, parsed.retry_period) == (
            timings["durationSeconds"],
            timings["renewDeadlineSeconds"],
            timings["retryPeriodSeconds"],
        )
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container(
        deployments["pc-actuator"]
    )["env"]
    if chart_values["hmacSecret"]:
        assert act.hmac_key_file == ["/etc/preemptctl/hmac/hmac.key"]
        volumes = deployments["pc-actuator"]["spec"]["template"]["spec"]["volumes"]
        assert {"name": "hmac", "secret": {"secretName": "preemptctl-hmac"}} in volumes
        assert "--hmac-key-file=/etc/preemptctl/hmac/hmac.key" in container(deployments["pc-worker"])["args"]
        assert src.namespace == ["team-a"] and src.scheduler_name == "batch"
    else:
        assert act.hmac_key_file is None


def test_notes_render() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    context = {"Values": EVERYTHING, "Release": RELEASE, "Chart": {"AppVersion": chart["appVersion"]}}
    notes = render((CHART / "templates" / "NOTES.txt").read_text(), context)
    assert "DRY RUN" in notes and "{{" not in notes


# Values the manifests hold as integers (the schema says integer): the only output left unquoted.
INTEGER_VALUES = {".Values.source.replicas", ".Values.worker.replicas", ".Values.actuator.replicas",
                  ".Values.metricsPort"}  # fmt: skip


def test_every_templated_string_is_quoted() -> None:
    """A string printed unquoted is read by YAML as whatever it looks like: a Secret named 12345
    became a number (the server refuses it), `true` a boolean, a quote broke the document."""
    unquoted = []
    for template in sorted((CHART / "templates").glob("*.yaml")):
        for match in TOKEN.finditer(template.read_text()):
            action = match.group(2)
            if action.startswith(("if ", "/*")) or action in ("else", "end"):
                continue
            last = action.split("|")[-1].strip()
            # (indent: a chart file copied into a block scalar, where YAML reads no type)
            if last == "quote" or last.startswith(("toYaml", "nindent", "indent")):
                continue
            if action in INTEGER_VALUES:
                continue
            unquoted.append(f"{template.name}: {{{{ {action} }}}}")
    assert not unquoted, unquoted


def test_the_renderer_refuses_what_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        render('{{ include "x" . }}', {"Values": {}})
    with pytest.raises(KeyError, match="missing"):
        render("{{ .Values.nope }}", {"Values": {}})


# ---- docker-compose.yml and the Dockerfile ----------------------------------------------


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR:-default} / ${VAR-default} / ${VAR}, enough for this file."""

    def substitute(match: re.Match[str]) -> str:
        name, op, default = match.group(1), match.group(2), match.group(3) or ""
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        return env.get(name, "")

    return re.sub(r"\$\{(\w+)(?:(:-|-)([^}]*))?\}", substitute, text)


@pytest.mark.parametrize(
    ("env", "dry_run"), [({}, True), ({"PREEMPTCTL_ACTUATOR_ARGS": ""}, False)], ids=["default", "acting"]
)
def test_compose_file(env: dict[str, str], dry_run: bool) -> None:
    compose = yaml.safe_load(_interpolate((ROOT / "docker-compose.yml").read_text(), env))
    services = compose["services"]
    assert set(services) == {"kafka", "source", "worker", "actuator"}
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft: no ZooKeeper
    assert "healthcheck" in kafka
    for name in ("source", "worker", "actuator"):
        service = services[name]
        assert service["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
        assert service["depends_on"] == {"kafka": {"condition": "service_healthy"}}
        args = shlex.split(service["command"])
        assert (
            args[0] == name
            and "--broker" in args
            and args[args.index("--broker") + 1] == "kafka://kafka:9092"
        )
    if importlib.util.find_spec("streams.pipeline.app") is not None:
        cli().parse_args(shlex.split(services["worker"]["command"]))
    for name in ("source", "actuator"):
        assert any(v.endswith(":/kube/config:ro") for v in services[name]["volumes"])
        parsed = cli().parse_args(shlex.split(services[name]["command"]))
        assert parsed.kubeconfig == "/kube/config"
    assert cli().parse_args(shlex.split(services["actuator"]["command"])).dry_run is dry_run


def test_dockerfile() -> None:
    lines = [line.strip() for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()]
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms and all(image == "python:3.11-slim" for image in froms)
    assert any(line.startswith("RUN pip install") and line.endswith(" .") for line in lines)
    assert 'ENTRYPOINT ["preemptctl"]' in lines
    assert any(line.startswith("USER ") and line != "USER root" for line in lines)
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    assert "*" in ignore and "!streams/" in ignore
