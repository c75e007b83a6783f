"""A list+watch stream of one Kubernetes resource, whatever is done with its objects.

What the API server's list and watch protocol asks of every client, handled here and
only here (the source, streams.kube.source, consumes it; kopf keeps the same apart
in its `watching` module):
- A list comes in pages (`limit`, `continue`); a paginated list is one snapshot, and
  the first page's resourceVersion is the list's. A page that fails (an expired
  continue token included) fails the list: the caller lists again.
- List items carry no kind/apiVersion (only the List does): they are set here, so
  every object out of a stream has them.
- A watch starts from a resourceVersion (the list's) and ends at the server's
  `timeoutSeconds` (WATCH_TIMEOUT_S); `follow` resumes it from the last version seen.
- BOOKMARK events carry only a newer resourceVersion: remembered, nothing delivered.
  Bookmarks keep a quiet watch's version fresh, so restarts rarely meet a 410.
- 410 Gone / Expired (an HTTP status or an ERROR watch event): the history the watch
  needs is compacted; `Expired` tells the caller to list again.
- A watch that ends at once with nothing in it is a fault, not a timeout: retried
  with backoff (SHORT_WATCH_S), like client-go's "very short watch".
- Watch events are JSON lines of any length (aiohttp's readline caps line size).
- Discovery (`served`): whether the API server serves a resource at all (a CRD's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import aiohttp
import orjson
from kubernetes_asyncio import client

from streams.common.backoff import Backoff
from streams.kube import api as kube

log = logging.getLogger(__name__)

# Objects per list page: client-go's informer page size. Smaller pages cost round
# trips; larger ones hold more of a 150k-pod cluster in memory at once.
LIST_PAGE_SIZE = 500
# Server-side watch timeout. The API server ends a watch after it anyway (its
# default is a random 30-60 min); ending it ourselves bounds how long a silently
# broken connection can go unnoticed.
WATCH_TIMEOUT_S = 300
# The client gives the server this long past timeoutSeconds before it calls the
# connection dead (bookmarks arrive about once a minute on an idle watch).
WATCH_READ_MARGIN_S = 30.0
# A watch the server (or a proxy, a load balancer) ends within this long having delivered
# nothing, not even a bookmark, is a fault, not a timeout: resumed at once, it would loop as
# fast as the server answers. client-go's reflector calls it a "very short watch" and backs off.
SHORT_WATCH_S = 1.0

# What a list, a watch or a discovery call fails with when the API (or the way to it) fails:
# the caller retries.
ERRORS: tuple[type[BaseException], ...] = (kube.ApiError, aiohttp.ClientError, TimeoutError, ValueError)


@dataclass(frozen=True)
class Resource:
    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None) -> str:
        if namespace is not None:
            return f"{self.group_version_path}/namespaces/{namespace}/{self.plural}"
        return f"{self.group_version_path}/{self.plural}"

    def stamp(self, obj: dict[str, Any]) -> None:
        """Set kind and apiVersion where the server left them out (list items)."""
        obj.setdefault("kind", self.kind)
        obj.setdefault("apiVersion", self.api_version)


@dataclass
class Stream:
    """One list+watch: a resource in one namespace (or cluster-wide), and its last version."""

    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    version: str = ""

    @property
    def path(self) -> str:
        return self.resource.path(self.namespace)

    @property
    def name(self) -> str:
        return f"{self.resource.plural}" + (f"@{self.namespace}" if self.namespace else "")

    def selector_query(self) -> list[tuple[str, str]]:
        return [("labelSelector", self.label_selector)] if self.label_selector else []


class ShortWatch(Exception):
    """A watch that ended at once with nothing in it (see SHORT_WATCH_S): retried with backoff."""


class Expired(Exception):
    """410 Gone: the history a stream's watch needs is compacted; only a new list goes on from here."""


# Where a watch's object events go: (event type, object), in the order the server sent them.
Deliver = Callable[[str, dict[str, Any]], Awaitable[None]]
# What to do with a failed call (or a ShortWatch) of a stream: wait (a backoff), or raise to stop.
Failed = Callable[[Stream, BaseException, Backoff], Awaitable[None]]


