"""An in-memory Kubernetes API server on kmock, for the source and actuator tests.

kmock serves HTTP to the real kubernetes-asyncio client and routes each request
through its DSL (`handler[resource] << callback`). This class is the callback:
it keeps objects and their history and adds what kmock's emulator leaves out
(docs/architecture.md §6): uid and resourceVersion on every object; watches that start at a
resourceVersion (kubernetes-asyncio's `watch=True` included), server
timeouts; label selectors; pagination; the
eviction subresource; PUT; JSON patches (test, add, replace, remove); uid and
resourceVersion preconditions; dryRun=All.

Scenario helpers (`fail`, `evictions_answer`) make the faults of docs/architecture.md §4 happen
on demand. What a real API server does on demand (bookmarks, 410 after a
compaction, PDB answers, uid races, dry run, Leases) is tested against one
(tests/k8s/test_real_api.py), not here.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kmock
from kmock._internal import parsing as kmock_parsing

_KMOCK_PARSE_PATH = kmock_parsing.parse_path


def _parse_path(path: str) -> kmock_parsing.ParsedPath:
    """kmock 0.8 takes `/api/v1/namespaces[/NAME]` for a namespace prefix with no resource after
    it, and fails every request there (500): the Namespace kind's own URLs are parsed here."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        name = parts[3] if len(parts) == 4 else None
        return kmock_parsing.ParsedPath("", "v1", "namespaces", None, name, None)
    return _KMOCK_PARSE_PATH(path)


kmock_parsing.parse_path = _parse_path

# The DisruptionBudget cause of an injected eviction 429 (kube-apiserver's wording).
PDB_CAUSE = "The disruption budget web needs 1 healthy pods and has 1 currently"
# How long a watch request may stay open when the client sets no timeoutSeconds.
DEFAULT_WATCH_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS = {
    k.plural: k
    for k in (
        Kind("", "v1", "pods", "Pod", True),
        Kind("", "v1", "nodes", "Node", False),
        Kind("", "v1", "namespaces", "Namespace", False),
        Kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False),
        Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
        Kind("scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "ElasticQuota", True),
        Kind("events.k8s.io", "v1", "events", "Event", True),
        Kind("coordination.k8s.io", "v1", "leases", "Lease", True),
    )
}
ELASTIC_QUOTAS = "elasticquotas"

ObjKey = tuple[str, str | None, str]  # plural, namespace, name


@dataclass(frozen=True)
class Call:
    """One request that reached the fake (reads and writes), for assertions."""

    method: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None
    params: dict[str, str]
    body: Any


@dataclass
class _Watch:
    plural: str
    namespace: str | None
    selector: str | None
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


def _status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details or {})


def matches_selector(labels: dict[str, str], selector: str | None) -> bool:
    """Equality- and existence-based label selectors: `a=b,c!=d,e,!f`."""
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """Strategic merge, as far as the tests need: maps merge, conditions merge by type, null deletes."""
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif key == "conditions" and isinstance(value, list) and isinstance(into.get(key), list):
            by_type = {c.get("type"): c for c in into[key]}
            for condition in value:
                by_type[condition.get("type")] = {**by_type.get(condition.get("type"), {}), **condition}
            into[key] = list(by_type.values())
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


_MISSING = object()


