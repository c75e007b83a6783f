"""Label selectors (PDBs, ElasticQuota membership) and node selector terms (affinity)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidObject

_LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_NODE_OPERATORS = (*_LABEL_OPERATORS, "Gt", "Lt")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        if op == "In":
            return self.key in labels and labels[self.key] in self.values
        if op == "NotIn":
            # Kubernetes: NotIn matches when the label is absent too.
            return self.key not in labels or labels[self.key] not in self.values
        # Gt / Lt: both sides must parse as integers, else no match (as upstream).
        if self.key not in labels or len(self.values) != 1:
            return False
        try:
            have, want = int(labels[self.key]), int(self.values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want


def _requirements(raw: Any, *, operators: tuple[str, ...], where: str) -> tuple[Requirement, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidObject(f"{where}: expected a list")
    out = []
    for item in raw:
        if not isinstance(item, dict) or "key" not in item or "operator" not in item:
            raise InvalidObject(f"{where}: each requirement needs key and operator")
        op = item["operator"]
        if op not in operators:
            raise InvalidObject(f"{where}: unknown operator {op!r}")
        values = tuple(str(v) for v in (item.get("values") or ()))
        out.append(Requirement(str(item["key"]), op, values))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: tuple[tuple[str, str], ...]
    expressions: tuple[Requirement, ...]

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.expressions
        )

    def narrowing(self) -> tuple[str, tuple[str, ...]] | None:
        """A label every matching set carries with one of a few values: the first matchLabels
        pair, else the first `In` requirement; None when the selector has neither (then any
        label set may match). An index of pods by that label finds every pod that can match."""
        if self.match_labels:
            key, value = self.match_labels[0]
            return key, (value,)
        for r in self.expressions:
            if r.operator == "In":
                return r.key, r.values
        return None

    @staticmethod
    def parse(raw: Any, *, where: str) -> LabelSelector | None:
        """None for a missing selector; Kubernetes distinguishes nil from empty."""
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise InvalidObject(f"{where}: selector must be a mapping")
        labels = raw.get("matchLabels") or {}
        if not isinstance(labels, dict):
            raise InvalidObject(f"{where}: matchLabels must be a mapping")
        return LabelSelector(
            tuple(sorted((str(k), str(v)) for k, v in labels.items())),
            _requirements(raw.get("matchExpressions"), operators=_LABEL_OPERATORS, where=where),
        )


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        # An empty term selects no node (upstream nodeaffinity semantics).
        if not self.expressions and not self.fields:
            return False
        fields = {"metadata.name": name}
        return all(r.matches(labels) for r in self.expressions) and all(
            r.matches(fields) for r in self.fields
        )


def parse_required_affinity(spec: Mapping[str, Any], *, where: str) -> tuple[NodeSelectorTerm, ...] | None:
    """The required node affinity terms (ORed), or None when the pod has none."""
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {} if isinstance(affinity, dict) else {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return None
    terms = required.get("nodeSelectorTerms") or []
    out = []
    for term in terms:
        out.append(
            NodeSelectorTerm(
                _requirements(term.get("matchExpressions"), operators=_NODE_OPERATORS, where=where),
                _requirements(term.get("matchFields"), operators=_NODE_OPERATORS, where=where),
            )
        )
    return tuple(out)
