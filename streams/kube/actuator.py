"""The actuator: consume decisions, act on their victims, write one outcome per (decision, victim).

This module owns a decision record's path through the actuator:
1. Decode and verify. Malformed records, records whose hash does not match
   their content, and, when signing keys are configured (streams.common.signing),
   unsigned ones, forged ones and ones signed with a key that is not (or no
   longer) accepted go to preemption.dead-letter unchanged, with their origin
   and the reason.
2. Decisions of other clusters are skipped; only `preempt` decisions act.
3. The preemptor is nominated (a preemptor of a scheduler outside `--scheduler-name`,
   gone, recreated or already bound refuses the decision: no victim is touched) and
   the victims are acted on, VICTIM_CONCURRENCY at a time, in step with it
   (streams.kube.eviction.Gate: read while the preemptor is read, marked
   DisruptionTarget while it is nominated, deleted once it is; streams.kube.eviction
   holds every Kubernetes edge case), and exactly one outcome per (decision id,
   victim uid) is written to preemption.evictions, keyed by victim uid. The
   ledger (streams.kube.ledger) plus the evictions topic read back at start make
   "exactly one" hold across redeliveries, rebalances and restarts.
4. Every decision about a pending preemptor puts an Event on it (streams.kube.preemptor_events;
   a `preempt` decision once its victims are acted on).
5. One OUTCOME event for the whole decision goes to preemption.cluster-events,
   keyed by cluster: the worker folds it (a victim not acted on is not leaving, a
   refused nomination ends), so its view matches what happened and `replay`
   reproduces it. A redelivered decision writes it again; folding it is idempotent.
6. The decision's offset is committed only once all its outcomes are written,
   so a crash at any point redelivers the decision and the ledger skips what
   was done.
Only the Lease holder writes to the cluster (streams.kube.lease); a dry-run
actuator writes nothing real, takes no Lease, and keeps its own consumer group
and its own outcomes (marked dryRun) apart from the real actuator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Counter

from engine import timeutil
from schemas import VERSION, chain, cloudevent, decisions, records
from schemas.records import (
    CLUSTER_EVENTS,
    DEAD_LETTER,
    DECISIONS,
    EVICTIONS,
    DecisionRecord,
    EvictionRecord,
    VictimRecord,
)
from streams.common import health, logs, signing
from streams.common.backoff import Backoff
from streams.kafka import connection, deadletter
from streams.kafka import topics as topics_mod
from streams.kafka.deadletter import Origin
from streams.kafka.sink import RecordSink
from streams.kube import api as kube
from streams.kube import component, eviction, lease
from streams.kube.ledger import Ledger, nomination_subject
from streams.kube.preemptor_events import PreemptorEvents

log = logging.getLogger(__name__)

ACTIONS = ("delete", "evict", "label")
# How long one poll waits for decisions before checking the Lease and the stop flag.
POLL_TIMEOUT_MS = 500
# Victims of one decision acted on at once: a decision's evictions are independent, so
# the preemptor waits for the slowest one rather than their sum; the bound keeps a
# many-victim decision (a gang's) from flooding the API server with writes at once.
VICTIM_CONCURRENCY = 8
# How long the broker may hold a fetch for decisions that are not there yet. A decision is
# on a preemptor's critical path: the embedded tansu answers a fetch only when this runs
# out, even when a record arrives meanwhile (measured: 30-170 ms of a 0.2-0.3 s bind at
# aiokafka's 500 ms; a median 29 ms from the decision record to the actuator's first API
# call at 50 ms), while Kafka answers at once either way. At 10 ms a delivery waits ~5 ms;
# the price is up to 100 empty fetches a second while idle: 6.1% of a core on tansu and
# 4.7% on Apache Kafka, against 0.35-0.40% at 500 ms (docs/performance.md). Apache Kafka
# answers a fetch as soon as a record arrives, so there a long wait costs no latency: the
# chart, which deploys against Kafka, passes --fetch-max-wait-ms 500.
FETCH_MAX_WAIT_MS = 10
# Above this a fetch wait delays noticing a lost Lease or a stop (the poll loop checks both
# between fetches) by more than the poll timeout does.
MAX_FETCH_MAX_WAIT_MS = 500
# Decisions handled per poll; each may take seconds (PDB retries), and the group
# must hear from us within max.poll.interval.ms, so take few at a time.
MAX_POLL_RECORDS = 10
# Superseding looks past the batch being handled when more decisions wait behind it: a
# second, group-less reader reads on to the log's end, at most this many records a poll, so
# a decision with a later one for its preemptor waiting anywhere behind it is refused, not
# only one fetched in the same batch of MAX_POLL_RECORDS. Each is verified once more (an
# Ed25519 check is ~0.1 ms): the bound keeps one poll of a far-behind actuator under a second.
LOOKAHEAD_MAX_RECORDS = 5_000
# How long the look-ahead waits for records it knows are there (the log's end) before giving
# up for this poll: a slow fetch delays acting on the batch by at most this.
LOOKAHEAD_FETCH_TIMEOUT_MS = 200
# aiokafka's default; the embedded tansu makes a group join wait about half of it
# (docs/architecture.md §6), so tests pass a shorter one.
SESSION_TIMEOUT_MS = 10_000
# Stopping (SIGTERM), the consumer's close, which leaves the group, may take this long. While
# its group is rebalancing on a slow broker the close waits for the rejoin to settle: 30 s and
# more after SIGTERM under load (issue 19), past what a kubelet grants. Offsets are committed
# per decision, so nothing is lost by not waiting: the broker drops the member after its
# session timeout.
CONSUMER_CLOSE_TIMEOUT_S = 5.0
# After SIGTERM, the decision in hand and the consumer's close get this long; then whatever is
# still awaited is cancelled (a crash's recovery covers a decision cut short: the ledger's
# pending marks, the outcomes read back by the next leader). Any await of the consume loop can
# outlast a kubelet's grace on a slow broker: a woken (SIGCONT) leader sat in aiokafka's group
# join at SIGTERM and never exited (issue 22). With the Lease's release after it (two writes of
# api.WRITE_TIMEOUT_S at most), the process exits within the chart's 60 s grace.
STOP_TIMEOUT_S = 15.0
# Reading the evictions topic back at start gives up waiting for records that
# the broker reported but never delivered after this long (a broker fault).
READ_BACK_TIMEOUT_S = 60.0
READ_BACK_POLL_MS = 200
# One last poll past the reported end offsets: the embedded tansu reports a
# partition's end short by its last record batch (docs/architecture.md §6), and an outcome
# missed there would be written a second time.
READ_BACK_TAIL_MS = 300

# Namespaces whose pods are never victims, whatever a decision says (--protected-namespaces):
# kube-system holds what the cluster itself runs on (DNS, the network, kube-proxy).
DEFAULT_PROTECTED_NAMESPACES = ("kube-system",)
# Victims one decision may name (--max-victims): a decision naming more is refused whole. A
# real decision names the few pods that make room on one node (a gang's, on a few nodes).
DEFAULT_MAX_VICTIMS = 100

# A `preempt` decision whose own `ts` is older than this against the actuator's clock is refused
# (--max-decision-age): the cluster it was decided on has moved on since. The worker stamps a
# decision with the time of the event that led to it; a few minutes covers a worker catching up
# on a short backlog and the clocks' skew, not an old decision re-produced into the topic.
DEFAULT_MAX_DECISION_AGE_S = 300.0

# What the actuator does with the API, for the chart's RBAC (a test keeps them equal).
REQUIRED_RBAC: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "pods", ("get", "delete", "patch")),
    ("", "pods/eviction", ("create",)),
    ("", "pods/status", ("patch",)),
    ("events.k8s.io", "events", ("create",)),
)
# Namespaced to the release: the Lease lives beside the actuator.
REQUIRED_LEASE_RBAC: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
)

DECISIONS_SEEN = Counter(
    "preemptctl_actuator_decisions_total", "Decision records handled, by outcome.", ["outcome"]
)
OUTCOMES = Counter(
    "preemptctl_actuator_outcomes_total",
    "Outcomes written, by cluster, action and result.",
    ["cluster", "action", "result"],
)
DUPLICATES = Counter(
    "preemptctl_actuator_duplicates_total", "Victims skipped because their outcome was already written."
)
NOMINATIONS = Counter(
    "preemptctl_actuator_nominations_total", "Preemptor nominations, by result.", ["result"]
)
OTHER_CLUSTERS = Counter("preemptctl_actuator_other_cluster_total", "Decisions for other clusters, skipped.")
REFUSED = Counter(
    "preemptctl_actuator_refused_total",
    "Preempt decisions refused before any victim was touched, by reason.",
    ["reason"],
)
FAILED = Counter(
    "preemptctl_actuator_failed_records_total",
    "Decision records whose handling raised (a bug, or an unforeseen record), dead-lettered, by error class.",
    ["error_class"],
)


# ---- refusing input -----------------------------------------------------------------


class Refused(Exception):
    """A decision record the actuator will not act on; it goes to the dead-letter topic."""


class MalformedDecision(Refused):
    """Not a decision record of a known version and shape."""


class TamperedDecision(Refused):
    """The record's hash does not match its content: it was changed after it was sealed."""


