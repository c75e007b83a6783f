import pytest

from engine import objects
from engine.errors import InvalidObject
from engine.objects import BEST_EFFORT, BURSTABLE, GUARANTEED


def _pod(spec: dict, **meta: object) -> dict:
    return {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u", **meta}, "spec": spec}


def test_requests_sum_containers_max_init_plus_overhead() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"requests": {"cpu": "500m"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}],
        "overhead": {"cpu": "100m"},
    }
    p = objects.pod(_pod(spec))
    assert p.requests == {"cpu": 2100, "memory": 2**30, "pods": 1}


def test_sidecar_init_containers_add_to_the_running_pod() -> None:
    spec = {
        "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        "initContainers": [
            {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"resources": {"requests": {"cpu": "1"}}},
        ],
    }
    # running: 1 + 0.5 sidecar; init peak: 1 + 0.5 sidecar started before it
    assert objects.pod(_pod(spec)).requests["cpu"] == 1500


def test_every_pod_takes_a_pods_slot_even_best_effort() -> None:
    p = objects.pod(_pod({"containers": [{"name": "c"}]}))
    assert p.requests == {"pods": 1}
    assert p.qos == BEST_EFFORT


def test_qos_classes() -> None:
    g = {
        "containers": [
            {
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"cpu": "1", "memory": "1Gi"},
                }
            }
        ]
    }
    only_limits = {"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}
    b = {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}
    assert objects.pod(_pod(g)).qos == GUARANTEED
    assert objects.pod(_pod(only_limits)).qos == GUARANTEED  # requests default to limits
    assert objects.pod(_pod(b)).qos == BURSTABLE


def test_pod_states() -> None:
    raw = _pod({"nodeName": "n1", "containers": []}, deletionTimestamp="2026-01-01T00:00:00Z")
    raw["status"] = {
        "phase": "Running",
        "startTime": "2026-01-01T00:00:00Z",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    }
    p = objects.pod(raw)
    assert p.node == "n1" and p.deleting and p.disruption_target and p.preempted and not p.terminal
    raw["status"]["phase"] = "Succeeded"
    assert objects.pod(raw).terminal


def test_only_a_preemption_marks_a_pod_preempted() -> None:
    """kube-scheduler's podTerminatingByPreemption: DisruptionTarget=True with reason
    PreemptionByScheduler, read from the first such condition; a drain or an eviction by
    someone else (other reasons) is not a preemption under way."""
    raw = _pod({"nodeName": "n1", "containers": []}, deletionTimestamp="2026-01-01T00:00:00Z")
    for reason, want in (
        ("PreemptionByScheduler", True),
        ("EvictionByEvictionAPI", False),
        ("DeletionByTaintManager", False),
        ("TerminationByKubelet", False),
        (None, False),
    ):
        condition = {"type": "DisruptionTarget", "status": "True"}
        if reason is not None:
            condition["reason"] = reason
        raw["status"] = {"phase": "Running", "conditions": [condition]}
        assert objects.pod(raw).preempted is want, reason
        assert objects.pod(raw).disruption_target  # the DaemonSet flow waits on any reason
    raw["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "False", "reason": "PreemptionByScheduler"},
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"},
    ]
    assert not objects.pod(raw).preempted  # the first condition of the type is the one read


def test_unschedulable_condition_asks_for_preemption() -> None:
    raw = _pod({"containers": []})
    raw["status"] = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    p = objects.pod(raw)
    assert p.unschedulable and p.unschedulable_since is not None and p.scheduled_at is None


@pytest.mark.parametrize(
    "raw",
    [
        {"kind": "Pod", "metadata": {}},
        {"kind": "Pod"},
        {
            "kind": "Pod",
            "metadata": {"name": "x"},
            "spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]},
        },
        {"kind": "Service", "metadata": {"name": "x"}},
        {"kind": "PriorityClass", "metadata": {"name": "x"}},
        "not a mapping",
    ],
)
def test_invalid_objects_raise(raw: object) -> None:
    with pytest.raises(InvalidObject):
        objects.normalize(raw)


def test_node_without_pods_capacity_gets_kubelet_default() -> None:
    n = objects.node({"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "4"}}})
    assert n.allocatable == {"cpu": 4000, "pods": objects.DEFAULT_MAX_PODS}


@pytest.mark.parametrize(
    "obj",
    [
        _pod({"containers": [{"resources": {"requests": {"cpu": "-500m"}}}]}),
        _pod({"containers": [{"name": "c"}], "overhead": {"memory": "-1Gi"}}),
        {"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "-1"}}},
    ],
)
def test_negative_amounts_are_invalid_objects(obj: dict) -> None:
    """A negative request made a node's summary promise room that evicting could not free."""
    with pytest.raises(InvalidObject, match="negative"):
        objects.normalize(obj)
