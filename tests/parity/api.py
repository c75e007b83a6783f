"""Fast admin calls to the test API server: kept-alive connections, requests in parallel.

testbed/cluster.py's `request` opens a TLS connection per call, which costs
about as much as the call itself; a parity run writes a few hundred objects per
cluster, hundreds of clusters a run. `Api` keeps one HTTPS connection per worker
thread and sends independent writes (every pod of a cluster, say) in parallel.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from testbed import cluster as cluster_mod

# Parallel writers: the API server and etcd share the machine's two cores with
# everything else, so more only queue up; four keep both busy while one waits.
WRITERS = 4
# One call against a loaded single-node control plane: well under a second; a CI
# machine shared by several test runs gets far more before it counts as hung.
CALL_TIMEOUT_S = 60.0


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:300]}")
        self.status = status


class Api:
    """`Api(cluster)`: JSON calls as the admin over kept-alive connections, one per thread."""

    def __init__(self, cluster: cluster_mod.TestCluster) -> None:
        parts = urlsplit(cluster.url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 443
        self._token = cluster.token("admin")
        self._context = ssl.create_default_context(cafile=str(cluster.ca_file))
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="parity-api")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _connection(self) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(
                self._host, self._port, context=self._context, timeout=CALL_TIMEOUT_S
            )
            self._local.conn = conn
        return conn

    def call(self, method: str, path: str, body: Any = None, *, patch: str = "merge") -> Any:
        """One call; the decoded answer. A dropped kept-alive connection is reopened once."""
        data = None if body is None else json.dumps(body).encode()
        content = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Content-Type": content[patch] if method == "PATCH" else "application/json",
            "Accept": "application/json",
        }
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                text = response.read().decode()
                break
            except (http.client.HTTPException, ConnectionError, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        if response.status >= 300:
            raise ApiError(method, path, response.status, text)
        return json.loads(text) if text else None

    def each(self, calls: Iterable[tuple[Any, ...]]) -> list[Any]:
        """Independent calls `(method, path, body)` in parallel; their answers in order."""
        items = list(calls)
        return list(self._pool.map(lambda c: self.call(*c), items))

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return list(self._pool.map(fn, items))
