"""Acting on the cluster for one decision: victims, the preemptor's nomination, Events.

Every Kubernetes edge case of actuation is handled here, with its reason:
- A victim the decision marks `terminating`: already-terminating, and no API
  call at all (its capacity is leaving anyway; docs/semantics.md).
- The pod is read before any write:
  - 404: already-gone. The goal (the pod no longer running) is reached, so a
    missing pod is success, never an error.
  - another uid: uid-changed, nothing done. The name now belongs to a pod
    recreated since the decision (a StatefulSet replica, say), which no
    decision chose.
  - deletionTimestamp set: already-terminating. Someone is deleting it already;
    evicting or deleting again could only shorten its grace period.
- Every write carries the victim's uid as a precondition (Eviction and
  DeleteOptions preconditions, metadata.uid in patches), which closes the race
  between the read and the write. A 409 or 422 answer is classified by reading
  the pod again; a 404 answer to a write is already-gone.
- Eviction answers (what kube-apiserver's eviction subresource says, read by
  `Answer`):
  - 429 with a DisruptionBudget cause in details.causes: a PodDisruptionBudget
    forbids it for now. Retried with backoff, waiting at least the server's
    Retry-After, up to EVICTION_ATTEMPTS times, then blocked-by-pdb with the
    server's own reason ("The disruption budget web needs 2 healthy pods and has
    2 currently").
  - 429 without that cause is API priority-and-fairness throttling, like a 429
    on any other call: transient.
  - 500 "This pod has more than one PodDisruptionBudget": the eviction
    subresource never evicts such a pod, so retrying cannot help: blocked-by-pdb
    at once, with that message.
- 5xx, 429 without a PDB cause and network errors (timeouts, dropped connections)
  are transient on every call: retried TRANSIENT_ATTEMPTS times, never sooner than
  Retry-After (capped at RETRY_AFTER_MAX_S), then the outcome is error.
- Every write has api.WRITE_TIMEOUT_S (the API server is told it as `?timeout=`)
  and is sent only while `guard` (the Lease's check) says the Lease outlives that
  timeout: checked before the call and again as the request's bytes are written
  (api.checked_when_sent), so waiting for a connection does not stretch the margin.
- delete: the DisruptionTarget=True condition (reason PreemptionByScheduler) is
  set on the pod's status first (unless already True), as kube-scheduler does,
  so controllers and the engine's `wait` rule know why the pod is going; then it
  is deleted with its own terminationGracePeriodSeconds.
- Requests and answers are plain JSON (`api.json_request`): no client models,
  whose parsing cost more CPU than the rest of a decision.
- label: the soft-eviction label, and an annotation of the same key holding the
  JSON detail (a label value cannot hold JSON).
- The preemptor is read before it is nominated: when the decision names its
  uid, a preemptor that is gone, recreated or already bound stops the decision,
  and no victim is touched (each gets outcome error, saying why); so does one of
  a scheduler outside the actuator's scope (--scheduler-name). The nomination is
  a JSON patch whose `test` ops (the uid; spec.nodeName absent, which the API
  server's json-patch reads as null) the server checks on the pod it writes, so a
  preemptor bound or replaced after the read is caught too (422; read again to
  say which).
- In step with the preemptor (`Gate`), as kube-scheduler's executor goes: each
  victim is read while the preemptor is; a `delete` victim is marked
  DisruptionTarget while the preemptor is nominated; every delete, eviction and
  label waits for the nomination. When the nomination then fails, a victim
  already marked is not deleted and its mark is set to False (what the disruption
  controller does to a stale one, reason WITHDRAWN_REASON). So the critical path
  is one read and two writes, not five calls in a row, and the reads still settle
  every case above before anything is written.
- After a crash between our write and its record (the ledger says pending), a
  pod found gone, terminating or replaced counts as done: it was our write.
- Events: events.k8s.io/v1, as kube-scheduler writes them (executor.go): reason
  Preempted, action Preempting, regarding the victim, related the preemptor,
  note "Preempted by pod UID on node N", eventTime as MicroTime; the decision id
  in the DECISION_ANNOTATION annotation. Notes truncated to EVENT_MESSAGE_LIMIT;
  names are derived from (decision, victim), so a 409 AlreadyExists means we
  posted it before a restart, which is success. A failed Event never fails the
  victim's outcome.
- --dry-run sends dryRun=All on every write (reads are real), so the API server
  validates and admits each request but persists nothing. A DELETE carries it in
  its DeleteOptions body too: kube-apiserver reads a DELETE's options from the
  body when there is one and ignores the query's dryRun (a real server started
  graceful deletion of a pod under a query-only dry run).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter, Histogram

from schemas.records import EvictionResult, VictimRecord
from streams.common.backoff import Backoff
from streams.kube import api as kube

log = logging.getLogger(__name__)

SOFT_EVICTION = "scheduling.koordinator.sh/soft-eviction"
DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_REASON = "PreemptionByScheduler"
# The reason of a DisruptionTarget=False that withdraws our mark from a victim we did not
# delete after all (its preemptor's nomination failed meanwhile); the engine's `wait` rule
# reads only DisruptionTarget=True.
WITHDRAWN_REASON = "PreemptionWithdrawn"
# What a refused decision's victims' outcomes say after the refusal.
UNTOUCHED = "no victim was touched"
# kube-scheduler's Event reason and action on a preempted victim (events.k8s.io/v1).
EVENT_REASON = "Preempted"
EVENT_ACTION = "Preempting"
EVENT_BLOCKED_REASON = "PreemptionBlocked"
COMPONENT = "preemptctl"
# What kube-scheduler calls itself: a pod without spec.schedulerName is its.
DEFAULT_SCHEDULER = "default-scheduler"
# The preemptionPolicy of a pod that may not preempt (core/v1 PreemptNever).
NEVER = "Never"
# The Event's annotation holding the decision id, so an Event leads back to its record.
DECISION_ANNOTATION = "preemptctl.io/decision-id"
# policy/v1's DisruptionBudgetCause: the `reason` of the StatusCause an eviction 429 carries.
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"
# What kube-apiserver says (500) when a pod is covered by several PDBs: the eviction
# subresource refuses such a pod for good (registry/core/pod/storage/eviction.go).
MULTIPLE_PDBS = "more than one PodDisruptionBudget"
# The API server caps an Event's message (events.k8s.io `note`) at 1 kB, counted in
# bytes (Go's len of the UTF-8 string); kube's own recorders truncate rather than have
# the Event rejected.
EVENT_MESSAGE_LIMIT = 1024
# events.k8s.io validation refuses a longer reportingInstance (422, the Event is lost);
# --identity may be any pod name, up to 253 characters.
REPORTING_INSTANCE_LIMIT = 128
# DNS subdomain names (Event names) are at most 253 characters.
_NAME_LIMIT = 253
# Kubernetes' default terminationGracePeriodSeconds, for a pod that sets none.
DEFAULT_GRACE_PERIOD_S = 30

# A PDB that forbids an eviction now may allow it after a replacement pod
# becomes ready (tens of seconds): 5 attempts over ~15 s (1+2+4+8) give it that
# chance without holding the decision stream for minutes.
EVICTION_ATTEMPTS = 5
EVICTION_BACKOFF_INITIAL_S = 1.0
EVICTION_BACKOFF_MAX_S = 8.0
# An API server restart or an overloaded one answers 5xx or nothing for a few
# seconds; three tries over ~1.5 s ride that out before the outcome is error.
TRANSIENT_ATTEMPTS = 3
TRANSIENT_BACKOFF_INITIAL_S = 0.5
TRANSIENT_BACKOFF_MAX_S = 4.0
# A Retry-After longer than this is not waited out in full: a misbehaving proxy must
# not hold the decision stream for minutes (the API server itself says 1-10 s).
RETRY_AFTER_MAX_S = 30.0

_TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
_NETWORK_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)

API_REQUESTS = Counter(
    "preemptctl_actuator_api_requests_total",
    "Kubernetes API calls by the actuator, by operation and HTTP status (or 'network').",
    ["operation", "code"],
)
ACTION_SECONDS = Histogram(
    "preemptctl_actuator_action_duration_seconds",
    "Time to act on one victim, retries included.",
    ["action"],
)
EVENT_FAILURES = Counter("preemptctl_actuator_event_failures_total", "Events that could not be posted.")


@dataclass(frozen=True)
class RetryPolicy:
    eviction_attempts: int = EVICTION_ATTEMPTS
    eviction_backoff_initial_s: float = EVICTION_BACKOFF_INITIAL_S
    eviction_backoff_max_s: float = EVICTION_BACKOFF_MAX_S
    transient_attempts: int = TRANSIENT_ATTEMPTS
    transient_backoff_initial_s: float = TRANSIENT_BACKOFF_INITIAL_S
    transient_backoff_max_s: float = TRANSIENT_BACKOFF_MAX_S
    retry_after_max_s: float = RETRY_AFTER_MAX_S


@dataclass(frozen=True)
class Answer:
    """What an API error says, read in one place: status, message, PDB cause, Retry-After."""

    status: int | None
    message: str = ""
    pdb_cause: str = ""  # the DisruptionBudget cause's message, when the server gave one
    retry_after_s: float | None = None

    @classmethod
    def of(cls, exc: BaseException) -> Answer:
        if not isinstance(exc, ApiException):
            return cls(None, str(exc) or type(exc).__name__)
        try:
            body = json.loads(exc.body) if exc.body else {}
        except (TypeError, ValueError):
            body = {}
        body = body if isinstance(body, dict) else {}
        details = body.get("details") if isinstance(body.get("details"), dict) else {}
        causes = [c for c in (details or {}).get("causes") or () if isinstance(c, dict)]
        pdb = next(
            (str(c.get("message", "")) for c in causes if c.get("reason") == DISRUPTION_BUDGET_CAUSE), ""
        )
        retry_after = _retry_after(exc)
        seconds = (details or {}).get("retryAfterSeconds")
        if retry_after is None and isinstance(seconds, int | float) and seconds > 0:
            retry_after = float(seconds)
        return cls(
            int(exc.status) if exc.status else None,
            str(body.get("message") or exc.reason or exc.status),
            pdb,
            retry_after,
        )

    @property
    def pdb_blocked(self) -> bool:
        """429 with a DisruptionBudget cause: a PDB forbids this eviction for now."""
        return self.status == 429 and bool(self.pdb_cause)

    @property
    def multiple_pdbs(self) -> bool:
        return self.status == 500 and MULTIPLE_PDBS in self.message

    @property
    def transient(self) -> bool:
        """Worth retrying as it is: no answer, a 5xx, or throttling (429 without a PDB cause)."""
        if self.status is None:
            return True
        if self.pdb_blocked or self.multiple_pdbs:
            return False
        return self.status in _TRANSIENT_STATUSES


def _retry_after(exc: ApiException) -> float | None:
    """The Retry-After header in seconds (Answer.of falls back on details.retryAfterSeconds)."""
    headers: Any = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: not sent by the API server


@dataclass(frozen=True)
class Outcome:
    result: EvictionResult
    attempts: int = 0
    message: str = ""


@dataclass(frozen=True)
class Nomination:
    """What nominating a preemptor found: done, gone, recreated, bound, out-of-scope or error."""

    result: str
    proceed: bool  # act on the decision's victims?
    message: str = ""
    # Why it was refused, finer than `result` (the OUTCOME's nomination values are fixed within
    # v1: a refusal by the actuator's own checks says `error` there), for the refused counter.
    reason: str = ""


@dataclass(frozen=True)
class Context:
    """What a victim's actions need to know about its decision."""

    decision_id: str
    preemptor: str  # namespace/name, or namespace/pod-group for a job
    node: str
    preemptor_uid: str = ""  # a single-pod decision's preemptor, for the Event's related object
    reason: str = ""
    job: str = ""  # the job flow's namespace/pod-group, else empty
    trigger: str = ""  # the pod that asked for the decision (a job's first member)