class UnsignedDecision(Refused):
    """No signature while signing keys are configured."""


class ForgedDecision(Refused):
    """A signature that does not verify with the key it names (or, naming none, with any accepted key)."""


class UnacceptedKey(Refused):
    """Signed with a key id the actuator does not accept: a retired key, or one never issued to it."""


class OutOfChain(Refused):
    """The record does not continue its cluster's chain from the last record accepted: its
    `prevHash` is not that record's hash, or its `seq` goes back (a replay, a fork)."""


@dataclass(frozen=True)
class Freshness:
    """What the actuator checks of a decision's place in its cluster's chain and in time.

    - chain: each record of the cluster must link to the last one accepted (`prevHash` is its
      `hash`) and not go back (`seq` not below), else it is dead-lettered (OutOfChain). The head
      is kept in the ledger. The one exception is the first record of the cluster after a start
      or a (re)start of consuming: the records before it may have been handled by another
      actuator (the Lease moved) or its head line lost with the machine, so it must only not go
      back. A redelivery of the last record accepted, or of an earlier one whose every victim's
      outcome is recorded, is handled as before (idempotently), never dead-lettered.
    - max_age_s: a `preempt` whose `ts` is older than this against `clock` is refused (None: off).
    - supersede: a `preempt` for a preemptor the actuator has seen a later decision for (a higher
      `seq`: handled, fetched with it, or waiting anywhere behind it in the log: `LookAhead`) is
      refused.
    A decision already started (a victim or nomination in the ledger) is carried on whatever its
    age: its first delivery passed these checks.
    """

    chain: bool = True
    max_age_s: float | None = DEFAULT_MAX_DECISION_AGE_S
    supersede: bool = True
    clock: Callable[[], float] = field(default=time.time, compare=False)


# What handle() lets through to the consume loop, which retries: a lost Lease, a broker or
# network failure. Anything else a record makes it raise dead-letters that record.
INFRASTRUCTURE: tuple[type[BaseException], ...] = (
    lease.NotLeader,
    KafkaError,
    OSError,
    TimeoutError,
    connection.BrokerUnavailable,
)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise MalformedDecision(message)


