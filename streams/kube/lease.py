"""Leader election over a coordination.k8s.io/v1 Lease: only its holder writes to the cluster.

Follows client-go's leaderelection. A candidate takes the Lease when nobody
holds it, or when the holder's record has not changed for leaseDurationSeconds
as measured on the candidate's own monotonic clock (never by comparing the
holder's renewTime with our wall clock: node clocks differ). The holder renews
every RETRY_PERIOD_S and stops acting as leader once RENEW_DEADLINE_S pass
without a successful renewal, which is before any other candidate may take
over. Updates carry the Lease's resourceVersion, so of two candidates racing
for it only one wins (the other gets 409 Conflict).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter, Gauge

from streams.kube import api as kube

log = logging.getLogger(__name__)

# How long a holder's claim lasts without renewal: the failover time after a
# leader dies (client-go's default). Shorter risks flapping on a slow API server.
LEASE_DURATION_S = 15.0
# A leader that could not renew for this long stops writing. It must be shorter
# than LEASE_DURATION_S, so the old leader has stopped before a new one may start.
RENEW_DEADLINE_S = 10.0
# How often the holder renews and candidates retry.
RETRY_PERIOD_S = 2.0

LEADER = Gauge("preemptctl_leader", "1 while this process holds the Lease.", ["lease"])
TRANSITIONS = Counter("preemptctl_leader_transitions_total", "Times this process became leader.", ["lease"])
LEASE_ERRORS = Counter("preemptctl_lease_errors_total", "Failed Lease reads and writes.", ["reason"])


class NotLeader(Exception):
    """A write was about to happen without holding the Lease."""


class LeaseElector:
    """Acquires and renews one Lease; `check()` before every write."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration_s: float = LEASE_DURATION_S,
        renew_deadline_s: float = RENEW_DEADLINE_S,
        retry_period_s: float = RETRY_PERIOD_S,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = kube.now,
    ) -> None:
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need retry period < renew deadline < lease duration")
        self._api = client.CoordinationV1Api(api)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self._duration_s = lease_duration_s
        self._deadline_s = renew_deadline_s
        self._retry_s = retry_period_s
        self._monotonic = monotonic
        self._now = now
        self._renewed_at: float | None = None  # monotonic time the last successful renewal started
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._became_leader = asyncio.Event()
        LEADER.labels(name).set(0)

    def is_leader(self) -> bool:
        return self._renewed_at is not None and self._monotonic() < self._renewed_at + self._deadline_s

    def check(self) -> None:
        if not self.is_leader():
            self._lost()
            raise NotLeader(f"not the holder of Lease {self.namespace}/{self.name}")

    async def wait_leader(self) -> None:
        while not self.is_leader():
            self._became_leader.clear()
            await self._became_leader.wait()

    def _lost(self) -> None:
        if self._renewed_at is not None:
            log.warning("lost Lease %s/%s", self.namespace, self.name)
        self._renewed_at = None
        LEADER.labels(self.name).set(0)

    async def run(self) -> None:
        """Acquire, then keep renewing, until cancelled; a leader releases the Lease on the way out."""
        try:
            while True:
                try:
                    await self.try_acquire_or_renew()
                except (ApiException, OSError, TimeoutError) as exc:
                    LEASE_ERRORS.labels(kube.reason_of(exc)).inc()
                    log.warning("Lease %s/%s: %s", self.namespace, self.name, kube.reason_of(exc))
                if not self.is_leader():
                    self._lost()
                await asyncio.sleep(self._retry_s)
        finally:
            await asyncio.shield(self.release())

    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this process holds the Lease afterwards."""
        started = self._monotonic()
        stamp = self._now()
        try:
            lease = await self._api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(stamp, transitions=0),
            )
            try:
                await self._api.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                if create_exc.status == 409:  # another candidate created it first
                    return False
                raise
            return self._won(started)
        spec = lease.spec or client.V1LeaseSpec()
        record = (
            spec.holder_identity,
            spec.renew_time,
            spec.acquire_time,
            spec.lease_duration_seconds,
            spec.lease_transitions,
        )
        if record != self._observed:
            self._observed, self._observed_at = record, started
        holder = spec.holder_identity
        duration = spec.lease_duration_seconds or self._duration_s
        if holder and holder != self.identity and started < self._observed_at + duration:
            return False  # held, and renewed within its duration as far as we can see
        transitions = spec.lease_transitions or 0
        if holder == self.identity:
            lease.spec = self._spec(stamp, transitions=transitions, acquired=spec.acquire_time)
        else:
            lease.spec = self._spec(stamp, transitions=transitions + 1)
        try:
            await self._api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:  # someone else updated it since our read
                return False
            raise
        return self._won(started)

    def _spec(self, stamp: datetime, *, transitions: int, acquired: datetime | None = None) -> Any:
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=round(self._duration_s),
            acquire_time=acquired or stamp,
            renew_time=stamp,
            lease_transitions=transitions,
        )

    def _won(self, started: float) -> bool:
        if not self.is_leader():
            log.info("acquired Lease %s/%s as %s", self.namespace, self.name, self.identity)
            TRANSITIONS.labels(self.name).inc()
        self._renewed_at = started
        LEADER.labels(self.name).set(1)
        self._became_leader.set()
        return True

    async def release(self) -> None:
        """Give the Lease up at once (so a successor need not wait out its duration)."""
        if not self.is_leader():
            return
        self._lost()
        try:
            lease = await self._api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = ""  # client-go's "nobody": candidates take it at once
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = self._now()
            await self._api.replace_namespaced_lease(self.name, self.namespace, lease)
            log.info("released Lease %s/%s", self.namespace, self.name)
        except (ApiException, OSError, TimeoutError) as exc:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, kube.reason_of(exc))
