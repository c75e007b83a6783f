"""The Kubernetes API connection shared by the source and the actuator.

This module owns:
- `connect`, the one way an ApiClient is built (a kubeconfig file, else the
  in-cluster service account, else the default kubeconfig), and `TimedApiClient`,
  which gives every call made through it a connect and a read timeout, gives every
  write the server's deadline (`?timeout=`), and runs the caller's `checked_when_sent`
  check (the Lease's margin) as the request's bytes are about to leave;
- `raw_request`, a request whose answer is the raw aiohttp response, for the
  source's list and watch streams (raw JSON, no model round trip);
- `json_request`, one request whose answer is its JSON as plain dicts, for the
  actuator's reads and writes (no model round trip either);
- `ApiError` and `status_of`, one reading of "what did the API answer";
- `micro_time`, the one format times are sent to the server in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

__all__ = [
    "ApiError",
    "TimedApiClient",
    "checked_when_sent",
    "connect",
    "environment_proxy",
    "for_host",
    "json_request",
    "micro_time",
    "raw_request",
    "status_of",
]

# Set by the kubelet in every pod: its presence means "running inside a cluster".
_IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
# The generated client's name for bearer-token auth (kubeconfig token, service account).
_AUTH_SETTINGS = ["BearerToken"]
# A successful answer's body, whatever the status, parsed as plain JSON by the client
# ("object" is its name for "no model"): a V1Pod model costs ~1.5 ms of CPU per answer on
# a loaded 2-core machine, several per decision on a preemptor's critical path.
_PLAIN_JSON = {code: "object" for code in (200, 201, 202)}
# The patch types the actuator sends (Content-Type).
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

# A TCP connect to the API server that takes longer than this is a network fault,
# not a slow server; without the bound a dead endpoint hangs a request forever.
CONNECT_TIMEOUT_S = 5.0
# One read or one list page, answer included. kubernetes-asyncio sends a request with
# no timeout at all unless it is given one (aiohttp.ClientTimeout() is unbounded), so
# a half-open connection would hang the call forever; 30 s is room for a 500-object
# page of a big cluster, and half the API server's own 60 s request timeout.
REQUEST_TIMEOUT_S = 30.0
# One write (eviction, delete, patch, Event, Lease renewal). The API server answers a
# write in milliseconds; one still unanswered after this is abandoned, so it cannot
# land long after it was started. Lease fencing counts on this bound: a write starts
# only while the Lease has more than this much validity left (streams.kube.lease), and
# the server is told the same deadline (see TimedApiClient).
WRITE_TIMEOUT_S = 5.0
# HTTP methods that change something: each is sent with the server-side deadline.
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# kubernetes-asyncio's read buffer (a watch event may carry an object at etcd's 1.5 MiB limit).
_READ_BUFFER_BYTES = 2**21


class ApiError(Exception):
    """A non-2xx answer (or an ERROR watch event) from the API server."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}".strip(": "))
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_status(cls, status: Any, *, default: int = 500) -> ApiError:
        """From a metav1.Status dict (a watch ERROR event's object or an error body)."""
        if not isinstance(status, dict):
            return cls(default, "Unknown", repr(status)[:200])
        code = status.get("code")
        return cls(
            code if isinstance(code, int) else default,
            str(status.get("reason") or ""),
            str(status.get("message") or ""),
        )


def timeout(total_s: float = REQUEST_TIMEOUT_S) -> aiohttp.ClientTimeout:
    """A connect and a read bound for one call (never unbounded, see REQUEST_TIMEOUT_S)."""
    return aiohttp.ClientTimeout(total=total_s, sock_connect=min(CONNECT_TIMEOUT_S, total_s))


def write_timeout() -> aiohttp.ClientTimeout:
    return timeout(WRITE_TIMEOUT_S)


# The check a write must pass at the moment its bytes leave the process (the actuator's Lease
# margin, streams.kube.lease), for the request made while it is set (`checked_when_sent`).
_SENDING_CHECK: ContextVar[Callable[[], None] | None] = ContextVar("sending_check", default=None)


