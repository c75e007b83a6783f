"""Kubernetes' name rules, shared by the fold's input check and the actuator's decision check.

Owns: which strings may be a namespace, an object name, a label value. The rules
are apimachinery's validation (`IsDNS1123Label`, `IsDNS1123Subdomain`,
`IsValidLabelValue`): an object the API server stored always passes them, so a
record that fails one was not written from a real watch event. Checking them at
the edges keeps such strings out of URLs (a victim named `..` made the HTTP
client request another path) and out of text logs (a newline forged a line).
"""

import re
from typing import Any

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63


def dns_label(value: Any) -> bool:
    """A namespace (and a Namespace's name): at most 63 of [a-z0-9-], alphanumeric at both ends."""
    return isinstance(value, str) and len(value) <= DNS_LABEL_MAX and _DNS_LABEL.match(value) is not None


def dns_subdomain(value: Any) -> bool:
    """A pod, node, PDB, PriorityClass or quota name: dot-separated DNS labels, at most 253."""
    return (
        isinstance(value, str) and len(value) <= DNS_SUBDOMAIN_MAX and _DNS_SUBDOMAIN.match(value) is not None
    )


def label_value(value: Any) -> bool:
    """A label value (a pod group's name): at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends."""
    return isinstance(value, str) and len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.match(value) is not None