class Gate:
    """When a decision's victims may be written to, told by its preemptor's nomination.

    `victims_read`: every victim of the decision was read (`read`: each reports once, with
    the pod as found when it is still to be written to, else None), so the actuator can
    check them all against the live preemptor before any is touched. `checked`: the
    preemptor was read and may have these victims (not gone, recreated, bound, another
    scheduler's, unable to preempt; every victim below it and on its node): a victim may be
    marked DisruptionTarget. `nominated`: its nomination is written: a victim may be
    deleted, evicted or labelled. Each resolves to None (go on) or to why not; `refuse`
    before `checked` means no victim is touched.
    """

    def __init__(self, victims: int = 0) -> None:
        loop = asyncio.get_running_loop()
        self._checked: asyncio.Future[str | None] = loop.create_future()
        self._nominated: asyncio.Future[str | None] = loop.create_future()
        self._unread = victims
        self._seen: list[tuple[VictimRecord, dict[str, Any]]] = []
        self._all_read: asyncio.Future[None] = loop.create_future()
        if victims <= 0:
            self._all_read.set_result(None)

    @classmethod
    def opened(cls) -> Gate:
        gate = cls()
        gate.open()
        return gate

    def read(self, victim: VictimRecord, pod: dict[str, Any] | None) -> None:
        """One victim was read: `pod` as found when it is to be written to (None: it is not)."""
        if pod is not None:
            self._seen.append((victim, pod))
        self._unread -= 1
        if self._unread <= 0 and not self._all_read.done():
            self._all_read.set_result(None)

    async def victims_read(self) -> list[tuple[VictimRecord, dict[str, Any]]]:
        """Once every victim reported: those still to be written to, with their live pods."""
        await asyncio.shield(self._all_read)
        return list(self._seen)

    def check_passed(self) -> None:
        if not self._checked.done():
            self._checked.set_result(None)

    def open(self) -> None:
        """Every victim may be acted on (the nomination is written, or not needed)."""
        self.check_passed()
        if not self._nominated.done():
            self._nominated.set_result(None)

    def refuse(self, why: str) -> None:
        """No victim may be acted on; one already marked is unmarked (`Actions.act`)."""
        if not self._checked.done():
            self._checked.set_result(why)
        if not self._nominated.done():
            self._nominated.set_result(why)

    async def checked(self) -> str | None:
        return await asyncio.shield(self._checked)

    async def nominated(self) -> str | None:
        return await asyncio.shield(self._nominated)