def verify(
    value: bytes,
    *,
    hmac_key: bytes | None = None,
    keys: signing.Keyring | None = None,
    key_id: str | None = None,
) -> DecisionRecord:
    """Parse and check one decision record; a Refused subclass says why it is refused.

    `keys` are the accepted signing keys (`hmac_key`: one, of any id), `key_id` the
    signing key the record's header names (signing.KEY_ID_HEADER), if any.
    """
    if keys is None and hmac_key is not None:
        keys = signing.Keyring({signing.ANY_KEY_ID: hmac_key})
    try:
        record = records.decode(value)
    except records.DecodeError as exc:
        raise MalformedDecision(str(exc)) from exc
    problem = decisions.schema_problem(record)  # what a decision record is: schemas.decisions
    _require(problem is None, str(problem))
    if chain.digest(record["prevHash"], record) != record["hash"]:
        raise TamperedDecision("hash does not match the record's content")
    if keys is not None:
        sig = record.get("sig")
        if not isinstance(sig, str):
            raise UnsignedDecision("no signature, and signing keys are configured")
        accepted = keys.key_ids()
        if key_id is not None and key_id not in accepted and signing.ANY_KEY_ID not in accepted:
            raise UnacceptedKey(
                f"signed with key {key_id!r}, which is not accepted (accepted: {', '.join(accepted)}): "
                "a retired key, or one never issued"
            )
        wanted = None if signing.ANY_KEY_ID in accepted else key_id
        if signing.verify_with(keys, wanted, record["hash"], sig) is None:
            named = f"key {key_id!r}" if wanted is not None else "any accepted key"
            raise ForgedDecision(f"signature does not verify with {named}")
    problem = decisions.shape_problem(record)  # after the signature: a forged record is refused as such
    _require(problem is None, str(problem))
    return cast(DecisionRecord, record)


@dataclass(frozen=True)
class Topics:
    """The topics the actuator reads and writes (tests use fresh names on a shared broker)."""

    decisions: str = DECISIONS
    evictions: str = EVICTIONS
    dead_letter: str = DEAD_LETTER
    cluster_events: str = CLUSTER_EVENTS  # where OUTCOME events go

    @classmethod
    def of(cls, names: topics_mod.Names) -> Topics:
        return cls(names.decisions, names.evictions, names.dead_letter, names.cluster_events)


# ---- the actuator -------------------------------------------------------------------


