"""The chart's Kafka side by the real helm: connection, credentials, topics, ACLs, signing, NetworkPolicy.

What the chart renders is checked against the code that consumes it: every
component's args parse with the real command line, the client properties it
writes are read by streams.kafka.connection (with the files it mounts standing
in), the Strimzi KafkaUsers grant exactly streams.kafka.acls and the KafkaTopics
have exactly streams.kafka.topics' configs. The signing Secret is made once and
kept across upgrades and a rotation, by the real helm against a real API server.
"""

from __future__ import annotations

import base64
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas import chain
from streams.common.errors import UsageError
from streams.kafka import acls, connection, topics
from testbed import cluster
from tests.k8s.helm import CHART, by_kind, cli, container, helm, helm_template, manifests, values

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs" / "deploy.md"
COMPONENTS = ("source", "worker", "actuator")


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    return {name.removeprefix("pc-"): d for name, d in found.items()}


def secured_values() -> dict[str, Any]:
    """The values docs/deploy.md gives for a secured Kafka (the block after "secured-values")."""
    text = DEPLOY.read_text().split("<!-- secured-values -->", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block, "docs/deploy.md has no values block after <!-- secured-values -->"
    documented = yaml.safe_load(block.group(1))
    merged = values()
    for key, value in documented.items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) and key in merged else value
    return merged


def _mounted(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    """mount path -> the Secret behind it, for one component."""
    pod = workloads(docs)[component]["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes") or () if "secret" in v}
    mounts = container(workloads(docs)[component])["volumeMounts"] or ()
    return {m["mountPath"]: secrets[m["name"]] for m in mounts if m["name"] in secrets}


def test_signing_is_on_by_default_each_component_holds_only_what_it_needs() -> None:
    """Ed25519 by default: the worker mounts its private key only, the actuator the public keys only
    (derived by the chart from the key it generated), the source neither."""
    docs = manifests(values())
    (secret,) = [d for d in by_kind(docs, "Secret").values() if d["metadata"]["name"] == "pc-signing"]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert list(secret["data"]) == ["k1"]
    private = base64.b64decode(secret["data"]["k1"])
    chain.private_key(private)  # PKCS#8 PEM, what the worker loads
    public = by_kind(docs, "ConfigMap")["pc-signing-public"]["data"]
    assert public == {"k1": chain.public_pem(private).decode()}
    worker = cli().parse_args(container(workloads(docs)["worker"])["args"])
    assert (worker.hmac_key_file, worker.hmac_key_id) == ("/etc/preemptctl/signing/k1", "k1")
    actuator = cli().parse_args(container(workloads(docs)["actuator"])["args"])
    assert (actuator.signing_keys_dir, actuator.hmac_keys_dir) == ("/etc/preemptctl/signing", None)
    volumes = {c: {v["name"]: v for v in workloads(docs)[c]["spec"]["template"]["spec"].get("volumes") or ()}
               for c in COMPONENTS}  # fmt: skip
    assert volumes["worker"]["signing"]["secret"] == {
        "secretName": "pc-signing",
        "items": [{"key": "k1", "path": "k1"}],
    }
    assert volumes["actuator"]["signing"] == {"name": "signing", "configMap": {"name": "pc-signing-public"}}
    assert "pc-signing" not in _mounted(docs, "actuator").values()  # never the private key
    assert "signing" not in volumes["source"]


def test_hmac_compatibility_mode_is_the_old_chart() -> None:
    docs = manifests(values(signing__mode="hmac"))
    (secret,) = [d for d in by_kind(docs, "Secret").values() if d["metadata"]["name"] == "pc-signing"]
    assert list(secret["data"]) == ["k1"] and len(base64.b64decode(secret["data"]["k1"])) == 64
    assert "pc-signing-public" not in by_kind(docs, "ConfigMap")
    actuator = cli().parse_args(container(workloads(docs)["actuator"])["args"])
    assert (actuator.hmac_keys_dir, actuator.signing_keys_dir) == ("/etc/preemptctl/signing", None)
    assert _mounted(docs, "actuator") == {"/etc/preemptctl/signing": "pc-signing"}


def test_the_active_key_must_be_an_accepted_one() -> None:
    rendered = helm_template(
        values(signing={"enabled": True, "existingSecret": "", "keyIds": ["k1"], "activeKeyId": "k2"})
    )
    assert (
        rendered.returncode != 0
        and 'signing.activeKeyId "k2" must be one of signing.keyIds' in rendered.stderr
    )


