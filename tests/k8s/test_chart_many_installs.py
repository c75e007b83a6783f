"""Many installs of the chart on one cluster, and the chart's escape hatches, by the real `helm template`.

- two releases in one namespace: each component's Lease (--lease-name, and the Role that names
  it) is the release's own;
- two aliases of the chart in one umbrella release: nothing of one selects the other's pods
  (Deployments, StatefulSets, Services, NetworkPolicies, PodDisruptionBudgets), and no two objects
  share a name; `condition: preemptctl.enabled` switches one off;
- a PKCS12 keystore on the read-only root filesystem: the Kafka client's temporary file lands in
  the pod's writable /tmp (a filesystem standing in for the pod's, built from its mounts);
- extraEnv, extraVolumes/extraVolumeMounts, podLabels, the security contexts, probe timings,
  rbac.create, serviceAccount.create/name: each reaches every component, and the schema takes it;
- what would crash-loop or open everything refuses to render: Lease timings out of order, an
  egress policy without peers.

The server-side half (both releases' components lead, the aliases' drain is not blocked) is in
tests/k8s/test_chart_install.py.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from streams.common.errors import UsageError
from tests.k8s.helm import (
    ALIAS_VALUES,
    CHART,
    HELM_TIMEOUT_S,
    ROOT,
    SELECTING,
    by_kind,
    cli,
    container,
    helm,
    helm_template,
    keystore,
    manifests,
    public_pem,
    selector_of,
    start_with_keystore,
    umbrella,
    values,
)

COMPONENTS = ("source", "worker", "actuator")


def render(
    release: str, chart_values: dict[str, Any], *args: str, chart: Path = CHART
) -> list[dict[str, Any]]:
    """`helm template RELEASE` in namespace "shared" (tests/k8s/helm.py's helpers fix the release to "pc")."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        file.write(yaml.safe_dump(chart_values))
        file.flush()
        done = subprocess.run(
            [helm(), "template", release, str(chart), "--namespace", "shared", "-f", file.name, *args],
            capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}


def lease_of(docs: list[dict[str, Any]], component: str) -> tuple[str, list[str]]:
    """(the --lease-name a component runs with, the Lease names its Role may get and update)."""
    (workload,) = [d for n, d in workloads(docs).items() if n.endswith(f"-{component}")]
    args = cli().parse_args(container(workload)["args"])
    (role,) = [r for n, r in by_kind(docs, "Role").items() if n.endswith(f"-{component}-lease")]
    named = [name for rule in role["rules"] for name in rule.get("resourceNames", ())]
    return args.lease_name, named


# ---- 1. per-release Leases --------------------------------------------------------------------


def test_two_releases_in_one_namespace_hold_two_leases_each() -> None:
    a, b = render("pc-a", values()), render("pc-b", values())
    for component in ("source", "actuator"):
        (lease_a, role_a), (lease_b, role_b) = lease_of(a, component), lease_of(b, component)
        assert lease_a == f"pc-a-{component}" and lease_b == f"pc-b-{component}"
        assert role_a == [lease_a] and role_b == [lease_b]  # each may touch its own Lease only
    # Disjoint objects too: no name in the namespace is rendered by both.
    assert not {(d["kind"], d["metadata"]["name"]) for d in a} & {
        (d["kind"], d["metadata"]["name"]) for d in b
    }
    # fullnameOverride names the Leases too; leaseName still overrides (an upgrade keeping the
    # chart 0.3.0 names, docs/deploy.md "Upgrading").
    assert lease_of(render("x", values(fullnameOverride="sched")), "source")[0] == "sched-source"
    kept = render(
        "x", values(source__leaseName="preemptctl-source", actuator__leaseName="preemptctl-actuator")
    )
    assert lease_of(kept, "source") == ("preemptctl-source", ["preemptctl-source"])
    assert lease_of(kept, "actuator") == ("preemptctl-actuator", ["preemptctl-actuator"])


# ---- 2. aliases in one umbrella ---------------------------------------------------------------


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def assert_apart(docs: list[dict[str, Any]]) -> None:
    """Every selecting object selects the pods of its own alias only, each pod is in one
    PodDisruptionBudget (the eviction subresource refuses a pod in two), no name is rendered twice."""
    pods = {name: w["spec"]["template"]["metadata"]["labels"] for name, w in workloads(docs).items()}
    for doc in docs:
        if doc["kind"] not in SELECTING:
            continue
        selected = {name for name, labels in pods.items() if selects(selector_of(doc), labels)}
        component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        assert selected == {doc["metadata"]["name"].rsplit("-", 1)[0] + f"-{component}"}, (
            doc["kind"], doc["metadata"]["name"], selected,
        )  # fmt: skip
    budgets = by_kind(docs, "PodDisruptionBudget")
    for name, labels in pods.items():
        assert len([b for b in budgets.values() if selects(selector_of(b), labels)]) == 1, name
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


@pytest.fixture(scope="module")
def two_aliases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return umbrella(
        tmp_path_factory.mktemp("umbrella") / "platform",
        {"sched-a": {**ALIAS_VALUES, "cluster": "a"}, "sched-b": {**ALIAS_VALUES, "cluster": "b"}},
    )


def test_two_aliases_in_one_umbrella_select_their_own_pods_only(two_aliases: Path) -> None:
    docs = render("platform", {}, chart=two_aliases)
    assert sorted(workloads(docs)) == sorted(
        f"platform-sched-{x}-{c}" for x in "ab" for c in COMPONENTS
    )  # an alias names its objects RELEASE-ALIAS-<component>
    assert {d["metadata"]["labels"]["app.kubernetes.io/name"] for d in docs} == {"sched-a", "sched-b"}
    assert {d["metadata"]["labels"]["app.kubernetes.io/instance"] for d in docs} == {"platform"}
    assert_apart(docs)
    # ClusterRoles and Leases apart too.
    assert sorted(by_kind(docs, "ClusterRole")) == sorted(
        f"shared-platform-sched-{x}-{c}" for x in "ab" for c in ("source", "actuator")
    )
    leases = {lease_of([d for d in docs if d["metadata"]["name"].startswith(f"platform-sched-{x}-")], c)[0]
              for x in "ab" for c in ("source", "actuator")}  # fmt: skip
    assert len(leases) == 4


def test_name_override_without_an_alias_keeps_selectors_apart() -> None:
    """fullnameOverride alone renamed the objects but left the selectors equal; nameOverride
    is what app.kubernetes.io/name says."""
    one = render("platform", values(fullnameOverride="one", nameOverride="one"))
    two = render("platform", values(fullnameOverride="two", nameOverride="two"))
    assert_apart(one + two)
    # Without nameOverride, the default release's selectors are what they always were.
    (source,) = [
        d for d in render("pc", values()) if d["kind"] == "Deployment" and "source" in d["metadata"]["name"]
    ]
    assert source["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "preemptctl",
        "app.kubernetes.io/instance": "pc",
        "app.kubernetes.io/component": "source",
    }


# ---- 3. the umbrella switch ---------------------------------------------------------------------


def test_the_schema_accepts_the_umbrella_switch(two_aliases: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(values(enabled=False))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(values(enabled="no"))
    # helm validates the subchart's values with enabled set, and the condition switches it off.
    docs = render(
        "platform", {"sched-a": {"enabled": True}, "sched-b": {"enabled": False}}, chart=two_aliases
    )
    assert sorted(workloads(docs)) == sorted(f"platform-sched-a-{c}" for c in COMPONENTS)
    lint = subprocess.run(
        [helm(), "lint", "--strict", str(two_aliases)], capture_output=True, text=True, timeout=HELM_TIMEOUT_S
    )
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr


# ---- 4. a PKCS12 keystore on a read-only root filesystem --------------------------------------


def without_tmp(workload: dict[str, Any]) -> dict[str, Any]:
    """The workload as the chart rendered it before /tmp: no tmp volume, no mount."""
    copy: dict[str, Any] = json.loads(json.dumps(workload))
    pod = copy["spec"]["template"]["spec"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "tmp"]
    main = pod["containers"][0]
    main["volumeMounts"] = [m for m in main["volumeMounts"] if m["name"] != "tmp"]
    return copy


def test_a_pkcs12_keystore_loads_on_the_read_only_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = keystore(tmp_path)
    docs = manifests(values())
    for name, workload in workloads(docs).items():
        scratch = tmp_path / name
        scratch.mkdir()
        pod = workload["spec"]["template"]["spec"]
        assert {"name": "tmp", "mountPath": "/tmp"} in container(workload)["volumeMounts"], name
        (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
        assert tmp == {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}
        config = start_with_keystore(workload, store, scratch, monkeypatch)
        assert config.ssl_context is not None, name
        assert not list((scratch / "mounts" / "tmp").iterdir())  # the key was written and removed
    # The control: the source as it was (no writable /tmp, no writable working directory) cannot.
    source = by_kind(docs, "Deployment")["pc-source"]
    (tmp_path / "before").mkdir()
    with pytest.raises(UsageError, match="No usable temporary directory"):
        start_with_keystore(without_tmp(source), store, tmp_path / "before", monkeypatch)


# ---- 5. escape hatches ----------------------------------------------------------------------------

HATCHES = values(
    extraEnv=[{"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"},
              {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
    extraVolumes=[{"name": "corp-ca", "configMap": {"name": "corp-ca"}}],
    extraVolumeMounts=[{"name": "corp-ca", "mountPath": "/etc/corp-ca", "readOnly": True}],
    podLabels={"team": "sched", "app.kubernetes.io/name": "not-this"},
    podAnnotations={"sidecar.istio.io/inject": "false"},
    podSecurityContext={"runAsUser": None, "fsGroup": None, "runAsGroup": 20001},
    containerSecurityContext={"seLinuxOptions": {"type": "spc_t"}},
    probes={"liveness": {"timeoutSeconds": 5, "failureThreshold": 6, "initialDelaySeconds": 10},
            "readiness": {"periodSeconds": 2, "timeoutSeconds": 3}},
    rbac={"create": False},
    serviceAccount={"create": False, "annotations": {}},
    source__serviceAccount={"name": "platform-source", "annotations": {}},
)  # fmt: skip


def test_the_escape_hatches_are_in_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    validator.validate(HATCHES)
    for bad in (
        values(extraEnv=[{"value": "no name"}]),
        values(extraVolumeMounts=[{"name": "x", "mountPath": "relative"}]),
        values(podLabels={"team": "a b"}),
        values(probes={"liveness": {"periodSeconds": 0}}),
        values(probes={"liveness": {"successThreshold": 2}}),  # must be 1 for liveness: not offered
        values(probes={"liveness": {"httpGet": {"path": "/"}}}),  # the probe itself is the chart's
        values(rbac={"create": "yes"}),
        values(
            serviceAccount={"create": True, "name": "one-for-all"}
        ),  # per component: <c>.serviceAccount.name
        values(source__serviceAccount={"name": "Not_A_Name"}),
        values(nameOverride="Not_A_Name"),
    ):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)


def test_each_escape_hatch_reaches_every_component() -> None:
    docs = manifests(HATCHES)
    assert not [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                                   "Role", "RoleBinding")]  # fmt: skip
    for name, workload in workloads(docs).items():
        pod = workload["spec"]["template"]
        main = container(workload)
        env = main["env"]
        assert env[-2:] == HATCHES["extraEnv"], name
        assert {"name": "corp-ca", "configMap": {"name": "corp-ca"}} in pod["spec"]["volumes"], name
        assert {"name": "corp-ca", "mountPath": "/etc/corp-ca", "readOnly": True} in main["volumeMounts"]
        labels = pod["metadata"]["labels"]
        assert labels["team"] == "sched" and labels["app.kubernetes.io/name"] == "preemptctl", name
        assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        # Keys replaced one by one; null removes one; the rest of the secure defaults stay.
        assert pod["spec"]["securityContext"] == {
            "runAsNonRoot": True, "runAsGroup": 20001, "seccompProfile": {"type": "RuntimeDefault"},
        }, name  # fmt: skip
        assert main["securityContext"] == {
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seLinuxOptions": {"type": "spc_t"},
        }, name  # fmt: skip
        assert main["livenessProbe"] == {
            "httpGet": {"path": "/livez", "port": "metrics"},
            "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 5, "initialDelaySeconds": 10,
        }, name  # fmt: skip
        assert main["readinessProbe"] == {
            "httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 2, "timeoutSeconds": 3,
        }, name  # fmt: skip
        component = name.removeprefix("pc-")
        expected_account = "platform-source" if component == "source" else name
        assert pod["spec"]["serviceAccountName"] == expected_account, name
        cli().parse_args(main["args"])
    # The helm test pod runs with the same security contexts.
    test_pod = by_kind(docs, "Pod")["pc-test"]
    assert test_pod["spec"]["securityContext"]["runAsGroup"] == 20001
    assert "runAsUser" not in test_pod["spec"]["securityContext"]


def test_the_defaults_keep_the_secure_contexts_and_probe_timings() -> None:
    for name, workload in workloads(manifests(values())).items():
        pod, main = workload["spec"]["template"]["spec"], container(workload)
        assert pod["securityContext"] == {
            "runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        }, name  # fmt: skip
        assert main["securityContext"] == {
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, name  # fmt: skip
        assert (main["livenessProbe"]["periodSeconds"], main["livenessProbe"]["failureThreshold"]) == (10, 3)
        assert main["readinessProbe"]["periodSeconds"] == 5
        assert "env" not in main or all(e["name"] == "POD_NAME" for e in main["env"])


def test_service_accounts_named_by_the_user_are_bound_by_the_charts_rbac() -> None:
    docs = manifests(values(actuator__serviceAccount={"name": "act", "annotations": {}}))
    bound = {(b["roleRef"]["name"], s["name"]) for kind in ("ClusterRoleBinding", "RoleBinding")
             for b in by_kind(docs, kind).values() for s in b["subjects"]}  # fmt: skip
    assert ("preemption-pc-actuator", "act") in bound and ("pc-actuator-lease", "act") in bound
    assert "act" in by_kind(docs, "ServiceAccount")
    assert (
        by_kind(docs, "StatefulSet")["pc-actuator"]["spec"]["template"]["spec"]["serviceAccountName"] == "act"
    )


# ---- 7. what refuses to render ------------------------------------------------------------------


@pytest.mark.parametrize(
    "lease",
    [
        {"durationSeconds": 15, "renewDeadlineSeconds": 15, "retryPeriodSeconds": 2},
        {"durationSeconds": 15, "renewDeadlineSeconds": 10, "retryPeriodSeconds": 10},
        {"durationSeconds": 8, "renewDeadlineSeconds": 9.5, "retryPeriodSeconds": 2},
    ],
)
def test_lease_timings_out_of_order_refuse_to_render(lease: dict[str, float]) -> None:
    """The schema checks each bound; the order is checked at render time, so a GitOps sync
    fails instead of the pods crash-looping (the processes refuse it at start, exit 2)."""
    from streams.kube import lease as lease_mod

    with pytest.raises(Exception):  # noqa: B017 - whatever the processes raise, they refuse it
        lease_mod.check_timings(
            lease_duration_s=lease["durationSeconds"],
            renew_deadline_s=lease["renewDeadlineSeconds"],
            retry_period_s=lease["retryPeriodSeconds"],
        )
    refused = helm_template(values(lease=lease))
    assert refused.returncode != 0 and "retryPeriodSeconds" in refused.stderr and refused.stdout == ""


def test_an_egress_policy_without_peers_refuses_to_render() -> None:
    api_server = [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    egress = {
        "enabled": True,
        "kafka": [],
        "kafkaPorts": [9092],
        "apiServer": api_server,
        "apiServerPorts": [443],
    }
    refused = helm_template(values(networkPolicy={"enabled": True, "metricsFrom": [], "egress": egress}))
    assert refused.returncode != 0 and "networkPolicy.egress.kafka" in refused.stderr
    egress = {**egress, "kafka": [{"namespaceSelector": {"matchLabels": {"name": "kafka"}}}], "apiServer": []}
    refused = helm_template(values(networkPolicy={"enabled": True, "metricsFrom": [], "egress": egress}))
    assert refused.returncode != 0 and "networkPolicy.egress.apiServer" in refused.stderr
    egress = {**egress, "apiServer": api_server}
    docs = manifests(values(networkPolicy={"enabled": True, "metricsFrom": [], "egress": egress}))
    for policy in by_kind(docs, "NetworkPolicy").values():
        assert all(rule.get("to") for rule in policy["spec"]["egress"][1:])


def test_renders_are_deterministic() -> None:
    """Byte for byte, twice, but for the generated signing key (made once, then kept by lookup):
    a Secret of the user's, with its public key given (Ed25519), or in the HMAC compatibility mode."""
    ed25519 = HATCHES | {
        "signing": {**HATCHES["signing"], "existingSecret": "keys", "publicKeys": {"k1": public_pem(1)}}
    }
    hmac = HATCHES | {"signing": {**HATCHES["signing"], "existingSecret": "keys", "mode": "hmac"}}
    for chart_values in (ed25519, hmac):
        first, second = helm_template(chart_values), helm_template(chart_values)
        assert first.returncode == 0 and first.stdout == second.stdout, first.stderr


# ---- 8. docs/deploy.md: many installs on one cluster and one Kafka ---------------------------------


def documented_installs() -> list[list[str]]:
    """The `helm install` commands of docs/deploy.md's block after <!-- many-installs -->, as argv."""
    text = (ROOT / "docs" / "deploy.md").read_text().split("<!-- many-installs -->", 1)[1]
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.startswith("helm ")]


def test_the_documented_many_installs_share_nothing_they_must_not() -> None:
    installs = documented_installs()
    assert len(installs) == 2
    rendered = []
    for argv in installs:
        assert argv[:2] == ["helm", "install"] and argv[3] == "deploy/helm/preemptctl"
        release, rest = argv[2], argv[4:]
        namespace = rest[rest.index("-n") + 1]
        sets = [rest[i + 1] for i, arg in enumerate(rest) if arg == "--set"]
        done = subprocess.run(
            [helm(), "template", release, str(CHART), "--namespace", namespace,
             *[a for s in sets for a in ("--set", s)]],
            capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        rendered.append([d for d in yaml.safe_load_all(done.stdout) if d is not None])
    a, b = rendered
    assert_apart(a + b)  # names, selectors, budgets
    for component in ("source", "actuator"):
        assert lease_of(a, component)[0] != lease_of(b, component)[0]

    def args_of(docs: list[dict[str, Any]], component: str) -> Any:
        (workload,) = [w for n, w in workloads(docs).items() if n.endswith(f"-{component}")]
        return cli().parse_args(container(workload)["args"])

    for field in ("cluster", "scheduler_name"):
        assert getattr(args_of(a, "source"), field) != getattr(args_of(b, "source"), field), field
    for component in COMPONENTS:
        assert args_of(a, component).topic_prefix != args_of(b, component).topic_prefix
    assert args_of(a, "worker").group != args_of(b, "worker").group  # --group-id
    assert args_of(a, "actuator").group_id != args_of(b, "actuator").group_id
    assert args_of(a, "worker").hmac_key_file == args_of(b, "worker").hmac_key_file  # the same path, in
    signing = [
        {
            v["secret"]["secretName"] if "secret" in v else v["configMap"]["name"]
            for w in workloads(docs).values()
            for v in w["spec"]["template"]["spec"]["volumes"]
            if v["name"] == "signing"
        }
        for docs in (a, b)
    ]
    # The worker's private key and the actuator's public keys: another pair per install.
    assert len(signing[0]) == len(signing[1]) == 2 and not signing[0] & signing[1]
    assert args_of(a, "actuator").install_id is None  # bound to the install by its own prefix


@pytest.mark.parametrize(
    ("repository", "registry", "image"),
    [
        ("ghcr.io/preemptctl/preemptctl", "", "ghcr.io/preemptctl/preemptctl"),
        ("ghcr.io/preemptctl/preemptctl", "mirror.corp:5000", "mirror.corp:5000/preemptctl/preemptctl"),
        ("ghcr.io/preemptctl/preemptctl", "mirror.corp/ghcr/", "mirror.corp/ghcr/preemptctl/preemptctl"),
        ("localhost/preemptctl", "mirror.corp", "mirror.corp/preemptctl"),
        ("preemptctl/preemptctl", "mirror.corp", "mirror.corp/preemptctl/preemptctl"),  # Docker Hub's
    ],
)
def test_global_image_registry_is_a_mirror_of_the_images_registry(
    repository: str, registry: str, image: str
) -> None:
    chart_values = values(image__repository=repository, **{"global": {"imageRegistry": registry}})
    jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text())).validate(chart_values)
    docs = manifests(chart_values)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    for name, workload in workloads(docs).items():
        assert container(workload)["image"] == f"{image}:{version}", name
    pinned = manifests({**chart_values, "image": {**chart_values["image"], "digest": "sha256:" + "cd" * 32}})
    (test_container,) = by_kind(pinned, "Pod")["pc-test"]["spec"]["containers"]
    assert test_container["image"] == f"{image}@sha256:" + "cd" * 32


def test_an_inline_kafka_password_is_not_in_the_pod_annotation_as_its_plain_hash() -> None:
    """The kafka checksum rolls the pods when the client properties change, and is no plain
    SHA-256 of them (or of the password alone), from which a weak password could be guessed."""
    import hashlib

    def checksums(release: str, password: str) -> set[str]:
        properties = {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "pc",
            "sasl.password": password,
        }
        docs = render(release, values(kafka__properties=properties))
        found = {w["spec"]["template"]["metadata"]["annotations"]["preemptctl.io/kafka-checksum"]
                 for w in workloads(docs).values()}  # fmt: skip
        (secret,) = [
            s for s in by_kind(docs, "Secret").values() if s["metadata"]["name"].endswith("-kafka-client")
        ]
        text = secret["stringData"]["client.properties"]
        plain = {hashlib.sha256(t.encode()).hexdigest() for t in (password, text, text.strip())}
        assert not found & plain
        return found

    first = checksums("pc", "hunter2")
    assert len(first) == 1  # one checksum for every component
    assert checksums("pc", "hunter2") == first  # deterministic: no roll without a change
    assert checksums("pc", "hunter3") != first  # a new password rolls the pods
    assert checksums("other", "hunter2") != first  # salted per release