class Actuator:
    """Handles decision records one at a time; the Kafka loop around it is `consume`."""

    def __init__(
        self,
        actions: eviction.Actions,
        sink: RecordSink,
        ledger: Ledger,
        *,
        cluster: str = records.DEFAULT_CLUSTER,
        hmac_key: bytes | None = None,
        keys: signing.Keyring | None = None,
        elector: lease.LeaseElector | None = None,
        topics: Topics = Topics(),
        scope: tuple[str, ...] | None = None,
        preemptor_events: PreemptorEvents | None = None,
        protected_namespaces: Iterable[str] = DEFAULT_PROTECTED_NAMESPACES,
        max_victims: int = DEFAULT_MAX_VICTIMS,
        freshness: Freshness | None = None,
        fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
    ) -> None:
        self.topics = topics
        # None: no chain, age or superseding check (the Python API's default; the command's is on).
        self.freshness = freshness
        self.fetch_max_wait_ms = fetch_max_wait_ms
        # Clusters whose next record must link to the head (not after a start or a resume).
        self._linked: set[str] = set()
        # (cluster, preemptor) -> the highest seq of a verified decision seen for it.
        self._latest: dict[tuple[str, str], int] = {}
        self.protected_namespaces = frozenset(protected_namespaces)
        self.max_victims = max_victims
        self._preemptor_events = preemptor_events
        self.scope = scope  # the schedulers whose preemptors it acts for (None: any)
        # Each (decision id, victim uid)'s result, written or read back: a redelivered
        # decision's OUTCOME event says what was done the first time.
        self._results: dict[tuple[str, str], str] = {}
        self._actions = actions
        self._sink = sink
        self._ledger = ledger
        self._cluster = cluster
        # `hmac_key`: one accepted key of any id (tests, and the one-key form of before key ids).
        self._keys = (
            keys if keys is not None or hmac_key is None else signing.Keyring({signing.ANY_KEY_ID: hmac_key})
        )
        self._elector = elector
        self.health: health.Health | None = None  # unready while no signing key is accepted

    @property
    def dry_run(self) -> bool:
        return self._actions.dry_run

    def accepting(self) -> bool:
        """False while signing keys are configured but none is accepted (an emptied keys Secret)."""
        return self._keys is None or not self._keys.empty()

    # ---- recovery ------------------------------------------------------------------

    def recover(self, values: Iterable[bytes | None]) -> int:
        """Mark every outcome found in the evictions topic as recorded; return how many were ours."""
        count = 0
        for value in values:
            try:
                outcome = records.decode(value or b"")
                key = (str(outcome["decisionId"]), str(outcome["victim"]["uid"]))
                cluster, dry = outcome.get("cluster"), bool(outcome.get("dryRun"))
            except (records.DecodeError, KeyError, TypeError):
                continue  # not an outcome we could have written
            # A dry run's outcomes never stand in for real ones, nor the other way round.
            if cluster == self._cluster and dry == self.dry_run:
                self._ledger.note_recorded(key)
                self._results[key] = str(outcome.get("result"))
                count += 1
        return count

    # ---- one decision --------------------------------------------------------------

    async def handle(
        self,
        value: bytes,
        *,
        key: bytes | None,
        origin: Origin,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> list[EvictionRecord]:
        """Act on one decision record; returns the outcomes written (none for a duplicate).

        Whatever the record makes it raise, other than a lost Lease or a broker or network
        failure (the consume loop's to retry), dead-letters the record with the reason: one
        record never stops the actuator, and the decisions behind it are not held up.
        """
        try:
            return await self._handle(value, key=key, origin=origin, headers=headers)
        except INFRASTRUCTURE:
            raise
        except Exception as exc:
            log.exception(
                "decision %s[%d]@%d could not be handled", origin.topic, origin.partition, origin.offset
            )
            FAILED.labels(type(exc).__name__).inc()
            await self._dead_letter(value, key, origin, exc)
            return []

    async def _handle(
        self,
        value: bytes,
        *,
        key: bytes | None,
        origin: Origin,
        headers: Sequence[tuple[str, bytes]],
    ) -> list[EvictionRecord]:
        try:
            decision = verify(value, keys=self._keys, key_id=_key_id(headers))
        except Refused as exc:
            await self._dead_letter(value, key, origin, exc)
            return []
        if decision["cluster"] != self._cluster:
            OTHER_CLUSTERS.inc()
            return []
        if self.freshness is not None:
            try:
                self._continue_chain(decision)
            except OutOfChain as exc:
                await self._dead_letter(value, key, origin, exc)
                return []
            self._seen(decision)
        DECISIONS_SEEN.labels(decision["outcome"]).inc()
        if decision["outcome"] != "preempt" or not decision["victims"]:
            await self._announce(decision)
            return []
        if self._done(decision):
            DUPLICATES.inc(len(decision["victims"]))  # a redelivery: no API call at all
            await self._write_outcome(decision, "done", "")
            return []
        refusal = self._stale(decision) or self._refusal(decision)
        if refusal is not None:
            return await self._refuse(decision, *refusal)
        context = _context(decision)
        # The preemptor's nomination and the victims go together: each victim is read while the
        # preemptor is, every one is checked against the live preemptor before any is written
        # to, a victim is marked DisruptionTarget while the preemptor is nominated and deleted
        # once it is (eviction.Gate), and no victim is touched for a preemptor that no longer
        # needs it or may not have it.
        gate = eviction.Gate(victims=len(decision["victims"]))
        limit = asyncio.Semaphore(VICTIM_CONCURRENCY)
        written: list[EvictionRecord] = []
        try:
            async with asyncio.TaskGroup() as group:  # one failing (a lost Lease) cancels the rest
                nominating = group.create_task(self._nominate(decision, gate))
                for victim in decision["victims"]:
                    group.create_task(self._victim(decision, victim, context, gate, limit, written))
        except BaseExceptionGroup as failed:
            # The first failure as itself, so the consume loop tells a lost Lease or a broker
            # error apart as before; the decision is not committed and comes again.
            raise failed.exceptions[0] from failed
        nomination, stop = nominating.result()
        order = {v["uid"]: i for i, v in enumerate(decision["victims"])}
        written.sort(key=lambda r: order[r["victim"]["uid"]])
        await self._write_outcome(decision, nomination, stop or "")
        await self._ledger.sync()  # one fsync for the decision's lines, off its preemptor's critical path
        if stop is None:
            await self._announce(decision)
        return written

    # ---- freshness -------------------------------------------------------------------

    def _done(self, decision: DecisionRecord) -> bool:
        """Every victim's outcome is recorded: a redelivery, nothing left to do."""
        victims = decision["victims"]
        return bool(victims) and all(self._ledger.recorded((decision["id"], v["uid"])) for v in victims)

    def _started(self, decision: DecisionRecord) -> bool:
        """A victim or a nomination of the decision is in the ledger: acted on before a crash."""
        subjects = [v["uid"] for v in decision["victims"]]
        members = decision.get("placements") or {decision["preemptor"]: ""}
        subjects += [nomination_subject(member) for member in members]
        return any(self._ledger.state((decision["id"], s)) is not None for s in subjects)

    def _continue_chain(self, decision: DecisionRecord) -> None:
        """Check the record continues its cluster's chain and make it the head; OutOfChain if not."""
        assert self.freshness is not None
        if not self.freshness.chain:
            return
        cluster, seq, digest = decision["cluster"], decision["seq"], decision["hash"]
        head = self._ledger.head(cluster)
        if head is not None and digest != head.hash:
            if seq < head.seq:
                if decision["outcome"] == "preempt" and self._done(decision):
                    return  # an earlier record redelivered (offsets reset): its outcomes stand
                raise OutOfChain(
                    f"seq {seq} goes back: the last record accepted for cluster {cluster} is seq "
                    f"{head.seq} ({head.hash[:16]}...): a replay of an old decision"
                )
            if decision["prevHash"] != head.hash and cluster in self._linked:
                raise OutOfChain(
                    f"prevHash {decision['prevHash'][:16]}... is not the hash of the last record "
                    f"accepted for cluster {cluster} (seq {head.seq}, {head.hash[:16]}...): a record "
                    "from another chain, or one was removed"
                )
        # The first record after a start with an empty ledger has nothing to link to: only the
        # age bound protects it (a PVC-backed --ledger-file keeps the head across restarts).
        self._ledger.set_head(cluster, seq, digest)  # before any write: a redelivery is known
        self._linked.add(cluster)

    def _seen(self, decision: DecisionRecord) -> None:
        key = (decision["cluster"], decision["preemptor"])
        self._latest[key] = max(self._latest.get(key, -1), decision["seq"])

    def note(self, values: Iterable[tuple[bytes, Sequence[tuple[str, bytes]]]]) -> None:
        """Note the decisions fetched together, before handling them: an earlier one for a
        preemptor with a later one among them is superseded (refused when handled)."""
        if self.freshness is None or not self.freshness.supersede:
            return
        head = self._ledger.head(self._cluster)
        if head is not None:  # below the head nothing can be superseded any more: forget it
            self._latest = {k: s for k, s in self._latest.items() if s > head.seq}
        for value, headers in values:
            try:
                decision = verify(value, keys=self._keys, key_id=_key_id(headers))
            except Exception:  # handled (and dead-lettered) in its turn
                continue
            if decision["cluster"] == self._cluster:
                self._seen(decision)

    def _stale(self, decision: DecisionRecord) -> tuple[str, str] | None:
        """Why a `preempt` not started yet is too old to act on ((reason, message)), or None."""
        fresh = self.freshness
        if fresh is None or self._started(decision):
            return None
        if fresh.max_age_s is not None:
            age_s = fresh.clock() - timeutil.parse(decision["ts"], field="ts") / timeutil.SECOND
            if age_s > fresh.max_age_s:
                return "stale", (
                    f"decided at {decision['ts']}, {age_s:.0f} s ago, more than the "
                    f"{fresh.max_age_s:g} s a decision may wait"
                )
        if fresh.supersede:
            latest = self._latest.get((decision["cluster"], decision["preemptor"]), -1)
            if latest > decision["seq"]:
                return "superseded", (
                    f"superseded by a later decision for {decision['preemptor']} (seq {latest})"
                )
        return None

    def _refusal(self, decision: DecisionRecord) -> tuple[str, str] | None:
        """Why the decision is refused before any API call ((reason, message)), or None."""
        victims = decision["victims"]
        if len(victims) > self.max_victims:
            return "too-many-victims", f"{len(victims)} victims, more than the {self.max_victims} allowed"
        protected = sorted({v["namespace"] for v in victims} & self.protected_namespaces)
        if protected:
            return "protected-namespace", f"victims in protected namespace(s) {', '.join(protected)}"
        placements = decision.get("placements")
        if placements:
            uids: dict[str, str] = cast(dict[str, Any], decision).get("memberUids") or {}
            missing = sorted(set(placements) - set(uids))
            if missing:
                return "no-uid", f"no uid for job member(s) {', '.join(missing[:5])}"
        elif not decision.get("node"):
            return "no-node", "a preempt decision without node or placements"
        elif not decision["preemptorUid"]:
            return "no-uid", f"no uid for preemptor {decision['preemptor']}"
        return None

    async def _refuse(self, decision: DecisionRecord, reason: str, message: str) -> list[EvictionRecord]:
        """Refuse the decision without an API call: each victim's outcome and the OUTCOME say why."""
        REFUSED.labels(reason).inc()
        log.warning("refusing decision %s: %s", decision["id"], message, extra=logs.decision_fields(decision))
        written: list[EvictionRecord] = []
        for victim in decision["victims"]:
            ledger_key = (decision["id"], victim["uid"])
            if self._ledger.recorded(ledger_key):
                DUPLICATES.inc()
                continue
            outcome = eviction.Outcome("error", 0, f"refused: {message}: {eviction.UNTOUCHED}")
            written.append(await self._record_outcome(decision, victim, outcome))
        await self._write_outcome(decision, "error", f"refused: {message}")
        await self._ledger.sync()
        return written

    async def _announce(self, decision: DecisionRecord) -> None:
        """The Event on the pending preemptor (streams.kube.preemptor_events), when configured."""
        if self._preemptor_events is not None:
            await self._preemptor_events.post(decision)

    async def _victim(
        self,
        decision: DecisionRecord,
        victim: VictimRecord,
        context: eviction.Context,
        gate: eviction.Gate,
        limit: asyncio.Semaphore,
        written: list[EvictionRecord],
    ) -> None:
        """Act on one victim (unless the decision is refused) and write its one outcome."""
        ledger_key = (decision["id"], victim["uid"])
        if self._ledger.recorded(ledger_key):
            DUPLICATES.inc()
            gate.read(victim, None)  # nothing to check: it is not written to again
            return

        async def before_write() -> None:
            # In the OS before the pod is written to: after a crash, "pending" says the write may
            # have happened. Made durable with the decision's other lines (Ledger.sync, below).
            self._ledger.mark_pending(ledger_key)

        outcome = await self._actions.act(
            victim,
            context,
            gate=gate,
            resumed=self._ledger.pending(ledger_key),
            before_write=before_write,
            limit=limit,
        )
        async with limit:
            await self._actions.post_event(victim, context, outcome)
        written.append(await self._record_outcome(decision, victim, outcome))

    async def _record_outcome(
        self, decision: DecisionRecord, victim: VictimRecord, outcome: eviction.Outcome
    ) -> EvictionRecord:
        """Write one victim's outcome to preemption.evictions and record it in the ledger."""
        ledger_key = (decision["id"], victim["uid"])
        record = self._outcome_record(decision, victim, outcome)
        if self._elector is not None:
            # After losing the Lease, the successor (which read the evictions topic when it
            # took over) writes this victim's one outcome; writing ours too could make two.
            self._elector.check()
        await self._sink.send(
            self.topics.evictions,
            records.encode(record),
            key=victim["uid"].encode(),
            headers=cloudevent.eviction_headers(record),  # CloudEvents binary mode (docs/topics.md)
        )
        self._ledger.mark_recorded(ledger_key)
        self._results[ledger_key] = outcome.result
        OUTCOMES.labels(decision["cluster"], victim["action"], outcome.result).inc()
        log.info(
            "%s %s/%s (%s): %s%s",
            victim["action"],
            victim["namespace"],
            victim["name"],
            decision["id"],
            outcome.result,
            f" ({outcome.message})" if outcome.message else "",
            extra=logs.decision_fields(decision, pod=f"{victim['namespace']}/{victim['name']}"),
        )
        return record

    async def _write_outcome(self, decision: DecisionRecord, nomination: str, message: str) -> None:
        """The OUTCOME event of one decision, into the cluster's log (a dry run changes nothing: none)."""
        if self.dry_run:
            return
        victims = {
            v["uid"]: self._results.get((decision["id"], v["uid"]), "done") for v in decision["victims"]
        }
        outcome: records.Outcome = {
            "decisionId": decision["id"],
            "preemptorUid": str(decision.get("preemptorUid") or ""),
            "nomination": nomination,
            "victims": victims,
        }
        if message:
            outcome["message"] = message
        event: records.ClusterEvent = {"ts": kube.rfc3339(kube.now()), "type": "OUTCOME", "outcome": outcome}
        value = records.encode_batch(self._cluster, [event])
        if self._elector is not None:
            self._elector.check()
        await self._sink.send(self.topics.cluster_events, value, key=self._cluster.encode())

    async def _nominate(self, decision: DecisionRecord, gate: eviction.Gate) -> tuple[str, str | None]:
        """Check the live preemptor (or every job member) and every victim against it, then
        nominate it, opening or closing `gate` for the victims: what nominating found, and why
        not to act on the victims, if so.

        Before any write: each member must exist with the decision's uid, unbound, in scope,
        able to preempt (eviction.preemptor_refusal); each victim still to be written to must
        be, live, of lower priority than the lowest member (DaemonSet flow: lower or equal) and
        on one of the decision's nodes (eviction.victim_problem). One failing refuses the whole
        decision: no victim is touched.
        """
        members = _members(decision)
        reads = await asyncio.gather(*(self._actions.read_preemptor(m) for m, _, _ in members))
        flow = decision["flow"]
        lowest: int | None = None
        for (member, _, uid), (pod, failed) in zip(members, reads, strict=True):
            if failed is not None:
                # Without the live preemptor its victims cannot be checked: nothing is touched
                # (the outcomes say error; the worker decides again).
                return self._stop(decision, gate, eviction.Nomination("error", False, failed, "read-failed"))
            refusal = eviction.preemptor_refusal(member, pod, uid=uid, scope=self.scope, flow=flow)
            if refusal is not None:
                return self._stop(decision, gate, refusal)
            assert pod is not None
            priority = eviction.live_priority(pod)
            lowest = priority if lowest is None else min(lowest, priority)
        assert lowest is not None  # a preempt decision has a member (_refusal)
        nodes = frozenset(node for _, node, _ in members)
        for victim, pod in await gate.victims_read():
            found = eviction.victim_problem(
                victim, pod, below=lowest, or_equal=flow == "daemonset", nodes=nodes
            )
            if found is not None:
                reason, message = found
                return self._stop(decision, gate, eviction.Nomination("error", False, message, reason))
        gate.check_passed()  # victims may be marked DisruptionTarget from now on
        result, done = "done", []
        for member, node, uid in members:
            ledger_key = (decision["id"], nomination_subject(member))
            if self._ledger.recorded(ledger_key):
                continue
            nomination = await self._actions.nominate(
                member, node, uid=uid, scope=self.scope, checked=gate.check_passed
            )
            NOMINATIONS.labels(nomination.result).inc()
            if nomination.result != "done":
                log.warning(
                    "nominating %s to %s: %s",
                    member,
                    node,
                    nomination.message,
                    extra=logs.decision_fields(decision, pod=member),
                )
                result = nomination.result
            if not nomination.proceed:
                # Not recorded: a redelivery checks again, so no victim of this decision is ever touched.
                return self._stop(decision, gate, nomination)
            if nomination.result != "error":  # an error is retried on redelivery
                done.append(ledger_key)
        gate.open()
        for ledger_key in done:
            self._ledger.mark_recorded(ledger_key)
        return result, None

    @staticmethod
    def _stop(
        decision: DecisionRecord, gate: eviction.Gate, refusal: eviction.Nomination
    ) -> tuple[str, str | None]:
        """Close the gate: no victim of the decision is touched; the OUTCOME says why."""
        REFUSED.labels(refusal.reason or refusal.result).inc()
        log.warning(
            "refusing decision %s: %s", decision["id"], refusal.message, extra=logs.decision_fields(decision)
        )
        gate.refuse(refusal.message)
        return refusal.result, refusal.message

    def _outcome_record(
        self, decision: DecisionRecord, victim: VictimRecord, outcome: eviction.Outcome
    ) -> EvictionRecord:
        record: EvictionRecord = {
            "v": VERSION,
            "decisionId": decision["id"],
            "cluster": decision["cluster"],
            "victim": victim,
            "action": victim["action"],
            "result": outcome.result,
            "attempts": outcome.attempts,
            "ts": kube.rfc3339(kube.now()),
        }
        if self.dry_run:
            record["dryRun"] = True
        if outcome.message:
            record["message"] = outcome.message
        return record

    async def _dead_letter(self, value: bytes, key: bytes | None, origin: Origin, exc: Exception) -> None:
        error_class = type(exc).__name__
        log.warning(
            "refused %s[%d]@%d: %s: %s", origin.topic, origin.partition, origin.offset, error_class, exc
        )
        headers = deadletter.origin_headers(origin, error_class, str(exc))
        await self._sink.send(
            self.topics.dead_letter, value, key=key, headers=deadletter.headers(key, value, headers)
        )
        deadletter.sent("actuator", headers)

    # ---- the Kafka loop ------------------------------------------------------------

    async def consume(
        self,
        kafka: connection.Connect,
        *,
        group_id: str,
        stopping: asyncio.Event,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
    ) -> None:
        """Consume decisions until `stopping` is set; only while leader when a Lease is configured.

        On taking the Lease over, the evictions topic is read back first: the previous
        leader may have written outcomes of decisions it had not committed yet.
        """
        backoff = Backoff()
        recovered = self._elector is None  # without a Lease, the read-back at start is current
        while not stopping.is_set():
            if self._elector is not None and not self._elector.is_leader():
                recovered = False
                if not await _first(self._elector.wait_leader(), stopping.wait()):
                    return
                continue
            try:
                if not recovered:
                    count = await read_back(kafka, self)
                    log.info("leading: %d outcomes read back from %s", count, self.topics.evictions)
                    recovered = True
                await self._consume_once(
                    kafka, group_id=group_id, stopping=stopping, session_timeout_ms=session_timeout_ms
                )
                backoff.reset()
            except lease.NotLeader as exc:
                log.warning("%s; pausing until the Lease is held again", exc)
            except (KafkaError, OSError, TimeoutError, connection.BrokerUnavailable) as exc:
                delay = backoff.delay()
                log.warning("consuming decisions failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    async def _consume_once(
        self, kafka: connection.Connect, *, group_id: str, stopping: asyncio.Event, session_timeout_ms: int
    ) -> None:
        config = connection.of(kafka)
        consumer = config.consumer(
            self.topics.decisions,
            group_id=group_id,
            client_id=f"{group_id}-{self._actions.identity}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a new group must not skip decisions already in the log
            isolation_level="read_committed",  # never act on an aborted (transactional) decision
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(session_timeout_ms // 3, 100),
            max_poll_records=MAX_POLL_RECORDS,
            fetch_max_wait_ms=self.fetch_max_wait_ms,
        )
        # Whatever this consumer reads first may follow records another actuator handled.
        self._linked.clear()
        ahead = LookAhead(config) if self.freshness is not None and self.freshness.supersede else None
        try:
            await connection.start(config, consumer)
            await self._poll(consumer, stopping, ahead)
        finally:
            if ahead is not None:
                await ahead.close()
            await _close(consumer, stopping)

    async def _poll(
        self, consumer: AIOKafkaConsumer, stopping: asyncio.Event, ahead: LookAhead | None = None
    ) -> None:
        while not stopping.is_set():
            if self._elector is not None and not self._elector.is_leader():
                return  # the successor takes over from our last commit
            batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS)
            if self.health is not None:
                self.health.set_ready(self.accepting())
            self.note((m.value or b"", m.headers or ()) for messages in batch.values() for m in messages)
            if ahead is not None and batch and await _behind(consumer):
                await ahead.scan(consumer, self.note)
            for tp, messages in batch.items():
                for message in messages:
                    origin = Origin(tp.topic, tp.partition, message.offset)
                    # A null value (a tombstone) is malformed input like any other: dead-lettered.
                    await self.handle(
                        message.value or b"", key=message.key, origin=origin, headers=message.headers or ()
                    )
                    await consumer.commit({tp: message.offset + 1})


async def _behind(consumer: AIOKafkaConsumer) -> bool:
    """Do decisions wait past what this poll returned? The last fetch's stable offset (or high
    watermark) against the position: no request to the broker."""
    for tp in consumer.assignment():
        end = consumer.last_stable_offset(tp)
        if end is None or end < 0:
            end = consumer.highwater(tp)
        if end is not None and end > await consumer.position(tp):
            return True
    return False


class LookAhead:
    """Reads the decisions partitions past what the actuator's consumer has fetched, so that
    superseding sees every later decision already in the log, not only the current batch.

    A consumer of no group (it commits nothing and moves no one's offsets), read_committed like
    the main one, assigned the main consumer's partitions. It keeps its own position and only
    moves forward: a record is noted once however many polls it waits behind.
    """

    def __init__(self, config: connection.KafkaConfig) -> None:
        self._config = config
        self._reader: AIOKafkaConsumer | None = None
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._read_to: dict[TopicPartition, int] = {}  # the next offset to note, per partition

    async def scan(
        self,
        consumer: AIOKafkaConsumer,
        note: Callable[[Iterable[tuple[bytes, Sequence[tuple[str, bytes]]]]], None],
    ) -> int:
        """Note the decisions between the consumer's position and the log's end (at most
        LOOKAHEAD_MAX_RECORDS); how many were read."""
        partitions = frozenset(consumer.assignment())
        if not partitions:
            return 0
        reader = await self._open()
        if partitions != self._assigned:
            reader.assign(sorted(partitions, key=lambda tp: (tp.topic, tp.partition)))
            self._assigned = partitions
            self._read_to = {}
        for tp in partitions:
            # Never behind what the consumer returned; never back over what was noted already.
            # (A fresh assignment's own position would be reset to the log's end: not asked.)
            handled_to = await consumer.position(tp)
            if self._read_to.get(tp, -1) < handled_to:
                reader.seek(tp, handled_to)
                self._read_to[tp] = handled_to
        # The end (read_committed: the last stable offset) first, so that a caught-up look-ahead
        # costs one ListOffsets request and never waits on an empty fetch.
        ends = await reader.end_offsets(list(partitions))
        read = 0
        while read < LOOKAHEAD_MAX_RECORDS:
            behind = [tp for tp in partitions if self._read_to[tp] < ends[tp]]
            if not behind:
                break
            batch = await reader.getmany(
                *behind, timeout_ms=LOOKAHEAD_FETCH_TIMEOUT_MS, max_records=LOOKAHEAD_MAX_RECORDS - read
            )
            if not batch:
                break  # a slow fetch: the next full batch reads on
            note((m.value or b"", m.headers or ()) for messages in batch.values() for m in messages)
            read += sum(len(messages) for messages in batch.values())
            for tp in batch:
                self._read_to[tp] = await reader.position(tp)
        if read:
            log.debug("superseding: looked %d decisions ahead", read)
        return read

    async def _open(self) -> AIOKafkaConsumer:
        if self._reader is None:
            reader = self._config.consumer(
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
                fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            )
            await connection.start(self._config, reader)
            self._reader = reader
        return self._reader

    async def close(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.stop()


async def _close(consumer: AIOKafkaConsumer, stopping: asyncio.Event) -> None:
    """Close the consumer; when stopping, give up after CONSUMER_CLOSE_TIMEOUT_S."""
    if not stopping.is_set():
        await consumer.stop()
        return
    try:
        await asyncio.wait_for(consumer.stop(), CONSUMER_CLOSE_TIMEOUT_S)
    except TimeoutError:
        log.warning(
            "leaving the consumer group took more than %.0fs; stopping without (the broker drops "
            "this member after its session timeout)",
            CONSUMER_CLOSE_TIMEOUT_S,
        )


def _nothing() -> None:
    return None


async def _until_stopped(work: Any, stopping: asyncio.Event) -> bool:
    """Await `work`; once `stopping` is set, give it STOP_TIMEOUT_S more to end, then cancel it.
    True when it was cancelled: writes it had in flight may still land (a request the server
    holds until its deadline, an outcome record in the producer's batch)."""
    working = asyncio.ensure_future(work)
    asked = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({working, asked}, return_when=asyncio.FIRST_COMPLETED)
        if not working.done():
            await asyncio.wait({working}, timeout=STOP_TIMEOUT_S)
        if not working.done():
            log.warning(
                "still consuming %.0fs after the stop was asked for; cancelling (a decision cut "
                "short is recovered as after a crash)",
                STOP_TIMEOUT_S,
            )
            working.cancel()
            await asyncio.gather(working, return_exceptions=True)
            return True
        await working  # its result, or its exception
        return False
    finally:
        asked.cancel()
        working.cancel()  # a no-op once it is done; else this coroutine itself was cancelled


async def _first(wanted: Any, stop: Any) -> bool:
    """Await `wanted` unless `stop` finishes first; True when `wanted` did."""
    wanted_task = asyncio.ensure_future(wanted)
    stop_task = asyncio.ensure_future(stop)
    try:
        done, _ = await asyncio.wait({wanted_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (wanted_task, stop_task):
            task.cancel()
        await asyncio.gather(wanted_task, stop_task, return_exceptions=True)
    return wanted_task in done and not wanted_task.cancelled()


# The five topics' names after the prefix (streams.kafka.topics.Names).
_TOPIC_SUFFIXES = ("cluster-events", "decisions", "evictions", "dead-letter", "snapshots")


def nested_prefixes(prefix: str, topic_names: Iterable[str]) -> list[str]:
    """Other installs' topic prefixes, found on the broker, that nest with ours (one begins with the
    other): a prefix ACL of either grants rights over the other's topics."""
    found = set()
    for name in topic_names:
        for suffix in _TOPIC_SUFFIXES:
            if name.endswith(suffix):
                other = name[: -len(suffix)]
                if other != prefix and (other.startswith(prefix) or prefix.startswith(other)):
                    found.add(other)
    return sorted(found)


async def warn_nested_prefixes(kafka: connection.KafkaConfig, prefix: str) -> None:
    """Log a warning for every other install's topic prefix on the broker that nests with ours."""
    admin = kafka.admin()
    try:
        await connection.start(kafka, admin)
        names = await admin.list_topics()
    except (KafkaError, OSError, connection.BrokerUnavailable) as exc:
        log.warning("could not list topics to check for nested prefixes: %s", exc)
        return
    finally:
        await admin.close()
    for other in nested_prefixes(prefix, names):
        log.warning(
            "topic prefix %r nests with another install's %r: a prefixed ACL of one covers the "
            "other's topics (read, Create, transactional ids); give installs prefixes neither of "
            "which begins with the other",
            prefix,
            other,
        )


def _key_id(headers: Sequence[tuple[str, bytes]]) -> str | None:
    """The signing key id a record's header names (signing.KEY_ID_HEADER), if any."""
    return next((v.decode("utf-8", "replace") for k, v in headers if k == signing.KEY_ID_HEADER), None)


def _members(decision: DecisionRecord) -> list[tuple[str, str, str]]:
    """(namespace/name, node, uid) of the preemptor, or of every member of a gang, in name order."""
    placements = decision.get("placements")
    if placements:
        uids: dict[str, str] = cast(dict[str, Any], decision)["memberUids"]
        return [(member, node, uids[member]) for member, node in sorted(placements.items())]
    return [(decision["preemptor"], decision.get("node", ""), decision["preemptorUid"])]


def _context(decision: DecisionRecord) -> eviction.Context:
    placements = decision.get("placements") or {}
    job = decision["preemptor"] if decision.get("flow") == "job" else ""
    members = decision.get("explanation", {}).get("members") or sorted(placements)
    return eviction.Context(
        decision_id=decision["id"],
        preemptor=decision["preemptor"],
        preemptor_uid=str(decision.get("preemptorUid") or ""),
        node=decision.get("node") or ", ".join(sorted(set(placements.values()))),
        reason=decision.get("reason", ""),
        job=job,
        trigger=str(members[0]) if job and members else "",
    )


async def _partitions(kafka: connection.KafkaConfig, topic: str) -> list[int]:
    """The topic's partition numbers; none when it does not exist (yet)."""
    admin = kafka.admin()
    try:
        await connection.start(kafka, admin)
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(
        p["partition"]
        for t in described
        if t["topic"] == topic and not t["error_code"]
        for p in t["partitions"]
    )


async def read_back(
    kafka: connection.Connect, actuator: Actuator, *, timeout_s: float = READ_BACK_TIMEOUT_S
) -> int:
    """Feed every record of the evictions topic to `actuator.recover`; returns the outcomes recovered.

    Assigns partitions instead of joining a group: nothing is committed, and every
    actuator reads the whole topic.
    """
    config = connection.of(kafka)
    consumer = config.consumer(enable_auto_commit=False, isolation_level="read_committed")
    try:
        await connection.start(config, consumer)
        topic = actuator.topics.evictions
        partitions = [TopicPartition(topic, p) for p in await _partitions(config, topic)]
        if not partitions:
            return 0
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        recovered = 0
        deadline = asyncio.get_running_loop().time() + timeout_s
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"reading back {topic} took over {timeout_s:g} s")
            batch = await consumer.getmany(*partitions, timeout_ms=READ_BACK_POLL_MS)
            recovered += actuator.recover(m.value for messages in batch.values() for m in messages)
        batch = await consumer.getmany(*partitions, timeout_ms=READ_BACK_TAIL_MS)
        recovered += actuator.recover(m.value for messages in batch.values() for m in messages)
        return recovered
    finally:
        await consumer.stop()


async def serve(
    actuator: Actuator,
    state: health.Health,
    kafka: connection.KafkaConfig,
    *,
    group_id: str,
    elector: lease.LeaseElector | None,
) -> None:
    """Recover, become ready, then consume until SIGTERM (holding the Lease meanwhile): the
    actuator process once its parts are built (`preemptctl actuator`, streams.cli.actuator)."""
    recovered = await read_back(kafka, actuator)
    log.info("%d outcomes read back from %s", recovered, actuator.topics.evictions)
    state.set_ready(actuator.accepting())
    stopping = asyncio.Event()
    component.stop_on_signals(stopping.set)
    electing = asyncio.create_task(elector.run()) if elector else None
    cut_short = True  # unless the loop ends by itself: an exception may leave writes in flight
    try:
        consuming = actuator.consume(kafka, group_id=group_id, stopping=stopping)
        cut_short = await _until_stopped(consuming, stopping)
    finally:
        if electing is not None and elector is not None:
            # Writes cut short may still land: the Lease is left to expire (its duration, past
            # the server's write deadline), not handed over at once to a successor that would
            # read the outcomes back before they are there and act on the same victims again.
            elector.release_on_exit = not cut_short
            electing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await electing