async def _nothing() -> None:
    return None


@dataclass
class Actions:
    """Kubernetes writes for the actuator. `guard` runs before every write (the Lease check)."""

    api: client.ApiClient
    dry_run: bool = False
    identity: str = COMPONENT
    guard: Callable[[], None] = lambda: None
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def _dry(self) -> list[tuple[str, str]]:
        return [("dryRun", "All")] if self.dry_run else []

    def _wait(self, backoff: Backoff, answer: Answer) -> float:
        """The pause before a retry: the backoff, or the server's Retry-After when longer."""
        return max(backoff.delay(), min(answer.retry_after_s or 0.0, self.retry.retry_after_max_s))

    async def _call(self, operation: str, call: Callable[[], Awaitable[Any]], *, write: bool) -> Any:
        """One API call with transient retries; the guard runs before each write attempt."""
        backoff = Backoff(self.retry.transient_backoff_initial_s, self.retry.transient_backoff_max_s)
        for attempt in range(1, self.retry.transient_attempts + 1):
            try:
                if write:
                    self.guard()
                    # And again as its bytes leave: a process frozen after this check (while
                    # the request waits for or opens a connection) must not send it on waking.
                    with kube.checked_when_sent(self.guard):
                        result = await call()
                else:
                    result = await call()
            except (ApiException, *_NETWORK_ERRORS) as exc:
                answer = Answer.of(exc)
                API_REQUESTS.labels(operation, str(answer.status or "network")).inc()
                if not answer.transient or attempt == self.retry.transient_attempts:
                    raise
            else:
                API_REQUESTS.labels(operation, "2xx").inc()
                return result
            await asyncio.sleep(self._wait(backoff, answer))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the server has it, or None when it does not exist."""
        try:
            pod: dict[str, Any] = await self._call(
                "read", lambda: kube.json_request(self.api, "GET", _pod_path(namespace, name)), write=False
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return pod

    async def _write(
        self,
        operation: str,
        method: str,
        path: str,
        body: Any,
        *,
        content_type: str = "application/json",
    ) -> Any:
        """One write, with its timeout (fencing counts on it) and dryRun, through `_call`."""
        return await self._call(
            operation,
            lambda: kube.json_request(
                self.api,
                method,
                path,
                body=body,
                query=self._dry(),
                content_type=content_type,
                timeout=kube.write_timeout(),
            ),
            write=True,
        )

    # ---- victims ---------------------------------------------------------------------

    async def act(
        self,
        victim: VictimRecord,
        context: Context,
        *,
        gate: Gate | None = None,
        resumed: bool = False,
        before_write: Callable[[], Awaitable[None]] = _nothing,
        limit: asyncio.Semaphore | None = None,
    ) -> Outcome:
        """Act on one victim by its action; never raises for API failures (outcome error).

        The victim is read while the preemptor is and reported to `gate` (the actuator checks
        every victim against the live preemptor before any is written to: `gate.checked`),
        marked DisruptionTarget while the preemptor is nominated, and deleted, evicted or
        labelled once it is (`gate.nominated`). `limit` bounds the requests in flight: held
        for the read and for the writes, not while waiting for the gate (whose checks wait
        for every victim's read).
        """
        action = victim["action"]
        gate = gate or Gate.opened()
        bound = limit if limit is not None else contextlib.nullcontext()
        with ACTION_SECONDS.labels(action).time():
            if victim.get("terminating"):
                gate.read(victim, None)
                refused = await gate.checked()
                if refused is not None:
                    return Outcome("error", 0, f"{refused}: {UNTOUCHED}")
                return Outcome("already-terminating", 0, "terminating when decided: no action needed")
            failed: BaseException | None = None
            pod: dict[str, Any] | None = None
            try:
                async with bound:
                    pod = await self._get(victim["namespace"], victim["name"])
            except (ApiException, *_NETWORK_ERRORS) as exc:
                pod, failed = None, exc
            finally:
                # Reported whatever happened (the gate waits for every victim): the pod when
                # it is still to be written to, so the actuator checks it before any write.
                writable = failed is None and _classify(pod, victim, resumed=resumed) is None
                gate.read(victim, pod if writable else None)
            refused = await gate.checked()  # not while holding `limit`: the checks wait for every read
            async with bound:
                return await self._settle(victim, context, gate, pod, failed, refused, resumed, before_write)

    async def _settle(
        self,
        victim: VictimRecord,
        context: Context,
        gate: Gate,
        pod: dict[str, Any] | None,
        failed: BaseException | None,
        refused: str | None,
        resumed: bool,
        before_write: Callable[[], Awaitable[None]],
    ) -> Outcome:
        """The rest of `act` once the victim is read and the gate's checks are done: write."""
        action = victim["action"]
        if refused is not None:
            if pod is not None and _marked_by(pod, context.decision_id):
                # An earlier delivery of this decision marked it and was cut short.
                return await self._withdraw(victim, context, refused)
            return Outcome("error", 0, f"{refused}: {UNTOUCHED}")
        if failed is not None:
            return Outcome("error", 0, f"read failed: {_describe(failed)}")
        found = _classify(pod, victim, resumed=resumed)
        if found is not None:
            return found
        assert pod is not None  # _classify settles a missing pod
        attempts = [0]
        try:
            if action == "delete":
                return await self._delete(victim, pod, context, attempts, gate, before_write)
            refused = await gate.nominated()
            if refused is not None:
                return Outcome("error", 0, f"{refused}: {UNTOUCHED}")
            self.guard()  # before the ledger says "pending": a non-leader must not leave that mark
            await before_write()
            if action == "evict":
                return await self._evict(victim, attempts)
            if action == "label":
                return await self._label(victim, context, attempts)
            return Outcome("error", 0, f"unknown action {action!r}")
        except ApiException as exc:
            return await self._write_failed(exc, victim, attempts[0], resumed=resumed)
        except _NETWORK_ERRORS as exc:
            return Outcome("error", attempts[0], f"{action} failed: {_describe(exc)}")

    async def _write_failed(
        self, exc: ApiException, victim: VictimRecord, attempts: int, *, resumed: bool
    ) -> Outcome:
        if exc.status == 404:
            return Outcome("done" if resumed else "already-gone", attempts, "gone before the write")
        if exc.status in (409, 422):
            # A precondition failed (or the uid in the patch was refused): find out why.
            try:
                pod = await self._get(victim["namespace"], victim["name"])
            except (ApiException, *_NETWORK_ERRORS) as read_exc:
                return Outcome("error", attempts, f"conflict, then read failed: {_describe(read_exc)}")
            found = _classify(pod, victim, resumed=resumed)
            if found is not None:
                return Outcome(found.result, attempts, found.message)
        return Outcome("error", attempts, f"{victim['action']} failed: {_describe(exc)}")

    async def _evict(self, victim: VictimRecord, attempts: list[int]) -> Outcome:
        namespace, name = victim["namespace"], victim["name"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": victim["uid"]}},
        }
        backoff = Backoff(self.retry.eviction_backoff_initial_s, self.retry.eviction_backoff_max_s)
        while True:
            attempts[0] += 1
            try:
                await self._write("evict", "POST", _pod_path(namespace, name) + "/eviction", body)
                return Outcome("done", attempts[0])
            except ApiException as exc:
                answer = Answer.of(exc)
                if answer.multiple_pdbs:
                    return Outcome("blocked-by-pdb", attempts[0], answer.message)
                if not answer.pdb_blocked:
                    raise
                if attempts[0] >= self.retry.eviction_attempts:
                    return Outcome("blocked-by-pdb", attempts[0], answer.pdb_cause)
            await asyncio.sleep(self._wait(backoff, answer))

    async def _delete(
        self,
        victim: VictimRecord,
        pod: dict[str, Any],
        context: Context,
        attempts: list[int],
        gate: Gate,
        before_write: Callable[[], Awaitable[None]],
    ) -> Outcome:
        """DisruptionTarget=True (while the preemptor is nominated), then the delete (once it is)."""
        marked = False
        # A delivery of this decision cut short after its mark (a lost Lease, a stop, a crash)
        # left the mark: it is ours to withdraw as much as one this delivery writes.
        ours = _marked_by(pod, context.decision_id)
        if not _disruption_target(pod):
            self.guard()  # before the ledger says "pending": a non-leader must not leave that mark
            await before_write()
            await self._condition(
                victim, status="True", reason=PREEMPTION_REASON, message=_mark_message(context.decision_id)
            )
            marked = ours = True
        refused = await gate.nominated()
        if refused is not None:
            if not ours:
                return Outcome("error", 0, f"{refused}: {UNTOUCHED}")
            return await self._withdraw(victim, context, refused)
        if not marked:
            self.guard()
            await before_write()
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        options: dict[str, Any] = {
            "preconditions": {"uid": victim["uid"]},
            "gracePeriodSeconds": DEFAULT_GRACE_PERIOD_S if grace is None else grace,
        }
        if self.dry_run:
            # A DELETE with a body reads its options from the body alone: the server ignores
            # ?dryRun=All then, and a "dry run" would start the pod's graceful deletion.
            options["dryRun"] = ["All"]
        attempts[0] += 1
        await self._write("delete", "DELETE", _pod_path(victim["namespace"], victim["name"]), options)
        return Outcome("done", attempts[0])

    async def _condition(self, victim: VictimRecord, *, status: str, reason: str, message: str) -> None:
        """Set the victim's DisruptionTarget condition (a strategic merge: by type), while its uid holds."""
        patch = {
            "metadata": {"uid": victim["uid"]},
            "status": {
                "conditions": [
                    {
                        "type": DISRUPTION_TARGET,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": kube.rfc3339(kube.now().replace(microsecond=0)),
                    }
                ]
            },
        }
        path = _pod_path(victim["namespace"], victim["name"]) + "/status"
        await self._write("patch-status", "PATCH", path, patch, content_type=kube.STRATEGIC_MERGE_PATCH)

    async def _withdraw(self, victim: VictimRecord, context: Context, refused: str) -> Outcome:
        """The nomination failed after this victim was marked: not deleted, and the mark is
        set False (what kube-controller-manager's disruption controller does to a stale one)."""
        message = f"{COMPONENT}: preemption withdrawn: {refused} (decision {context.decision_id})"
        try:
            await self._condition(victim, status="False", reason=WITHDRAWN_REASON, message=message)
        except (ApiException, *_NETWORK_ERRORS) as exc:
            why = f"withdrawing DisruptionTarget failed: {_describe(exc)}"
            return Outcome("error", 0, f"{refused}: not deleted; {why}")
        return Outcome("error", 0, f"{refused}: not deleted, DisruptionTarget withdrawn")

    async def _label(self, victim: VictimRecord, context: Context, attempts: list[int]) -> Outcome:
        patch = {"metadata": {"uid": victim["uid"], **soft_eviction(context)["metadata"]}}
        attempts[0] += 1
        path = _pod_path(victim["namespace"], victim["name"])
        await self._write("label", "PATCH", path, patch, content_type=kube.STRATEGIC_MERGE_PATCH)
        return Outcome("done", attempts[0])

    # ---- the preemptor ---------------------------------------------------------------

    async def nominate(
        self,
        member: str,
        node: str,
        *,
        uid: str | None,
        scope: tuple[str, ...] | None = None,
        checked: Callable[[], None] = lambda: None,
    ) -> Nomination:
        """Set status.nominatedNodeName on a preemptor (or a job member).

        With the preemptor's uid (a single-pod decision), a preemptor that is gone,
        recreated or already bound stops the decision: evicting for it would free
        capacity nobody asked for. A preemptor of a scheduler outside `scope` stops
        it whatever the decision: another scheduler decides for it (two deciders
        would evict twice). `checked` is called once the preemptor was read and none
        of that holds, just before the nomination is written.
        """
        namespace, _, name = member.partition("/")
        try:
            pod = await self._get(namespace, name)
        except (ApiException, *_NETWORK_ERRORS) as exc:
            return Nomination("error", proceed=True, message=f"reading {member} failed: {_describe(exc)}")
        stop = self._refusal(member, pod, uid=uid, scope=scope)
        if stop is not None:
            return stop
        checked()
        # A JSON patch whose tests the server checks on the pod it writes: the uid and "not
        # bound" hold at the write, not only at the read (the scheduler name cannot change).
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []
        ops += [
            {"op": "test", "path": "/spec/nodeName", "value": None},  # absent, to the API server
            {"op": "add", "path": "/status/nominatedNodeName", "value": node},
        ]
        try:
            path = _pod_path(namespace, name) + "/status"
            await self._write("nominate", "PATCH", path, ops, content_type=kube.JSON_PATCH)
        except ApiException as exc:
            if exc.status in (404, 409, 422):  # gone, or a test failed: read again to say which
                try:
                    pod = await self._get(namespace, name)
                except (ApiException, *_NETWORK_ERRORS):
                    pod = None
                found = self._refusal(member, pod, uid=uid, scope=scope)
                if found is not None:
                    return found
            return Nomination("error", proceed=True, message=f"nominating {member} failed: {_describe(exc)}")
        except _NETWORK_ERRORS as exc:
            return Nomination("error", proceed=True, message=f"nominating {member} failed: {_describe(exc)}")
        return Nomination("done", proceed=True)

    async def read_preemptor(self, member: str) -> tuple[dict[str, Any] | None, str | None]:
        """The preemptor (or a job member) as the server has it (None: gone), or why it could not
        be read. The actuator checks it, and its victims against it, before any write."""
        namespace, _, name = member.partition("/")
        try:
            return await self._get(namespace, name), None
        except (ApiException, *_NETWORK_ERRORS) as exc:
            return None, f"reading {member} failed: {_describe(exc)}"

    @staticmethod
    def _refusal(
        member: str, pod: dict[str, Any] | None, *, uid: str | None, scope: tuple[str, ...] | None
    ) -> Nomination | None:
        """Why the preemptor as read must not be nominated, or None."""
        if pod is None:
            return Nomination("gone", proceed=uid is None, message=f"preemptor {member} is gone")
        if uid and (pod.get("metadata") or {}).get("uid") != uid:
            return Nomination("recreated", proceed=False, message=f"preemptor {member} was recreated")
        spec = pod.get("spec") or {}
        scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
        if scope is not None and scheduler not in scope:
            return Nomination(
                "out-of-scope",
                proceed=False,
                message=f"preemptor {member} is {scheduler}'s, not of {', '.join(scope)}",
            )
        if spec.get("nodeName"):
            bound = f"preemptor {member} is already bound to {spec['nodeName']}"
            return Nomination("bound", proceed=uid is None, message=bound)
        if spec.get("preemptionPolicy") == NEVER:
            # Admission copies the PriorityClass's policy into the pod: the live pod says it all.
            return Nomination(
                "error",
                proceed=False,
                message=f"preemptor {member} has preemptionPolicy {NEVER}: it may not preempt",
                reason="may-not-preempt",
            )
        return None

    # ---- Events ----------------------------------------------------------------------

    async def post_event(self, victim: VictimRecord, context: Context, outcome: Outcome) -> None:
        """An events.k8s.io/v1 Event on the victim; failures are logged and counted, never raised.

        (NotLeader is raised: a deposed actuator writes nothing, Events included.)
        """
        preemptor = context.preemptor_uid or context.preemptor
        if outcome.result == "done":
            reason, event_type = EVENT_REASON, "Normal"
            note = f"Preempted by pod {preemptor} on node {context.node}"
        elif outcome.result == "blocked-by-pdb":
            reason, event_type = EVENT_BLOCKED_REASON, "Warning"
            note = f"Preemption by pod {preemptor} on node {context.node} blocked: {outcome.message}"
        else:
            return
        body: Any = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": event_name(victim["name"], context.decision_id, victim["uid"]),
                "namespace": victim["namespace"],
                "annotations": {DECISION_ANNOTATION: context.decision_id},
            },
            "eventTime": kube.micro_time(kube.now()),
            "reportingController": COMPONENT,
            # The tail: a pod name's unique part (the ReplicaSet hash and suffix) is at its end.
            "reportingInstance": self.identity[-REPORTING_INSTANCE_LIMIT:],
            "action": EVENT_ACTION,
            "reason": reason,
            "type": event_type,
            "note": truncate(note),
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": victim["namespace"],
                "name": victim["name"],
                "uid": victim["uid"],
            },
        }
        namespace, _, name = context.preemptor.partition("/")
        if context.preemptor_uid and name:
            body["related"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": context.preemptor_uid,
            }
        try:
            path = f"/apis/events.k8s.io/v1/namespaces/{quote(victim['namespace'], safe='')}/events"
            await self._write("event", "POST", path, body)
        except ApiException as exc:
            if exc.status != 409:  # 409: posted before a restart
                EVENT_FAILURES.inc()
                log.warning("Event on %s/%s failed: %s", victim["namespace"], victim["name"], _describe(exc))
        except _NETWORK_ERRORS as exc:
            EVENT_FAILURES.inc()
            log.warning("Event on %s/%s failed: %s", victim["namespace"], victim["name"], _describe(exc))


