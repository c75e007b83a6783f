"""The chart's issue-29 surface by the real helm (and, where cheap, the real kube-apiserver v1.34):
Ed25519 signing keys (the actuator holds public keys only), --install-id, --max-decision-age,
--accept-unsigned, the actuator's ledger on a claim per replica, the ValidatingAdmissionPolicy that
limits the actuator's pod updates, and nested topic prefixes refused at render.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

from schemas import chain
from testbed import cluster
from tests.k8s.helm import by_kind, cli, container, helm_template, manifests, public_pem, values

SOFT = "scheduling.koordinator.sh/soft-eviction"


def _actuator(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(docs, "StatefulSet")["pc-actuator"]


def _refused(chart_values: dict[str, Any], *args: str) -> str:
    rendered = helm_template(chart_values, *args)
    assert rendered.returncode != 0 and rendered.stdout == "", rendered.stdout[:200]
    return rendered.stderr


# ---- 1. signing -----------------------------------------------------------------------------------


def test_an_existing_secret_needs_its_public_keys_under_helm_template() -> None:
    signing = {**values()["signing"], "existingSecret": "mine", "keyIds": ["k1", "k2"], "activeKeyId": "k2"}
    stderr = _refused(values(signing=signing))
    assert 'no public key for key id "k1"' in stderr and "signing.publicKeys.k1" in stderr
    given = manifests(values(signing={**signing, "publicKeys": {"k1": public_pem(1), "k2": public_pem(2)}}))
    assert by_kind(given, "ConfigMap")["pc-signing-public"]["data"] == {
        "k1": public_pem(1),
        "k2": public_pem(2),
    }
    assert not [s for s in by_kind(given, "Secret") if "signing" in s]  # the user's Secret, not the chart's
    stray = {**signing, "publicKeys": {"k1": public_pem(1), "k2": public_pem(2), "k9": public_pem(9)}}
    assert 'names key id "k9", which is not one of signing.keyIds' in _refused(values(signing=stray))
    # The HMAC compatibility mode needs none (the actuator mounts the shared keys, as up to 0.3.0).
    assert manifests(values(signing={**signing, "mode": "hmac"}))


def test_given_public_keys_win_and_generated_ones_are_derived() -> None:
    docs = manifests(values(signing__keyIds=["k1", "k2"], signing__publicKeys={"k2": public_pem(2)}))
    secret = by_kind(docs, "Secret")["pc-signing"]["data"]
    public = by_kind(docs, "ConfigMap")["pc-signing-public"]["data"]
    assert public["k1"] == chain.public_pem(base64.b64decode(secret["k1"])).decode()
    assert public["k2"] == public_pem(2)


def test_install_id_reaches_worker_and_actuator() -> None:
    docs = manifests(values(signing__installId="prod-eu"))
    worker = cli().parse_args(container(by_kind(docs, "StatefulSet")["pc-worker"])["args"])
    actuator = cli().parse_args(container(_actuator(docs))["args"])
    assert worker.install_id == actuator.install_id == "prod-eu"
    default = cli().parse_args(container(_actuator(manifests(values())))["args"])
    assert default.install_id is None  # the code's default: the topic prefix


# ---- 2. freshness and unsigned decisions ----------------------------------------------------------


def test_max_decision_age_and_accept_unsigned() -> None:
    args = cli().parse_args(container(_actuator(manifests(values(actuator__maxDecisionAge=45))))["args"])
    assert (args.max_decision_age, args.accept_unsigned) == (45, False)
    unsigned = manifests(values(signing__enabled=False, actuator__acceptUnsigned=True))
    args = cli().parse_args(container(_actuator(unsigned))["args"])
    assert args.accept_unsigned and args.signing_keys_dir is None and args.hmac_keys_dir is None
    assert "ConfigMap" not in {d["kind"] for d in unsigned if "signing" in d["metadata"]["name"]}
    assert "actuator.acceptUnsigned=true" in _refused(values(signing__enabled=False))
    assert "applies only with signing.enabled=false" in _refused(values(actuator__acceptUnsigned=True))


# ---- 3. the ledger ------------------------------------------------------------------------------


def test_the_ledger_is_on_a_claim_per_replica() -> None:
    actuator = _actuator(manifests(values(actuator__persistence={"size": "3Gi", "storageClassName": "ssd"})))
    (claim,) = actuator["spec"]["volumeClaimTemplates"]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "ssd",
        "resources": {"requests": {"storage": "3Gi"}},
    }
    assert {"name": "state", "mountPath": "/var/lib/preemptctl"} in container(actuator)["volumeMounts"]
    assert cli().parse_args(container(actuator)["args"]).ledger_file.startswith("/var/lib/preemptctl/")
    assert not any(
        "emptyDir" in v for v in actuator["spec"]["template"]["spec"]["volumes"] if v["name"] == "state"
    )


# ---- 4. the admission policy --------------------------------------------------------------------


def test_the_pod_update_policy_renders_for_1_30_and_later_only() -> None:
    docs = manifests(values())
    (policy,) = by_kind(docs, "ValidatingAdmissionPolicy").values()
    (binding,) = by_kind(docs, "ValidatingAdmissionPolicyBinding").values()
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (condition,) = policy["spec"]["matchConditions"]
    assert (
        condition["expression"]
        == "request.userInfo.username == 'system:serviceaccount:preemption:pc-actuator'"
    )
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["pods", "pods/status"]
    old = helm_template(values(), "--kube-version", "1.29.0")
    assert old.returncode == 0 and "ValidatingAdmissionPolicy" not in old.stdout
    assert not by_kind(
        manifests(values(actuator__podUpdatePolicy={"enabled": False})), "ValidatingAdmissionPolicy"
    )


def _patch(kube: cluster.TestCluster, path: str, body: dict[str, Any], content: str) -> int:
    """PATCH as the session install's actuator ServiceAccount: the HTTP status."""
    request = urllib.request.Request(
        kube.url + path, method="PATCH", data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {kube.token('actuator')}", "Content-Type": content},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(kube.ca_file)),
                                    timeout=30):  # fmt: skip
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_actuator_may_patch_only_the_soft_eviction_label_and_disruption_target(
    kube_cluster: cluster.TestCluster,
) -> None:
    """The session install (the chart's own objects, applied as the admin) holds the policy."""
    namespace = f"vap-{uuid.uuid4().hex[:6]}"
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kube_cluster.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "victim", "namespace": namespace, "labels": {"app": "x"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "busybox:1"}]},
    })  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/pods/victim"
    merge = "application/merge-patch+json"
    image = {"spec": {"containers": [{"name": "main", "image": "evil:1"}]}}
    strategic = "application/strategic-merge-patch+json"
    # The policy is compiled a moment after it is created: wait until it refuses (the RBAC allows it).
    deadline = time.monotonic() + 60
    while (code := _patch(kube_cluster, path, image, strategic)) == 200 and time.monotonic() < deadline:
        kube_cluster.request(
            "PATCH", path, {"spec": {"containers": [{"name": "main", "image": "busybox:1"}]}}
        )
        time.sleep(0.5)
    assert code in (403, 422), code
    pod = kube_cluster.request("GET", path)
    assert pod["spec"]["containers"][0]["image"] == "busybox:1"
    label = {"metadata": {"labels": {SOFT: "true"}, "annotations": {SOFT: "preempted by x"}}}
    assert _patch(kube_cluster, path, label, merge) == 200
    assert _patch(kube_cluster, path, {"metadata": {"labels": {"app": "y"}}}, merge) in (403, 422)
    assert _patch(kube_cluster, path, {"metadata": {"annotations": {"other": "1"}}}, merge) in (403, 422)
    assert _patch(kube_cluster, path, {"metadata": {"finalizers": ["x/y"]}}, merge) in (403, 422)
    condition = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                 "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    assert _patch(kube_cluster, path + "/status", {"status": {"conditions": [condition]}}, strategic) == 200
    assert _patch(kube_cluster, path + "/status", {"status": {"nominatedNodeName": "node-1"}}, merge) == 200
    ready = {**condition, "type": "Ready"}
    assert _patch(kube_cluster, path + "/status", {"status": {"conditions": [ready]}}, strategic) in (
        403,
        422,
    )
    assert _patch(kube_cluster, path + "/status", {"status": {"phase": "Failed"}}, merge) in (403, 422)
    pod = kube_cluster.request("GET", path)
    assert pod["metadata"]["labels"] == {"app": "x", SOFT: "true"}
    assert {c["type"] for c in pod["status"]["conditions"]} == {"DisruptionTarget"}
    # The admin (anyone but the actuator) is not limited.
    kube_cluster.request("PATCH", path, {"metadata": {"labels": {"app": "z"}}})


# ---- 5. nested topic prefixes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "others", "nested"),
    [
        ("preemption.staging.", [], "preemption."),
        ("", [], "preemption."),
        ("pre", [], "preemption."),
        ("team-a.", ["team-a.preemption."], "team-a.preemption."),
        ("team-a.preemption.x.", ["team-b.", "team-a.preemption."], "team-a.preemption."),
    ],
)
def test_nested_topic_prefixes_are_refused(prefix: str, others: list[str], nested: str) -> None:
    stderr = _refused(values(topics={**values()["topics"], "prefix": prefix, "otherInstallPrefixes": others}))
    assert f'topics.prefix "{prefix}" nests with "{nested}"' in stderr


def test_disjoint_prefixes_render_and_a_shared_one_is_refused() -> None:
    topics = {
        **values()["topics"],
        "prefix": "team-a.preemption.",
        "otherInstallPrefixes": ["team-b.preemption.", "preemption."],
    }
    assert manifests(values(topics=topics))
    assert manifests(values())  # the default is not nested with itself
    same = {**topics, "otherInstallPrefixes": ["team-a.preemption."]}
    assert "is also another install's" in _refused(values(topics=same))