def test_the_documented_secured_install_renders_what_the_components_accept(tmp_path: Path) -> None:
    """docs/deploy.md's secured values: every component's args parse, its client properties are
    read by streams.kafka.connection with the files mounted where the chart mounts them."""
    docs = manifests(secured_values())
    (client_secret,) = [
        d for d in by_kind(docs, "Secret").values() if d["metadata"]["name"] == "pc-kafka-client"
    ]
    text = client_secret["stringData"]["client.properties"]
    for component in COMPONENTS:
        args = cli().parse_args(container(workloads(docs)[component])["args"])
        assert args.kafka_config == "/etc/preemptctl/kafka/client.properties"
        assert args.no_create_topics is True
        mounted = _mounted(docs, component)
        assert mounted["/etc/preemptctl/kafka"] == "pc-kafka-client"
        assert mounted["/etc/preemptctl/kafka-user"] == secured_values()["kafka"]["userSecrets"][component]
        # The files the Secrets hold, where the chart mounts them (a root standing in for /).
        root = tmp_path / component
        (root / "etc/preemptctl/kafka-user").mkdir(parents=True)
        (root / "etc/preemptctl/kafka-user/username").write_text(f"preemptctl-{component}")
        (root / "etc/preemptctl/kafka-user/password").write_text("from-the-secret")
        (root / "etc/preemptctl/kafka-ca").mkdir(parents=True)
        ca = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(root / "ca.key"),
             "-out", str(root / "etc/preemptctl/kafka-ca/ca.crt"), "-days", "1", "-subj", "/CN=ca"],
            capture_output=True, check=False,
        )  # fmt: skip
        assert ca.returncode == 0, ca.stderr
        props = connection.read_properties(
            text.replace("/etc/preemptctl/", f"{root}/etc/preemptctl/"), where="x"
        )
        config = connection.parse(props, bootstrap=args.bootstrap_server)
        assert config.security_protocol == "SASL_SSL" and config.sasl_username == f"preemptctl-{component}"
        assert config.sasl_password == connection.Secret("from-the-secret") and config.ssl_context is not None
    assert "from-the-secret" not in yaml.safe_dump(docs)


def test_client_properties_with_an_unknown_key_would_be_refused_by_every_component() -> None:
    chart_values = values(
        kafka={**values()["kafka"], "properties": {"security.protocol": "SASL_SSL", "acks": "all"}}
    )
    docs = manifests(chart_values)
    (client_secret,) = [
        d for d in by_kind(docs, "Secret").values() if d["metadata"]["name"] == "pc-kafka-client"
    ]
    with pytest.raises(UsageError, match="unknown key acks"):
        text = client_secret["stringData"]["client.properties"]
        connection.parse(connection.read_properties(text, where="x"), bootstrap="k:1")


@pytest.mark.parametrize("create", [False, True], ids=["strimzi-topics", "components-create"])
def test_strimzi_users_grant_exactly_the_acls_of_the_code(create: bool) -> None:
    chart_values = values(
        strimzi={**values()["strimzi"], "enabled": True, "topics": {"enabled": not create, "partitions": 1}},
        topics={**values()["topics"], "prefix": "team-a.preemption."},
        groups={"worker": "team-a-worker", "actuator": ""},
    )
    docs = manifests(chart_values)
    users = {d["metadata"]["name"].removeprefix("pc-"): d for d in docs if d["kind"] == "KafkaUser"}
    assert set(users) == set(COMPONENTS)
    names = topics.Names("team-a.preemption.")
    for component, user in users.items():
        granted = tuple(sorted(
            acls.Acl(a["resource"]["type"], a["resource"]["name"], a["resource"]["patternType"],
                     tuple(sorted(a["operations"])))
            for a in user["spec"]["authorization"]["acls"]
        ))  # fmt: skip
        assert granted == acls.required(
            component, names=names, worker_group="team-a-worker",
            actuator_group=acls.default_actuator_group("default"), create_topics=create,
        ), component  # fmt: skip
        assert all(a["host"] == "*" for a in user["spec"]["authorization"]["acls"])
        assert user["spec"]["authentication"]["type"] == "scram-sha-512"
        assert _mounted(docs, component)["/etc/preemptctl/kafka-user"] == f"pc-{component}"


def test_strimzi_topics_are_the_code_topics() -> None:
    chart_values = values(
        strimzi={**values()["strimzi"], "enabled": True}, topics={**values()["topics"], "prefix": "b."}
    )
    docs = manifests(chart_values)
    found = {d["spec"]["topicName"]: d["spec"] for d in docs if d["kind"] == "KafkaTopic"}
    coded = topics.Layout(names=topics.Names("b."), replication_factor=3, min_insync_replicas=2).specs()
    assert set(found) == {spec.name for spec in coded}
    for spec in coded:
        assert (found[spec.name]["replicas"], found[spec.name]["partitions"]) == (3, 1)
        assert found[spec.name]["config"] == dict(spec.configs), spec.name
    for component in COMPONENTS:  # the operator's topics: the components only check them
        assert cli().parse_args(container(workloads(docs)[component])["args"]).no_create_topics


def test_created_topics_get_the_charts_replication() -> None:
    docs = manifests(values())
    for component in COMPONENTS:
        args = cli().parse_args(container(workloads(docs)[component])["args"])
        assert (args.replication_factor, args.min_insync_replicas, args.no_create_topics) == (3, 2, False)
        assert args.topic_prefix == "preemption."
    worker = cli().parse_args(container(workloads(docs)["worker"])["args"])
    actuator = cli().parse_args(container(workloads(docs)["actuator"])["args"])
    assert (worker.group, actuator.group_id, actuator.lag_group) == (
        "preemptctl-worker",
        "preemptctl-actuator-default",
        "preemptctl-worker",
    )