def _json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSON patch (RFC 6902) as kube-apiserver applies it, as far as the tests need: test, add,
    replace, remove on object members. A `test` of null passes on a missing member (the
    server's json-patch library does so). Any failure is the server's 422, and nothing is applied."""
    out = copy.deepcopy(obj)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise _status(422, "Invalid", "the server rejected our request due to an error in our request")
        kind, held = op["op"], node.get(last, _MISSING)
        if kind == "test" and (None if held is _MISSING else held) != op.get("value"):
            raise _status(422, "Invalid", "the server rejected our request due to an error in our request")
        if kind in ("add", "replace"):
            node[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            node.pop(last, None)
    return out


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class FakeApi:
    """Objects, their history and the HTTP behaviour of the API server, behind a kmock handler."""

    def __init__(self, handler: kmock.KubernetesScaffold, *, elastic_quotas: bool = True) -> None:
        self.handler = handler
        self.objects: dict[ObjKey, dict[str, Any]] = {}
        self.rv = 1000
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.calls: list[Call] = []
        self.graceful_delete = True  # pods with a grace period go terminating first, as on a real node
        # True: every watch ends right after its backlog, as behind a proxy that cuts streams.
        self.short_watches = False
        # Awaited on every request once it is recorded, before it is served: a test delays
        # requests (to reorder concurrent ones) or changes objects between two of them.
        self.before: Callable[[Call], Awaitable[None]] | None = None
        self._watches: list[_Watch] = []
        self._failures: list[tuple[str, str, str | None, int]] = []
        self._eviction_answers: dict[tuple[str, str], list[int]] = {}
        for kind in KINDS.values():
            if kind.plural != ELASTIC_QUOTAS or elastic_quotas:
                self.serve(kind.plural)
        # Without a reaction for a kind (the ElasticQuota CRD not installed yet),
        # kmock's discovery and the kind's URLs answer 404.

    def serve(self, plural: str) -> None:
        """Serve a kind (install a CRD): discovery lists it from now on."""
        kind = KINDS[plural]
        self.handler[kmock.resource(kind.group, kind.version, kind.plural)] << self._serve

    # ---- scenario helpers ------------------------------------------------------------

    def create(self, plural: str, obj: dict[str, Any], *, notify: bool = True) -> dict[str, Any]:
        kind = KINDS[plural]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        if not kind.namespaced:
            meta.pop("namespace", None)
        key = (plural, meta.get("namespace"), meta["name"])
        if key in self.objects:
            raise _status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
        self.objects[key] = obj
        self._record(plural, "ADDED", obj)
        return copy.deepcopy(obj)

    def modify(self, plural: str, namespace: str | None, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects[(plural, namespace, name)]
        _merge(obj, copy.deepcopy(patch))
        self._record(plural, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def remove(self, plural: str, namespace: str | None, name: str) -> None:
        """Delete at once (no grace period), with a DELETED event."""
        obj = self.objects.pop((plural, namespace, name))
        self._record(plural, "DELETED", obj)

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def fail(
        self, method: str, plural: str, status: int, *, times: int = 1, subresource: str | None = None
    ) -> None:
        """The next `times` matching requests answer `status`."""
        self._failures += [(method.upper(), plural, subresource, status)] * times

    def evictions_answer(self, namespace: str, name: str, statuses: list[int]) -> None:
        """The next evictions of this pod answer these statuses in turn (then the real behaviour)."""
        self._eviction_answers[(namespace, name)] = list(statuses)

    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.method != "GET"]

    def open_watches(self, plural: str | None = None) -> int:
        return sum(1 for w in self._watches if plural is None or w.plural == plural)

    # ---- history ---------------------------------------------------------------------

    def _record(self, plural: str, event_type: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        event = {"type": event_type, "object": self._full(plural, obj)}
        self.history.append((self.rv, plural, event))
        for watch in self._watches:
            if watch.plural == plural:
                watch.queue.put_nowait(event)

    @staticmethod
    def _full(plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """What a watch event carries: the object with its kind and apiVersion."""
        kind = KINDS[plural]
        return {"apiVersion": kind.api_version, "kind": kind.kind, **copy.deepcopy(obj)}

    @staticmethod
    def _visible(watch: _Watch, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if watch.namespace is not None and meta.get("namespace") != watch.namespace:
            return False
        return matches_selector(meta.get("labels") or {}, watch.selector)

    # ---- HTTP ------------------------------------------------------------------------

    async def _serve(self, request: kmock.Request) -> Any:
        assert request.resource is not None and request.resource.plural is not None
        plural = str(request.resource.plural)
        method = str(request.method.value).upper()
        params = dict(request.params)
        name, sub = request.name, request.subresource
        call = Call(method, plural, request.namespace, name, sub, params, request.data)
        self.calls.append(call)
        if self.before is not None:
            await self.before(call)
        for i, (f_method, f_plural, f_sub, f_status) in enumerate(self._failures):
            if (f_method, f_plural, f_sub) == (method, plural, request.subresource):
                del self._failures[i]
                raise _status(f_status, "InjectedFailure", f"injected {f_status}")
        dry = params.get("dryRun") == "All"
        if method == "GET" and request.name is None:
            if str(params.get("watch", "")).lower() in ("true", "1"):
                return self._watch(plural, request.namespace, params)
            return self._list(plural, request.namespace, params)
        if method == "GET":
            return self._fetch(plural, request.namespace, request.name)
        if method == "POST" and request.subresource == "eviction":
            return self._evict(request.namespace, str(request.name), request.data or {}, dry=dry)
        if method == "POST":
            return self._create(plural, request.namespace, request.data or {}, dry=dry)
        if method == "PATCH":
            return self._patch(plural, request.namespace, str(request.name), request.data or {}, dry=dry)
        if method == "PUT":
            return self._replace(plural, request.namespace, str(request.name), request.data or {}, dry=dry)
        if method == "DELETE":
            return self._delete(plural, request.namespace, str(request.name), request.data or {}, dry=dry)
        raise _status(405, "MethodNotAllowed", f"{method} {plural}")

    def _held(self, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            raise _status(404, "NotFound", f'{plural} "{name}" not found')
        return obj

    def _fetch(self, plural: str, namespace: str | None, name: str | None) -> dict[str, Any]:
        return self._full(plural, self._held(plural, namespace, str(name)))

    def _list(self, plural: str, namespace: str | None, params: dict[str, str]) -> dict[str, Any]:
        kind = KINDS[plural]
        selector = params.get("labelSelector")
        items = [
            obj
            for (p, ns, _), obj in sorted(self.objects.items(), key=lambda kv: (kv[0][1] or "", kv[0][2]))
            if p == plural
            and (namespace is None or ns == namespace)
            and matches_selector(obj["metadata"].get("labels") or {}, selector)
        ]
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 0) or len(items)
        page = copy.deepcopy(items[start : start + limit])  # no kind/apiVersion, as on a real server
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version, "metadata": meta, "items": page}

    async def _watch(self, plural: str, namespace: str | None, params: dict[str, str]) -> AsyncIterator[Any]:
        watch = _Watch(plural, namespace, params.get("labelSelector"))
        since = int(params.get("resourceVersion") or 0)
        timeout = float(params.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        # Registered before the history is read, in the same step: no event falls in between.
        self._watches.append(watch)
        if since:
            backlog = [e for rv, p, e in self.history if p == plural and rv > since]
        else:
            backlog = [
                {"type": "ADDED", "object": self._full(plural, o)}
                for (p, _, _), o in self.objects.items()
                if p == plural
            ]
        return self._stream(watch, backlog, timeout)

    async def _stream(
        self, watch: _Watch, backlog: list[dict[str, Any]], timeout: float
    ) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            yield b""  # sends the headers now: an idle watch is still a started response
            for event in itertools.chain(backlog, self._drain(watch)):
                if self._visible(watch, event["object"]):
                    yield event
            while not self.short_watches:
                try:
                    event = await asyncio.wait_for(watch.queue.get(), max(deadline - loop.time(), 0))
                except TimeoutError:
                    return  # timeoutSeconds reached: the server ends the watch
                if self._visible(watch, event["object"]):
                    yield event
        finally:
            self._watches.remove(watch)

    @staticmethod
    def _drain(watch: _Watch) -> list[dict[str, Any]]:
        out = []
        while not watch.queue.empty():
            out.append(watch.queue.get_nowait())
        return out

    def _create(
        self, plural: str, namespace: str | None, body: dict[str, Any], *, dry: bool
    ) -> dict[str, Any]:
        body = copy.deepcopy(body)
        body.setdefault("metadata", {})["namespace"] = namespace
        if dry:
            name = body["metadata"].get("name")
            if (plural, namespace, name) in self.objects:
                raise _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
            return body
        return self._full(plural, self.create(plural, body))

    def _check_uid(self, obj: dict[str, Any], uid: str | None) -> None:
        held = obj["metadata"].get("uid")
        if uid and uid != held:
            raise _status(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {held}",
            )

    def _patch(
        self, plural: str, namespace: str | None, name: str, body: Any, *, dry: bool
    ) -> dict[str, Any]:
        obj = self._held(plural, namespace, name)
        if isinstance(body, list):  # application/json-patch+json
            patched = _json_patch(obj, body)
            if dry:
                return self._full(plural, patched)
            self.objects[(plural, namespace, name)] = patched
            self._record(plural, "MODIFIED", patched)
            return self._full(plural, patched)
        self._check_uid(obj, (body.get("metadata") or {}).get("uid"))
        if dry:
            preview = copy.deepcopy(obj)
            _merge(preview, body)
            return self._full(plural, preview)
        return self._full(plural, self.modify(plural, namespace, name, body))

    def _replace(
        self, plural: str, namespace: str | None, name: str, body: dict[str, Any], *, dry: bool
    ) -> dict[str, Any]:
        obj = self._held(plural, namespace, name)
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != obj["metadata"]["resourceVersion"]:
            raise _status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version",
            )
        if dry:
            return self._full(plural, body)
        replacement = copy.deepcopy(body)
        replacement["metadata"] = {
            **obj["metadata"],
            **{k: v for k, v in body["metadata"].items() if k == "labels"},
        }
        replacement.pop("kind", None)
        replacement.pop("apiVersion", None)
        self.objects[(plural, namespace, name)] = replacement
        self._record(plural, "MODIFIED", replacement)
        return self._full(plural, replacement)

    def _delete(
        self, plural: str, namespace: str | None, name: str, options: dict[str, Any], *, dry: bool
    ) -> dict[str, Any]:
        obj = self._held(plural, namespace, name)
        self._check_uid(obj, (options.get("preconditions") or {}).get("uid"))
        if dry:
            return self._full(plural, obj)
        return self._terminate(plural, namespace, name, options.get("gracePeriodSeconds"))

    def _terminate(self, plural: str, namespace: str | None, name: str, grace: int | None) -> dict[str, Any]:
        obj = self.objects[(plural, namespace, name)]
        if grace is None:
            grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        if plural == "pods" and self.graceful_delete and grace:
            # The kubelet has the pod for its grace period: it is terminating, not gone.
            if not obj["metadata"].get("deletionTimestamp"):
                return self._full(
                    plural,
                    self.modify(
                        plural,
                        namespace,
                        name,
                        {"metadata": {"deletionTimestamp": _now(), "deletionGracePeriodSeconds": grace}},
                    ),
                )
            return self._full(plural, obj)
        self.remove(plural, namespace, name)
        return self._full(plural, obj)

    def _evict(self, namespace: str | None, name: str, body: dict[str, Any], *, dry: bool) -> dict[str, Any]:
        obj = self._held("pods", namespace, name)
        answers = self._eviction_answers.get((str(namespace), name))
        if answers:
            status = answers.pop(0)
            if status == 429:  # as kube-apiserver says it: the PDB's reason is in details.causes
                raise _status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {"causes": [{"reason": "DisruptionBudget", "message": PDB_CAUSE}]},
                )
            if status != 200:
                raise _status(status, "InjectedFailure", f"injected {status}")
        options = body.get("deleteOptions") or {}
        self._check_uid(obj, (options.get("preconditions") or {}).get("uid"))
        if not dry:
            self._terminate("pods", namespace, name, options.get("gracePeriodSeconds"))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