async def served(api: client.ApiClient, resource: Resource) -> bool:
    """Does discovery serve `resource`? (Discovery needs no RBAC beyond being authenticated.)"""
    response = await kube.raw_request(api, resource.group_version_path)
    try:
        if response.status == 404:
            return False
        if response.status != 200:
            raise await kube.error_from_response(response)
        body = orjson.loads(await response.read())
    finally:
        response.release()
    return any(r.get("name") == resource.plural for r in body.get("resources") or ())


async def list_objects(
    api: client.ApiClient, stream: Stream, *, page_size: int = LIST_PAGE_SIZE
) -> AsyncGenerator[dict[str, Any], None]:
    """Every object of one list, page by page as the pages arrive; then the stream's version is
    the list's. A failed page raises (one of ERRORS) and leaves the version as it was."""
    token = ""
    version = ""
    while True:
        query = [("limit", str(page_size)), *stream.selector_query()]
        if token:
            query.append(("continue", token))
        response = await kube.raw_request(api, stream.path, query=query)
        try:
            if response.status != 200:
                raise await kube.error_from_response(response)
            body = orjson.loads(await response.read())
        finally:
            response.release()
        meta = body.get("metadata") or {}
        # A paginated list is one snapshot: the first page's version is the list's.
        version = version or str(meta.get("resourceVersion") or "")
        for obj in body.get("items") or ():
            stream.resource.stamp(obj)
            yield obj
        token = str(meta.get("continue") or "")
        if not token:
            break
    stream.version = version


async def follow(
    api: client.ApiClient,
    stream: Stream,
    deliver: Deliver,
    *,
    opened: asyncio.Event,
    backoff: Backoff,
    failed: Failed,
    timeout_s: int = WATCH_TIMEOUT_S,
) -> NoReturn:
    """Watch one stream from its version, resuming after each watch ends, until cancelled.

    `opened` is set once the first watch answers (or fails). A failed watch (or a short one)
    is handed to `failed`, which waits before the next one or raises; a 410 raises Expired.
    """
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        try:
            delivered = await watch(api, stream, deliver, opened=opened, backoff=backoff, timeout_s=timeout_s)
        except ERRORS as exc:
            opened.set()  # the caller's list goes on; this watch retries on its own
            if kube.status_of(exc) == 410:
                raise Expired(f"{stream.name}: 410 Gone") from exc
            await failed(stream, exc, backoff)
            continue
        if not delivered and loop.time() - started < SHORT_WATCH_S:
            await failed(stream, ShortWatch(f"ended after {loop.time() - started:.2f}s, empty"), backoff)


async def watch(
    api: client.ApiClient,
    stream: Stream,
    deliver: Deliver,
    *,
    opened: asyncio.Event,
    backoff: Backoff,
    timeout_s: int = WATCH_TIMEOUT_S,
) -> int:
    """One watch request, until the server ends it; returns how many events it delivered."""
    delivered = 0
    query = [
        ("watch", "true"),
        ("allowWatchBookmarks", "true"),
        ("timeoutSeconds", str(timeout_s)),
        ("resourceVersion", stream.version),
        *stream.selector_query(),
    ]
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=kube.CONNECT_TIMEOUT_S,
        sock_read=timeout_s + WATCH_READ_MARGIN_S,
    )
    response = await kube.raw_request(api, stream.path, query=query, timeout=timeout)
    try:
        if response.status != 200:
            raise await kube.error_from_response(response)
        opened.set()
        async for line in lines(response):
            event = orjson.loads(line)
            event_type, obj = event.get("type"), event.get("object")
            if event_type == "ERROR":
                raise kube.ApiError.from_status(obj)
            if not isinstance(obj, dict):
                raise ValueError(f"watch event without an object: {line[:200]!r}")
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if event_type in ("ADDED", "MODIFIED", "DELETED"):
                stream.resource.stamp(obj)
                # A caller that is not keeping up pauses this watch (backpressure).
                await deliver(event_type, obj)
            elif event_type != "BOOKMARK":
                log.warning("%s: ignoring watch event of type %r", stream.name, event_type)
            if version:
                stream.version = version
            backoff.reset()
            delivered += 1
    finally:
        response.close()
    return delivered


async def lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """JSON lines of a watch stream, of any length (aiohttp's readline caps line size)."""
    buffer = bytearray()
    async for chunk in response.content.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield line
    if buffer.strip():
        yield bytes(buffer)
