"""Conformance cases (docs/case-format.md) turned into an engine question.

The caller reads and parses the file; this module validates the structure and
builds the cluster, the preemptor(s), the instant and the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine import cluster as cluster_mod
from engine import config as config_mod
from engine import objects, timeutil
from engine.cluster import Cluster
from engine.config import Config
from engine.decision import Decision
from engine.errors import EngineError, InvalidCase
from engine.flows import decide
from engine.index import Index
from engine.objects import Pod


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    now: int
    config: Config
    cluster: Cluster
    preemptors: tuple[Pod, ...]


def load(raw: Any, *, where: str) -> Case:
    if not isinstance(raw, dict):
        raise InvalidCase(f"{where}: a case must be a mapping")
    try:
        now = timeutil.parse(raw.get("now"), field="now") if raw.get("now") is not None else 0
        cfg = config_mod.parse(raw.get("config"))
        objs = raw.get("objects") or []
        if not isinstance(objs, list):
            raise InvalidCase("objects must be a list")
        records: list[objects.Record] = [objects.normalize(o) for o in objs]
        pre_raw = raw.get("preemptor")
        if isinstance(pre_raw, dict):
            pre_raw = [pre_raw]
        if not isinstance(pre_raw, list) or not pre_raw:
            raise InvalidCase("preemptor must be a Pod or a non-empty list of Pods")
        preemptors: list[Pod] = []
        for item in pre_raw:
            record = objects.normalize(item)
            if not isinstance(record, Pod):
                raise InvalidCase("preemptor entries must be Pods")
            preemptors.append(record)
    except EngineError as exc:
        raise InvalidCase(f"{where}: {exc}") from exc
    ids = [p.uid for p in preemptors]
    kept: list[objects.Record] = [r for r in records if not (isinstance(r, Pod) and r.uid in ids)]
    cluster = cluster_mod.build([*kept, *preemptors])
    # The cluster resolves priorities from classes; decide on the resolved records.
    resolved = tuple(cluster.pods[p.uid] for p in preemptors)
    return Case(str(raw.get("name") or where), now, cfg, cluster, resolved)


def answer(case: Case, *, index: Index | None = None) -> Decision:
    return decide(case.cluster, case.preemptors, now=case.now, config=case.config, index=index)