# ---- what the live objects must say before a victim is touched ------------------------------


def preemptor_refusal(
    member: str,
    pod: dict[str, Any] | None,
    *,
    uid: str,
    scope: tuple[str, ...] | None,
    flow: str,
) -> Nomination | None:
    """Why the live preemptor (or job member) may not have a decision's victims, or None.

    It must exist with the decision's uid, be unbound, of a scheduler in `scope`, and not
    `preemptionPolicy: Never`; a DaemonSet-flow preemptor (whose victims may be of its own
    priority) must be a DaemonSet's pod.
    """
    refusal = Actions._refusal(member, pod, uid=uid, scope=scope)
    if refusal is not None:
        return Nomination(refusal.result, False, refusal.message, refusal.reason or refusal.result)
    assert pod is not None  # _refusal refuses a missing pod
    if flow == "daemonset" and not any(
        isinstance(o, dict) and o.get("kind") == "DaemonSet"
        for o in (pod.get("metadata") or {}).get("ownerReferences") or ()
    ):
        message = f"preemptor {member} is not a DaemonSet's pod, and the decision's flow is daemonset"
        return Nomination("error", False, message, "not-a-daemonset-pod")
    return None


def live_priority(pod: dict[str, Any]) -> int:
    """A pod's priority as kube-scheduler reads it (corev1helpers.PodPriority): spec.priority,
    which admission sets from the PriorityClass, else 0."""
    priority = (pod.get("spec") or {}).get("priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def victim_problem(
    victim: VictimRecord, pod: dict[str, Any], *, below: int, or_equal: bool, nodes: frozenset[str]
) -> tuple[str, str] | None:
    """Why the live victim may not be taken for a preemptor of priority `below` going to `nodes`
    ((reason, message)), or None. Lower priority than the preemptor (or equal, `or_equal`: the
    DaemonSet flow), and bound to one of the decision's nodes."""
    where = f"{victim['namespace']}/{victim['name']}"
    priority = live_priority(pod)
    if priority > below or (priority == below and not or_equal):
        relation = "at most" if or_equal else "below"
        return (
            "victim-priority",
            f"victim {where} has priority {priority}, not {relation} the preemptor's {below}",
        )
    node = (pod.get("spec") or {}).get("nodeName")
    if node not in nodes:
        said = f"on node {node}" if node else "not bound to a node"
        return "victim-node", f"victim {where} is {said}, not on {', '.join(sorted(nodes))}"
    return None


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def _mark_message(decision_id: str) -> str:
    """The DisruptionTarget message of this actuator's mark: it names the decision."""
    return f"{COMPONENT}: preempting to accommodate a higher priority pod (decision {decision_id})"


