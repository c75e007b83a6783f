"""Engine settings (docs/case-format.md "Config keys"), validated, with a stable hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.errors import InvalidConfig

VICTIM_SELECTIONS = ("kubernetes", "minimal")
STRATEGIES = ("single", "multiple")


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    disable_default_preemptible: bool = False
    disable_default_trigger_preemption: bool = False
    pod_should_be_deleted_when_preempted: bool = False


@dataclass(frozen=True, slots=True)
class DaemonSetConfig:
    preemption_start_delay_seconds: int = 0
    victim_selection_strategy: tuple[str, ...] = ("multiple",)
    single_victim_deviation_percent: int = 10
    max_victims: int = 5


@dataclass(frozen=True, slots=True)
class Config:
    victim_selection: str = "kubernetes"
    # How victims of the default and DaemonSet flows are removed: delete (what
    # kube-scheduler does) or evict (policy/v1 Eviction, honours PDBs at the API).
    victim_action: str = "delete"
    quota: QuotaConfig = field(default_factory=QuotaConfig)
    daemonset: DaemonSetConfig = field(default_factory=DaemonSetConfig)

    def hash(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _bool(raw: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise InvalidConfig(f"{where}.{key} must be true or false, got {value!r}")
    return value


def _int(raw: Mapping[str, Any], key: str, default: int, where: str, *, minimum: int = 0) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidConfig(f"{where}.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _known(raw: Mapping[str, Any], keys: set[str], where: str) -> None:
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise InvalidConfig(f"unknown config key {where}.{unknown[0]}")


def parse(raw: Any) -> Config:
    if raw is None:
        return Config()
    if not isinstance(raw, dict):
        raise InvalidConfig("config must be a mapping")
    _known(raw, {"victimSelection", "victimAction", "quota", "daemonset"}, "config")
    selection = raw.get("victimSelection", "kubernetes")
    if selection not in VICTIM_SELECTIONS:
        raise InvalidConfig(f"config.victimSelection must be one of {', '.join(VICTIM_SELECTIONS)}")
    action = raw.get("victimAction", "delete")
    if action not in ("delete", "evict"):
        raise InvalidConfig("config.victimAction must be delete or evict")
    q = raw.get("quota") or {}
    if not isinstance(q, dict):
        raise InvalidConfig("config.quota must be a mapping")
    _known(
        q,
        {
            "disableDefaultPreemptible",
            "disableDefaultPreemptiable",
            "disableDefaultTriggerPreemption",
            "podShouldBeDeletedWhenPreempted",
        },
        "config.quota",
    )
    # The seed design spells it "Preemptiable"; both spellings mean the same switch.
    preemptible_key = (
        "disableDefaultPreemptible" if "disableDefaultPreemptible" in q else "disableDefaultPreemptiable"
    )
    quota = QuotaConfig(
        _bool(q, preemptible_key, False, "config.quota"),
        _bool(q, "disableDefaultTriggerPreemption", False, "config.quota"),
        _bool(q, "podShouldBeDeletedWhenPreempted", False, "config.quota"),
    )
    d = raw.get("daemonset") or {}
    if not isinstance(d, dict):
        raise InvalidConfig("config.daemonset must be a mapping")
    _known(
        d,
        {
            "preemptionStartDelaySeconds",
            "victimSelectionStrategy",
            "singleVictimDeviationPercent",
            "maxVictims",
        },
        "config.daemonset",
    )
    strategies = d.get("victimSelectionStrategy", ["multiple"])
    if isinstance(strategies, str):
        strategies = [strategies]
    if not isinstance(strategies, list) or not strategies or any(s not in STRATEGIES for s in strategies):
        raise InvalidConfig("config.daemonset.victimSelectionStrategy must be a list of single | multiple")
    daemonset = DaemonSetConfig(
        _int(d, "preemptionStartDelaySeconds", 0, "config.daemonset"),
        tuple(strategies),
        _int(d, "singleVictimDeviationPercent", 10, "config.daemonset"),
        _int(d, "maxVictims", 5, "config.daemonset", minimum=1),
    )
    return Config(selection, action, quota, daemonset)