def test_a_network_policy_admits_only_the_metrics_port() -> None:
    docs = manifests(values())
    policies = {
        d["metadata"]["name"].removeprefix("pc-"): d["spec"] for d in docs if d["kind"] == "NetworkPolicy"
    }
    assert set(policies) == set(COMPONENTS)
    for component, spec in policies.items():
        selector = workloads(docs)[component]["spec"]["selector"]["matchLabels"]
        assert spec["podSelector"]["matchLabels"] == selector
        assert spec["policyTypes"] == ["Ingress"]
        assert spec["ingress"] == [{"ports": [{"port": 9102, "protocol": "TCP"}]}]
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    narrowed = values(networkPolicy={**values()["networkPolicy"], "metricsFrom": prometheus})
    docs = manifests(narrowed)
    (test_pod,) = [d for d in docs if d["kind"] == "Pod"]
    for spec in (d["spec"] for d in docs if d["kind"] == "NetworkPolicy"):
        (rule,) = spec["ingress"]
        assert rule["from"][:1] == prometheus
        # ... and `helm test`'s pod, which asks each component for /readyz.
        assert rule["from"][1]["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
    egress = values()["networkPolicy"]
    egress = {**egress, "egress": {**egress["egress"], "enabled": True,
                                   "kafka": [{"namespaceSelector": {"matchLabels": {"name": "kafka"}}}],
                                   "apiServer": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}}  # fmt: skip
    limited = {d["metadata"]["name"].removeprefix("pc-"): d["spec"]
               for d in manifests(values(networkPolicy=egress)) if d["kind"] == "NetworkPolicy"}  # fmt: skip
    for component, spec in limited.items():
        targets = [rule.get("to") for rule in spec["egress"]]
        assert ([{"ipBlock": {"cidr": "10.0.0.1/32"}}] in targets) is (component != "worker")
        assert [{"namespaceSelector": {"matchLabels": {"name": "kafka"}}}] in targets


def test_the_tables_are_off_and_never_on_the_metrics_port() -> None:
    default = cli().parse_args(container(workloads(manifests(values()))["worker"])["args"])
    assert default.tables_port is None
    docs = manifests(values(tables={"enabled": True, "port": 9103}))
    worker = container(workloads(docs)["worker"])
    args = cli().parse_args(worker["args"])
    assert (args.tables_port, args.tables_host, args.health_port) == (9103, "127.0.0.1", 9102)
    assert [p["containerPort"] for p in worker["ports"]] == [9102]


# ---- the signing Secret over upgrades, with the real helm and API server ----------------------


def test_the_generated_key_is_made_once_kept_and_rotated(
    kube_cluster: cluster.TestCluster, tmp_path: Path
) -> None:
    namespace, release = f"sign-{uuid.uuid4().hex[:6]}", "sign"
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    admin = str(kube_cluster.kubeconfig("admin"))

    def helm_run(verb: str, *sets: str) -> None:
        done = subprocess.run(
            [helm(), verb, release, str(CHART), "-n", namespace, "--kubeconfig", admin,
             "--set", "actuator.mode=dry-run", *(a for s in sets for a in ("--set", s))],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def keys() -> dict[str, str]:
        found: dict[str, str] = kube_cluster.request(
            "GET", f"/api/v1/namespaces/{namespace}/secrets/{release}-signing"
        )["data"]
        return found

    def worker_args() -> list[str]:
        sts = kube_cluster.request(
            "GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{release}-worker"
        )
        args: list[str] = sts["spec"]["template"]["spec"]["containers"][0]["args"]
        return args

    def public() -> dict[str, str]:
        found: dict[str, str] = kube_cluster.request(
            "GET", f"/api/v1/namespaces/{namespace}/configmaps/{release}-signing-public"
        )["data"]
        return found

    def derived(private: dict[str, str]) -> dict[str, str]:
        return {k: chain.public_pem(base64.b64decode(v)).decode() for k, v in private.items()}

    try:
        helm_run("install")
        first = keys()
        assert public() == derived(first)
        helm_run("upgrade", "image.tag=0.0.1")  # an unrelated upgrade keeps the key
        assert keys() == first and public() == derived(first)
        helm_run("upgrade", "signing.keyIds={k1,k2}")  # 1: the new key is accepted too
        both = keys()
        assert both["k1"] == first["k1"] and both["k2"] and both["k2"] != first["k1"]
        assert public() == derived(both)
        helm_run("upgrade", "signing.keyIds={k1,k2}", "signing.activeKeyId=k2")  # 2: the worker signs with it
        assert keys() == both and "--hmac-key-id=k2" in worker_args()
        helm_run("upgrade", "signing.keyIds={k2}", "signing.activeKeyId=k2")  # 3: k1 retired
        assert keys() == {"k2": both["k2"]} and public() == derived({"k2": both["k2"]})
    finally:
        subprocess.run(
            [helm(), "uninstall", release, "-n", namespace, "--kubeconfig", admin], capture_output=True
        )
    assert keys() == {"k2": both["k2"]}  # kept on uninstall