def _marked_by(pod: dict[str, Any], decision_id: str) -> bool:
    """DisruptionTarget=True with the message this decision's mark carries."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(
        isinstance(c, dict)
        and c.get("type") == DISRUPTION_TARGET
        and c.get("status") == "True"
        and c.get("message") == _mark_message(decision_id)
        for c in conditions
    )


def _disruption_target(pod: dict[str, Any]) -> bool:
    """DisruptionTarget=True already (a crash after our mark, or kube-scheduler's): not again."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(
        isinstance(c, dict) and c.get("type") == DISRUPTION_TARGET and c.get("status") == "True"
        for c in conditions
    )


def _classify(pod: dict[str, Any] | None, victim: VictimRecord, *, resumed: bool) -> Outcome | None:
    """The outcome the pod's current state already settles, or None when we must act."""
    where = f"{victim['namespace']}/{victim['name']}"
    if pod is None:
        return Outcome("done" if resumed else "already-gone", 0, f"{where} not found")
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if uid != victim["uid"]:
        if resumed:  # our earlier delete took effect and a controller recreated the name
            return Outcome("done", 0, f"{where} recreated as uid {uid} after our action")
        return Outcome("uid-changed", 0, f"{where} is now uid {uid}, not {victim['uid']}")
    if meta.get("deletionTimestamp") is not None:
        return Outcome("done" if resumed else "already-terminating", 0, f"{where} is terminating")
    return None


