"""The chart's worker: a StatefulSet whose pods keep their store on a PVC, exactly_once, its own timeouts.

Rendered by the real `helm template` (tests/k8s/helm.py), and the rendered
arguments are parsed by the real command line.
"""

from __future__ import annotations

from typing import Any

from tests.k8s.helm import by_kind, cli, container, manifests, public_pem, values


def _worker(chart_values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = manifests(chart_values)
    return by_kind(docs, "StatefulSet")["pc-worker"], by_kind(docs, "Service")["pc-worker"]


def test_the_worker_keeps_its_store_on_a_volume_claim() -> None:
    worker, service = _worker(values())
    spec = worker["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in claim["spec"]
    pod = spec["template"]["spec"]
    assert not any(v.get("name") == "state" for v in pod.get("volumes", []))  # no emptyDir any more
    main = container(worker)
    assert {"name": "state", "mountPath": "/var/lib/preemptctl"} in main["volumeMounts"]
    args = cli().parse_args(main["args"])
    assert args.store_dir.startswith("/var/lib/preemptctl/")
    assert args.processing_guarantee == "exactly_once"
    assert args.session_timeout == 10.0
    assert spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert spec["podManagementPolicy"] == "Parallel"


def test_worker_values_reach_the_statefulset() -> None:
    worker, _ = _worker(
        values(
            worker__processingGuarantee="at_least_once",
            worker__sessionTimeoutSeconds=30,
            worker__persistence={"size": "50Gi", "storageClassName": "fast-ssd"},
            signing={
                "enabled": True,
                "mode": "ed25519",
                "existingSecret": "k",
                "keyIds": ["k1", "k2"],
                "activeKeyId": "k2",
                "publicKeys": {"k1": public_pem(1), "k2": public_pem(2)},
                "installId": "",
            },
        )
    )
    (claim,) = worker["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    args = cli().parse_args(container(worker)["args"])
    assert (args.processing_guarantee, args.session_timeout) == ("at_least_once", 30.0)
    # The worker signs with the active key only: its file is the one key of the Secret it mounts.
    assert (args.hmac_key_file, args.hmac_key_id) == ("/etc/preemptctl/signing/k2", "k2")
    (signing,) = [v for v in worker["spec"]["template"]["spec"]["volumes"] if v["name"] == "signing"]
    assert signing["secret"]["secretName"] == "k"
    assert [i["key"] for i in signing["secret"]["items"]] == ["k2"]
