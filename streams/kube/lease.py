"""Leader election over a coordination.k8s.io/v1 Lease: only its holder writes to the cluster.

Follows client-go's leaderelection. A candidate takes the Lease when nobody
holds it, or when the holder's record has not changed for leaseDurationSeconds
as measured on the candidate's own monotonic clock (never by comparing the
holder's renewTime with our wall clock: node clocks differ). The holder renews
every RETRY_PERIOD_S and stops acting as leader once RENEW_DEADLINE_S pass
without a successful renewal, which is before any other candidate may take
over. Updates carry the Lease's resourceVersion, so of two candidates racing
for it only one wins (the other gets 409 Conflict).

What a real API server showed, handled here:
- Fencing: `check()` lets a write start only while the Lease has more validity
  left than the write's own timeout (api.WRITE_TIMEOUT_S), measured from the
  start of the last successful renewal to the renew deadline; the actuator runs
  it before each write and again as the write's bytes leave the process
  (api.checked_when_sent), so a write that waited for a connection is not sent
  on the strength of an old check. The server is
  given the same deadline (`?timeout=`, api.TimedApiClient), so a write is
  answered or abandoned, by the client and by the server, before this process
  stops calling itself leader, which is itself LEASE_DURATION_S -
  RENEW_DEADLINE_S before anyone else may take over. A process frozen (SIGSTOP,
  a paused VM or container) finds on waking that its monotonic clock moved on,
  and starts nothing; a write it had in the server when it froze is given up
  there at its deadline, although the frozen client can no longer give up.
  What no client can fence (Kubernetes has no fencing token): a freeze in the
  instant between that last check and the bytes reaching the kernel, or a
  request held on its way (an L7
  proxy) for longer than the margin; the server's deadline counts from when it
  received the request. Only the server checking the holder on each write
  (admission against the Lease) would close those.
- The loop survives any exception of one round (ApiException, aiohttp's
  ServerDisconnectedError, which is neither OSError nor TimeoutError, a timeout,
  a malformed answer, a CancelledError nobody asked for): the round is logged,
  counted and retried. A cancellation of the loop's own task ends it. `liveness()`
  reports a loop that ended or stopped making rounds, so /livez turns red and the
  kubelet restarts the process instead of leaving a candidate that never leads.
- Times go out as MicroTime (api.micro_time): the server refuses renewTime
  without its six fraction digits.
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
# A loop that has not finished a round for this many lease durations is stuck (each
# round is bounded by two api.WRITE_TIMEOUT_S calls plus one retry period): /livez says so.
STALL_AFTER_LEASES = 4

# `component` (source, actuator) tells the two Leases apart in alerts without knowing their names.
LEADER = Gauge("preemptctl_leader", "1 while this process holds the Lease.", ["component", "lease"])
TRANSITIONS = Counter(
    "preemptctl_leader_transitions_total", "Times this process became leader.", ["component", "lease"]
)
LEASE_ERRORS = Counter("preemptctl_lease_errors_total", "Failed Lease reads and writes.", ["reason"])


class NotLeader(Exception):
    """A write was about to happen without holding the Lease."""


def check_timings(*, lease_duration_s: float, renew_deadline_s: float, retry_period_s: float) -> None:
    """ValueError, saying which, unless retry period < renew deadline < lease duration, all usable.

    The order is what makes one holder at a time: a holder stops writing at its renew
    deadline, before any candidate may take over at the lease duration. The renew deadline
    must also exceed api.WRITE_TIMEOUT_S, or `check()` would never let a write start.
    """
    if not retry_period_s > 0:
        raise ValueError(f"retry period must be positive, got {retry_period_s:g}s")
    if lease_duration_s != round(lease_duration_s):
        raise ValueError(
            f"lease duration must be whole seconds (the Lease records them), got {lease_duration_s:g}s"
        )
    if not retry_period_s < renew_deadline_s < lease_duration_s:
        raise ValueError(
            f"need retry period < renew deadline < lease duration, got {retry_period_s:g}s, "
            f"{renew_deadline_s:g}s, {lease_duration_s:g}s"
        )
    if not renew_deadline_s > kube.WRITE_TIMEOUT_S:
        raise ValueError(
            f"renew deadline {renew_deadline_s:g}s must exceed the {kube.WRITE_TIMEOUT_S:g}s write timeout "
            "(a write starts only while the Lease outlives it)"
        )


class LeaseElector:
    """Acquires and renews one Lease; `check()` before every write; `run()` is the loop."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        component: str = "",
        lease_duration_s: float = LEASE_DURATION_S,
        renew_deadline_s: float = RENEW_DEADLINE_S,
        retry_period_s: float = RETRY_PERIOD_S,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = kube.now,
    ) -> None:
        check_timings(
            lease_duration_s=lease_duration_s,
            renew_deadline_s=renew_deadline_s,
            retry_period_s=retry_period_s,
        )
        self._api = client.CoordinationV1Api(api)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.component = component
        self._duration_s = lease_duration_s
        # False: leaving (`run` cancelled) lets the Lease expire instead of releasing it, for a
        # holder whose writes may still land (the actuator cut short at its stop).
        self.release_on_exit = True
        self._deadline_s = renew_deadline_s
        self._retry_s = retry_period_s
        self._monotonic = monotonic
        self._now = now
        self._renewed_at: float | None = None  # monotonic time the last successful renewal started
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._became_leader = asyncio.Event()
        self._round_at: float | None = None  # monotonic time the loop last finished a round
        self._ended: str | None = None  # why run() ended, when it did other than by cancellation
        # The holder the last round saw (this process's identity once it holds the Lease), or
        # None before any round: lets a standby tell "another process leads" from "no answer yet".
        self.holder: str | None = None
        LEADER.labels(component, name).set(0)

    @property
    def retry_period_s(self) -> float:
        return self._retry_s

    def is_leader(self) -> bool:
        return self.remaining_s() > 0

    def remaining_s(self) -> float:
        """How much longer this process may call itself leader without another renewal."""
        if self._renewed_at is None:
            return 0.0
        return self._renewed_at + self._deadline_s - self._monotonic()

    def check(self, needed_s: float = kube.WRITE_TIMEOUT_S) -> None:
        """Raise NotLeader unless the Lease stays ours for `needed_s` more (a write's timeout)."""
        remaining = self.remaining_s()
        if remaining <= needed_s:
            if remaining <= 0:
                self._lost()
            raise NotLeader(
                f"not the holder of Lease {self.namespace}/{self.name} for the next {needed_s:g}s "
                f"({max(remaining, 0):.1f}s left)"
            )

    def liveness(self) -> str | None:
        """None while the loop runs and makes rounds; else why not (a /livez check)."""
        if self._ended is not None:
            return self._ended
        if (
            self._round_at is not None
            and self._monotonic() - self._round_at > STALL_AFTER_LEASES * self._duration_s
        ):
            return f"Lease loop made no round for {self._monotonic() - self._round_at:.0f}s"
        return None

    async def wait_leader(self, needed_s: float = 0.0) -> None:
        """Return once this process holds the Lease with more than `needed_s` of validity left."""
        while self.remaining_s() <= needed_s:
            self._became_leader.clear()
            await self._became_leader.wait()

    def _lost(self) -> None:
        if self._renewed_at is not None:
            log.warning("lost Lease %s/%s", self.namespace, self.name)
        self._renewed_at = None
        LEADER.labels(self.component, self.name).set(0)

    async def run(self) -> None:
        """Acquire, then keep renewing, until cancelled; a leader releases the Lease on the way out."""
        self._round_at = self._monotonic()
        try:
            while True:
                try:
                    await self.try_acquire_or_renew()
                except asyncio.CancelledError as exc:
                    if _cancel_requested():
                        raise  # this task is being cancelled: never swallowed
                    # Nobody cancelled this task: a library let its own inner cancellation escape.
                    # A failed round like any other; ending the loop would leave a process that
                    # never leads again until /livez noticed the stall.
                    LEASE_ERRORS.labels("CancelledError").inc()
                    log.warning("Lease %s/%s: %s", self.namespace, self.name, _describe(exc))
                except Exception as exc:  # any failed round is retried, never fatal
                    LEASE_ERRORS.labels(kube.reason_of(exc)).inc()
                    log.warning("Lease %s/%s: %s", self.namespace, self.name, _describe(exc))
                if not self.is_leader():
                    self._lost()
                self._round_at = self._monotonic()
                await asyncio.sleep(self._retry_s)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._ended = f"Lease loop ended: {_describe(exc)}"
            raise
        finally:
            if self.release_on_exit:
                await asyncio.shield(self.release())
            else:
                self._lost_quietly()

    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this process holds the Lease afterwards."""
        started = self._monotonic()
        stamp = self._now()
        try:
            lease = await self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=kube.write_timeout()
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            body: Any = {  # a dict, not V1Lease: its times must go out as MicroTime strings
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(stamp, transitions=0),
            }
            try:
                await self._api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=kube.write_timeout()
                )
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
        self.holder = holder or ""
        duration = spec.lease_duration_seconds or self._duration_s
        if holder and holder != self.identity and started < self._observed_at + duration:
            return False  # held, and renewed within its duration as far as we can see
        transitions = spec.lease_transitions or 0
        if holder == self.identity:
            new_spec = self._spec(stamp, transitions=transitions, acquired=spec.acquire_time)
        else:
            new_spec = self._spec(stamp, transitions=transitions + 1)
        try:
            await self._api.replace_namespaced_lease(
                self.name, self.namespace, self._body(lease, new_spec), _request_timeout=kube.write_timeout()
            )
        except ApiException as exc:
            if exc.status == 409:  # someone else updated it since our read
                return False
            raise
        return self._won(started)

    def _body(self, lease: Any, spec: dict[str, Any]) -> Any:
        """A replacement of `lease` (as read) with `spec`: the read's resourceVersion guards the update."""
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": lease.metadata.resource_version,
                **({"labels": lease.metadata.labels} if lease.metadata.labels else {}),
            },
            "spec": spec,
        }

    def _spec(
        self,
        stamp: datetime,
        *,
        transitions: int,
        acquired: datetime | None = None,
        holder: str | None = None,
    ) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity if holder is None else holder,
            "leaseDurationSeconds": round(self._duration_s),
            "acquireTime": kube.micro_time(acquired or stamp),
            "renewTime": kube.micro_time(stamp),
            "leaseTransitions": transitions,
        }

    def _lost_quietly(self) -> None:
        self._renewed_at = None
        LEADER.labels(self.component, self.name).set(0)

    def _won(self, started: float) -> bool:
        if not self.is_leader():
            log.info("acquired Lease %s/%s as %s", self.namespace, self.name, self.identity)
            TRANSITIONS.labels(self.component, self.name).inc()
        self._renewed_at = started
        self.holder = self.identity
        LEADER.labels(self.component, self.name).set(1)
        self._became_leader.set()
        return True

    async def release(self) -> None:
        """Give the Lease up at once (so a successor need not wait out its duration).

        Only a Lease still recorded as ours is given up, and the update carries the
        read's resourceVersion: a successor that took it meanwhile keeps it.
        """
        self._lost_quietly()
        try:
            lease = await self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=kube.write_timeout()
            )
            spec = lease.spec
            if spec is None or spec.holder_identity != self.identity:
                return
            # client-go's "nobody": an empty holder, which candidates take at once.
            released = self._spec(
                self._now(), transitions=spec.lease_transitions or 0, acquired=spec.acquire_time, holder=""
            )
            released["leaseDurationSeconds"] = 1
            await self._api.replace_namespaced_lease(
                self.name, self.namespace, self._body(lease, released), _request_timeout=kube.write_timeout()
            )
            log.info("released Lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # on the way out: the Lease then simply expires
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, _describe(exc))


def _cancel_requested() -> bool:
    """Is the running task being cancelled (Task.cancel() called and not yet uncancelled)?"""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {kube.reason_of(exc)}" if not str(exc) else f"{type(exc).__name__}: {exc}"