def soft_eviction(context: Context) -> dict[str, Any]:
    """The merge patch of a `label` victim: the label, and the detail as an annotation (docs/semantics.md)."""
    detail = json.dumps(
        {
            "preemptJob": context.job,
            "preemptor": context.trigger or context.preemptor,
            "decisionId": context.decision_id,
            "reason": context.reason,
        },
        sort_keys=True,
    )
    return {"metadata": {"labels": {SOFT_EVICTION: "true"}, "annotations": {SOFT_EVICTION: detail}}}


def truncate(message: str, limit: int = EVENT_MESSAGE_LIMIT) -> str:
    """At most `limit` UTF-8 bytes (what the server counts), cut on a character boundary."""
    encoded = message.encode()
    if len(encoded) <= limit:
        return message
    return encoded[: limit - 3].decode(errors="ignore") + "..."


def event_name(pod_name: str, decision_id: str, uid: str) -> str:
    """Deterministic per (decision, victim): a repeated post is a 409, not a second Event.

    A long pod name is cut to make room for the suffix; a cut ending in '-' or '.' would end
    a DNS label with it, and the server refuses such a name (422).
    """
    suffix = hashlib.sha256(f"{decision_id}\x00{uid}".encode()).hexdigest()[:16]
    return f"{pod_name[: _NAME_LIMIT - len(suffix) - 1].rstrip('-.')}.{suffix}"


def _describe(exc: BaseException) -> str:
    answer = Answer.of(exc)
    return f"{answer.status} {answer.message}" if answer.status else answer.message