@contextmanager
def checked_when_sent(check: Callable[[], None]) -> Iterator[None]:
    """Run `check` again immediately before each request made in this block is written to its
    connection; whatever it raises is what the request raises, and nothing is sent.

    A check made before the call is not enough: between it and the request's bytes leaving,
    aiohttp waits for a pooled connection, opens one (TCP and TLS: several round trips) and
    writes the body from a task of its own, each an await on a busy event loop. A process
    frozen there (SIGSTOP, a paused VM) sent its write when it woke, long past the check, and
    the API server, counting `?timeout=` from when it receives a request, let it land."""
    token = _SENDING_CHECK.set(check)
    try:
        yield
    finally:
        _SENDING_CHECK.reset(token)


class _CheckedRequest(aiohttp.ClientRequest):
    """A request that runs the `checked_when_sent` check when it is sent: in `send` (on the
    connection it got) and again, for a request with a body, in the task that writes the
    headers and the body together, right before the first byte is written."""

    async def send(self, conn: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        check = _SENDING_CHECK.get()
        if check is not None:
            check()  # raised as itself: the request was never sent (aiohttp closes the connection)
        return await super().send(conn)

    async def write_bytes(
        self,
        writer: aiohttp.abc.AbstractStreamWriter,
        conn: aiohttp.connector.Connection,
        content_length: int | None = None,
    ) -> None:
        check = _SENDING_CHECK.get()
        if check is not None:
            try:
                check()
            except Exception as exc:
                # Headers are buffered until the body is written: nothing has left. The
                # response the caller awaits fails with the check's own exception.
                if conn.protocol is not None:
                    conn.protocol.set_exception(exc)
                conn.close()
                return
        await super().write_bytes(writer, conn, content_length)


class TimedApiClient(client.ApiClient):
    """An ApiClient whose every request has a timeout: REQUEST_TIMEOUT_S unless the call names one.

    Every generated method (read_namespaced_pod, create_namespaced_pod_eviction, ...)
    passes through `request`, so this one override covers every call the edge makes.

    A write also carries its timeout to the server as `?timeout=`: kube-apiserver then
    abandons the request that long after receiving it (a 504; admission webhooks and
    storage see the same deadline) instead of after its own --request-timeout (60 s).
    The client's timeout alone does not bound when a write lands: a process frozen
    (SIGSTOP, a paused VM or container) while its write waits in the server (a slow
    admission webhook, priority-and-fairness queues, a slow etcd) cannot give up or
    close the connection, and without the server's deadline the write would land when
    the server gets to it, after the Lease has passed to another process.

    Its aiohttp session does not trust the environment per request: with trust_env, aiohttp
    looks ~/.netrc up in a thread pool on every request (the API server's auth is the
    kubeconfig's, never netrc), a thread hop per call that cost 1.3 ms of 1.8 for five
    concurrent requests on a quiet machine and more under load, on a preemptor's critical
    path. The environment's proxy (HTTPS_PROXY, NO_PROXY), the one thing trust_env gave the
    API connection, is read once here instead, unless the kubeconfig names a proxy.

    Its requests are `_CheckedRequest`s: a write made under `checked_when_sent` is checked
    again as it is sent.
    """

    def __init__(self, configuration: client.Configuration | None = None) -> None:
        super().__init__(configuration)
        rest = self.rest_client
        trusting = rest.pool_manager
        rest.pool_manager = aiohttp.ClientSession(
            connector=trusting.connector,
            trust_env=False,
            read_bufsize=_READ_BUFFER_BYTES,
            request_class=_CheckedRequest,
        )
        trusting.detach()  # the connector (its TLS context, its pool) now belongs to the new session
        proxy = None if rest.proxy else environment_proxy(self.configuration.host or "")
        if proxy:
            rest.proxy = proxy

    def request(
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        bound = _request_timeout or timeout()
        if method in _WRITE_METHODS and isinstance(bound, aiohttp.ClientTimeout) and bound.total:
            query_params = [*(query_params or ()), ("timeout", f"{bound.total:g}s")]
        return super().request(
            method,
            url,
            query_params=query_params,
            headers=headers,
            post_params=post_params,
            body=body,
            _preload_content=_preload_content,
            _request_timeout=bound,
        )


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTPS_PROXY/HTTP_PROXY, unless NO_PROXY covers
    its host), as aiohttp's trust_env would find it; None for none."""
    parts = urlsplit(url)
    if not parts.hostname or proxy_bypass(parts.hostname):
        return None
    return getproxies().get(parts.scheme or "https")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an API failure, or None when there was no answer (network, timeout)."""
    if isinstance(exc, ApiError):
        return exc.status
    if isinstance(exc, ApiException):
        return int(exc.status) if exc.status else None
    return None


def reason_of(exc: BaseException) -> str:
    """The short reason Kubernetes gave (e.g. TooManyRequests), else the exception's class."""
    if isinstance(exc, ApiError):
        return exc.reason or str(exc.status)
    if isinstance(exc, ApiException):
        return str(exc.reason or exc.status)
    return type(exc).__name__


async def connect(kubeconfig: str | None = None, *, context: str | None = None) -> client.ApiClient:
    """An ApiClient for `kubeconfig`, else in-cluster config, else ~/.kube/config (or $KUBECONFIG)."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get(_IN_CLUSTER_ENV):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        await config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    return TimedApiClient(configuration)


def for_host(host: str) -> client.ApiClient:
    """An unauthenticated ApiClient for `host` (a test server such as kmock)."""
    configuration = client.Configuration()
    configuration.host = host.rstrip("/")
    return TimedApiClient(configuration)


async def raw_request(
    api: client.ApiClient,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    timeout: aiohttp.ClientTimeout | None = None,
) -> aiohttp.ClientResponse:
    """GET `path` and return the unread response; the caller checks the status and releases it.

    With `_preload_content=False` the client neither raises on errors nor parses
    the body, so lists and watches reach us as the API server's own JSON bytes.
    """
    response: aiohttp.ClientResponse = await api.call_api(
        path,
        "GET",
        query_params=list(query),
        header_params={"Accept": "application/json"},
        auth_settings=_AUTH_SETTINGS,
        _preload_content=False,
        _request_timeout=timeout,  # TimedApiClient's REQUEST_TIMEOUT_S when None
    )
    return response


async def json_request(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    body: Any = None,
    query: Sequence[tuple[str, str]] = (),
    content_type: str = "application/json",
    timeout: aiohttp.ClientTimeout | None = None,
) -> Any:
    """One request; its answer's JSON as dicts and lists. A non-2xx answer raises ApiException,
    as the generated methods do (so one reading of errors, `Answer.of`, serves both)."""
    return await api.call_api(
        path,
        method,
        query_params=list(query),
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body,
        response_types_map=_PLAIN_JSON,
        auth_settings=_AUTH_SETTINGS,
        _return_http_data_only=True,
        _request_timeout=timeout,  # TimedApiClient's REQUEST_TIMEOUT_S when None
    )


async def error_from_response(response: aiohttp.ClientResponse) -> ApiError:
    """An ApiError from a non-2xx raw response (its body is a metav1.Status when it is JSON)."""
    try:
        body = await response.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        error = ApiError.from_status(body, default=response.status)
        error.status = response.status
        return error
    return ApiError(response.status, response.reason or "", "")


def now() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    """`2026-01-01T00:00:00.123456Z`: the form the engine parses (engine.timeutil)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def micro_time(moment: datetime) -> str:
    """metav1.MicroTime, `2006-01-02T15:04:05.000000Z`, always six fraction digits.

    The API server parses MicroTime fields (Lease renewTime/acquireTime, Event
    eventTime) with exactly that layout: `isoformat()` drops the fraction when the
    microsecond is 0, and the server answers such a write 400 Bad Request.
    """
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
