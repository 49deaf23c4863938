"""The consumer harness (SPEC H1): one delivery from the transport to its final outcome.

    decode → validate ─poison─► dead letter (0 retries)
        │
        ▼
    transaction { fence row (first) ─already there─► skip, ack (duplicate)
                  handler(job, tx) }
        │ commit                    │ exception
        ▼                           ▼
      ack                     classify (R4) → retry with backoff (R1) | dead letter (D1)

A crash anywhere before the commit leaves neither the work nor the fence; the transport
redelivers after the lease. A crash after the commit and before the ack is caught by the
fence on redelivery.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import enum
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from ..calls.ledger import Ledger
from ..core import fence
from ..core.codec import Decoder
from ..core.fence import FenceOutcome
from ..core.holds import hold
from ..core.jobs import Delivery, Job
from ..core.leases import default_holder
from ..core.limits import Limit
from ..core.retry import Decision, RetryPolicy
from ..db import BatchLost, Database, SyncTx, Tx, WorkSource, current_tx
from ..errors import (
    BackOff,
    Category,
    HandlerError,
    PoisonPayload,
    Retry,
    classify,
    describe,
    error_code,
    trace_of,
)
from ..observers import Observers
from ..review import letters
from ..review.letters import DEFAULT_PAYLOAD_LIMIT
from ..tracing import Tracing
from ..transports import Transport
from . import hosted
from .flow import Admitted, Deferred, FlowControl, key_for, release_at_commit

log = logging.getLogger("jobfence.harness")


class Outcome(enum.Enum):
    """What became of one delivery."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    RETRY = "retry"
    DEAD = "dead"
    LOST = "lost"
    FAILED_TO_RECORD = "failed_to_record"  # the store was unreachable; the lease will redeliver
    #: flow control put it back on its queue for later, its attempt refunded: a BackOff, or
    #: a broker delivery over its key's limit (unrun)
    DEFERRED = "deferred"


#: a group-commit transaction is expected to stay open about this long at most: under a
#: backlog, a batch holds at most this many seconds of handler time (from the recent handler
#: time), so slow handlers (an HTTP call each) do not keep their work, their locks and the
#: jobs after them waiting on one long transaction. Generous on purpose: the handler time is
#: wall time, and a loaded machine stretches it for fast handlers too; smaller batches then
#: would cost more CPU per job exactly when CPU is short
BATCH_SPAN = 2.0

Handler = Callable[[Job[Any], Any], Awaitable[None] | None]

#: A broker delivery over its key's concurrency asks again after about the recent handler
#: time (a slot frees when a job ends), within these bounds (seconds), plus up to half again
#: at random so that the deliveries waiting on one key do not all come back at once
RECHECK_MIN = 0.05
RECHECK_MAX = 1.0
#: a delivery of a paused key asks again after this many seconds (a resume is not announced)
PAUSE_RECHECK = 5.0
#: the flow state could not be read (the database is away): ask again after this long
UNAVAILABLE_RECHECK = 1.0
#: the shortest deferral (a rate window that frees "now" still needs its clock tick)
MIN_DEFER = 0.01


@dataclass(frozen=True)
class Consumer:
    """A handler bound to a queue, with its schema and retry policy."""

    queue: str
    name: str
    handler: Handler
    decoder: Decoder
    policy: RetryPolicy
    #: the handler's second parameter is an ORM session (``tx.session``), not ``tx``
    wants_session: bool = False
    #: an integration that runs the work in its own transaction (:mod:`jobfence.runtime.hosted`)
    host: hosted.WorkHost | None = None
    #: never share a group-commit transaction: each job gets one of its own
    isolated: bool = False
    #: flow control: concurrency and rate per key (docs/flow-control.md)
    limit: Limit | None = None
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.handler))
        if self.host is not None:
            self.host.check_handler(self.handler, is_async=self.is_async)


class _LeaseLost(Exception):
    pass


@dataclass(frozen=True)
class Failure:
    """What the harness decided about a failed attempt."""

    category: Category
    decision: Decision
    error: str  # one line: ``Type: message``
    trace: str  # the traceback (bounded, no locals), kept in the attempt's history
    #: an error the handler raised on purpose (a HandlerError other than TECHNICAL_ERROR, or
    #: Retry): logged without its traceback
    expected: bool

    @property
    def log_trace(self) -> str | None:
        return None if self.expected else self.trace


class Harness:
    def __init__(
        self,
        *,
        consumers: Mapping[str, Consumer],
        db: Database,
        transport: Transport,
        observers: Observers,
        fence_ttl: timedelta,
        payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
        executor: Executor | None = None,
        fence_enabled: bool = True,
        work: WorkSource | None = None,
        tracing: Tracing | None = None,
        ledger: Ledger | None = None,
        flow: FlowControl | None = None,
        lease: timedelta = timedelta(seconds=30),
    ) -> None:
        self.consumers = consumers
        #: flow control (docs/flow-control.md): limited queues' broker deliveries are admitted
        #: through it before their handler runs, and handlers' back-offs hold keys there
        self.flow = flow
        #: a broker has no running rows to count: admit each delivery (the database queue's
        #: claim enforces the limits itself)
        self.admits = flow is not None and transport.jobs_db is None
        #: a slot lives as long as a delivery's lease, renewed with it (:meth:`renew_slots`)
        self.lease = lease
        #: the concurrency slots this harness holds (ids in ``core.flow_slots``)
        self.slots: set[int] = set()
        #: the call ledger handlers reach through ``job.call`` (None: no calls)
        self.ledger = ledger
        self.db = db
        #: what opens each job's transaction: ``db``, or the user's SQLAlchemy engine
        self.work: WorkSource = work or db
        self.transport = transport
        self.observers = observers
        self.fence_ttl = fence_ttl
        self.payload_limit = payload_limit
        self.executor = executor
        #: the queue is a table of the fence's database: a job's ack joins its transaction
        self.acks_in_tx = transport.commits_with(db)
        self.fence_enabled = fence_enabled
        #: each delivery's ``process`` span (docs/tracing.md); None: no tracing work at all
        self.tracing = tracing
        #: recent time a handler call takes (EWMA, seconds; None until one ran): the worker
        #: groups ready jobs into one transaction only while handlers are fast
        self.handler_time: float | None = None
        #: consumers seen holding transaction-wide state in a batch (SET LOCAL, advisory or
        #: table locks, COPY): from then on their jobs run one per transaction
        self.learned_isolated: set[str] = set()

    async def _screen(self, delivery: Delivery) -> tuple[Consumer, Job[Any]] | Outcome:
        """Everything decided before a transaction: unknown queue, attempts exhausted by lost
        workers, poison payloads (all dead-lettered at once); else the consumer and the job."""
        consumer = self.consumers.get(delivery.queue)
        if consumer is None:
            return await self._dead(
                delivery,
                delivery.queue,
                Category.NON_RETRYABLE_ERROR,
                f"no consumer is registered for queue {delivery.queue!r}",
                "NO_CONSUMER",
            )
        if delivery.given_up is not None or delivery.attempt > consumer.policy.max_attempts:
            last = delivery.history[-1].error if delivery.history else "unknown"
            reason = delivery.given_up or (
                f"gave up after {delivery.attempt - 1} attempts (the last lost its worker): {last}"
            )
            return await self._dead(
                delivery, consumer.name, Category.TECHNICAL_ERROR, reason, "ATTEMPTS_EXHAUSTED"
            )
        try:
            payload = consumer.decoder.decode(delivery.payload)
        except PoisonPayload as exc:
            return await self._dead(
                delivery, consumer.name, Category.VALIDATION_ERROR, str(exc), "POISON"
            )
        job: Job[Any] = Job(
            queue=delivery.queue,
            job_id=delivery.job_id,
            payload=payload,
            raw=delivery.payload,
            attempt=delivery.attempt,
            correlation_id=delivery.correlation_id,
            enqueued_at=delivery.enqueued_at,
            history=tuple(delivery.history),
            ledger=self.ledger.bound(consumer.name) if self.ledger is not None else None,
        )
        return consumer, job

    async def handle(self, delivery: Delivery) -> Outcome:
        """One delivery in its own transaction (in its ``process`` span when tracing)."""
        if self.tracing is None:
            return await self._handle(delivery)
        consumer = self.consumers.get(delivery.queue)
        with self.tracing.process(
            delivery, self.transport.name, consumer.name if consumer else None
        ) as span:
            outcome = await self._handle(delivery)
            self.tracing.outcome(span, outcome.value)
            return outcome

    async def _handle(self, delivery: Delivery) -> Outcome:
        screened = await self._screen(delivery)
        if isinstance(screened, Outcome):
            return screened
        consumer, job = screened
        if not (self.admits and consumer.limit is not None):
            return await self._run(delivery, consumer, job)
        try:
            deferred, slot = await self._admit(delivery, consumer, job)
        except asyncio.CancelledError:
            # shutdown ran out of patience before the handler: hand the job back, refunded
            await asyncio.shield(self._give_back(delivery))
            raise
        if deferred is not None:
            return deferred
        try:
            return await self._run(delivery, consumer, job, slot)
        finally:
            # a work transaction that committed gave the slot back already
            if slot is not None and slot in self.slots:
                await asyncio.shield(self._release_slot(slot))

    async def _run(
        self, delivery: Delivery, consumer: Consumer, job: Job[Any], slot: int | None = None
    ) -> Outcome:
        """The job through its fence and its handler to its outcome. ``slot``: its
        concurrency slot, given back by the work transaction when it commits (where that
        transaction is in the slots' database)."""
        ack_in_tx = self.acks_in_tx
        try:
            if consumer.host is not None:
                fenced, duration = await self._hosted(consumer, delivery, job, ack=ack_in_tx)
            else:
                fenced, duration = await self._own(
                    consumer, delivery, job, ack=ack_in_tx, slot=slot
                )
        except _LeaseLost:
            self.observers.job_lost(delivery, consumer.name)
            return Outcome.LOST
        except asyncio.CancelledError:
            # shutdown ran out of patience: the transaction rolled back; hand the job back
            await asyncio.shield(self._release(delivery))
            raise
        except Exception as exc:
            return await self._failed(delivery, consumer, exc)

        await self.observers.after_commit(job)
        if not ack_in_tx:
            try:
                await self.transport.ack(delivery)
            except Exception:
                # the work is committed; a redelivery will meet the fence
                log.exception("ack failed after commit", extra={"job_id": delivery.job_id})
        if fenced is FenceOutcome.DUPLICATE:
            self.observers.job_duplicate(delivery, consumer.name)
            return Outcome.DUPLICATE
        self.observers.job_processed(job, duration)
        return Outcome.PROCESSED

    async def _own(
        self,
        consumer: Consumer,
        delivery: Delivery,
        job: Job[Any],
        *,
        ack: bool,
        slot: int | None = None,
    ) -> tuple[FenceOutcome, float]:
        """The job in jobfence's own work transaction (:func:`jobfence.core.fence.work`), opened by
        ``self.work`` (the app's database, or its SQLAlchemy engine). ``slot``: a concurrency
        slot that the transaction gives back when it commits, if it is in the slots' database
        (then it leaves :attr:`slots`); a rollback keeps it for the caller to release."""
        duration = 0.0
        frees = slot is not None and self.flow is not None and self.flow.releases_in(self.work)
        async with fence.work(
            self.work,
            consumer.name,
            delivery,
            self.fence_ttl,
            ack=ack,
            enabled=self.fence_enabled,
        ) as (tx, fenced):
            if fenced is FenceOutcome.LOST:
                raise _LeaseLost
            if fenced is FenceOutcome.FENCED:
                self.observers.job_started(job)
                started = time.perf_counter()
                await self._call(consumer, job, tx)
                duration = time.perf_counter() - started
            if slot is not None and frees:
                await release_at_commit(tx, slot)
        if slot is not None and frees:
            self.slots.discard(slot)  # committed: given back
        return fenced, duration

    async def _hosted(
        self, consumer: Consumer, delivery: Delivery, job: Job[Any], *, ack: bool
    ) -> tuple[FenceOutcome, float]:
        """The job in its integration's transaction (:mod:`jobfence.runtime.hosted`), in a worker
        thread: the fence steps, the handler and the commit all on the ORM's connection."""
        host = consumer.host
        assert host is not None
        steps, params = fence.plan(
            self.db, consumer.name, delivery, self.fence_ttl, ack=ack, enabled=self.fence_enabled
        )
        loop = asyncio.get_running_loop()
        took: list[float] = []

        def call(lent: Any) -> None:
            loop.call_soon_threadsafe(self.observers.job_started, job)
            began = time.perf_counter()
            try:
                consumer.handler(job, lent)
            finally:
                took.append(time.perf_counter() - began)

        run = partial(contextvars.copy_context().run, hosted.run, host, steps, params, call)
        try:
            fenced = await loop.run_in_executor(self.executor, run)
        finally:
            if took:
                last = self.handler_time
                self.handler_time = took[0] if last is None else 0.8 * last + 0.2 * took[0]
        if fenced is FenceOutcome.LOST:
            raise _LeaseLost
        return fenced, (took[0] if took else 0.0)

    @property
    def can_batch(self) -> bool:
        """Group commit needs the queue in the fence's database, a database that can, and
        jobfence's own work transactions (not an integration's)."""
        return (
            self.work is self.db
            and not any(c.host is not None for c in self.consumers.values())
            and self.acks_in_tx
            and self.db.supports_batch
        )

    def groups(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` may share a group-commit transaction: its consumer is known,
        not declared ``isolated`` and not seen needing a transaction of its own."""
        consumer = self.consumers.get(delivery.queue)
        return (
            consumer is not None
            and not consumer.isolated
            and consumer.name not in self.learned_isolated
            and (self.ledger is None or consumer.name not in self.ledger.callers)
        )

    def batch_limit(self, batch_size: int) -> int:
        """The most jobs one batch takes now: ``batch_size`` where group commit is possible
        (else 1), and no more than :data:`BATCH_SPAN` seconds of recent handler time."""
        if batch_size <= 1 or not self.can_batch:
            return 1
        if self.handler_time is not None:
            batch_size = min(batch_size, max(1, int(BATCH_SPAN / max(self.handler_time, 1e-6))))
        return batch_size

    def take(self, buffer: collections.deque[Delivery], size: int) -> list[Delivery]:
        """The next batch from the front of ``buffer``: up to ``size`` deliveries that may
        share a transaction, or the first delivery alone when it may not (an isolated
        consumer, no group commit)."""
        if size <= 1 or not self.can_batch or not self.groups(buffer[0]):
            return [buffer.popleft()]
        batch = [buffer.popleft()]
        while buffer and len(batch) < size and self.groups(buffer[0]):
            batch.append(buffer.popleft())
        return batch

    async def handle_batch(self, deliveries: list[Delivery]) -> list[Outcome]:
        """Group commit: several deliveries in one transaction, each job in its own savepoint.

        One statement acks and fences the whole batch; each handler then runs in a savepoint,
        so a failing job rolls back alone (its fence row is removed and its retry or dead
        letter is written in the same transaction); one COMMIT makes every job's work and
        fence durable together. Guarantees are those of :meth:`handle`, per job.
        """
        if len(deliveries) == 1 or not self.can_batch:
            return [await self.handle(d) for d in deliveries]
        outcomes: dict[int, Outcome] = {}
        screened: list[tuple[int, Delivery, Consumer, Job[Any]]] = []
        alone: list[tuple[int, Delivery]] = []
        for index, delivery in enumerate(deliveries):
            if not self.groups(delivery):
                alone.append((index, delivery))
                continue
            result = await self._screen(delivery)
            if isinstance(result, Outcome):
                outcomes[index] = result
            else:
                screened.append((index, delivery, *result))
        if len(screened) == 1:
            alone.append(screened.pop()[:2])
        if screened:
            await self._run_batch(screened, outcomes)
        for index, delivery in alone:
            outcomes[index] = await self.handle(delivery)
        return [outcomes[i] for i in range(len(deliveries))]

    async def _run_batch(
        self,
        screened: list[tuple[int, Delivery, Consumer, Job[Any]]],
        outcomes: dict[int, Outcome],
    ) -> None:
        """Run ``screened`` (index, delivery, consumer, job) in one transaction and write each
        one's outcome into ``outcomes`` at its index."""
        params = {
            "ids": [d.ref for _, d, _, _ in screened],
            "tokens": [d.token for _, d, _, _ in screened],
            "consumers": [c.name for _, _, c, _ in screened],
            "job_ids": [d.job_id for _, d, _, _ in screened],
            "ttl": self.fence_ttl.total_seconds(),
        }
        step = "batch_fence_and_ack" if self.fence_enabled else "batch_ack"
        notes: list[Callable[[], None]] = []
        committed: list[tuple[Job[Any], float]] = []
        started = False
        running: Consumer | None = None
        try:
            async with self.db.batch(step, params) as (batch, rows):
                by_id = {row["id"]: row for row in rows}
                fenced_keys: set[tuple[str, str]] = set()
                for index, delivery, consumer, job in screened:
                    row = by_id[delivery.ref]
                    key = (consumer.name, delivery.job_id)
                    if not row["acked"]:
                        outcomes[index] = Outcome.LOST
                        notes.append(partial(self.observers.job_lost, delivery, consumer.name))
                        continue
                    if not row["fenced"] or key in fenced_keys:
                        outcomes[index] = Outcome.DUPLICATE
                        notes.append(partial(self.observers.job_duplicate, delivery, consumer.name))
                        continue
                    fenced_keys.add(key)
                    started = True
                    running = consumer
                    with (
                        nullcontext()
                        if self.tracing is None
                        else self.tracing.process(delivery, self.transport.name, consumer.name)
                    ) as span:
                        self.observers.job_started(job)
                        began = time.perf_counter()
                        try:
                            async with batch.job() as tx:
                                await self._call(consumer, job, tx)
                        except BatchLost:
                            raise
                        except Exception as exc:
                            outcomes[index] = await self._failed_in_batch(
                                batch.tx, delivery, consumer, exc, notes
                            )
                        else:
                            outcomes[index] = Outcome.PROCESSED
                            committed.append((job, time.perf_counter() - began))
                        if self.tracing is not None:
                            self.tracing.outcome(span, outcomes[index].value)
        except asyncio.CancelledError:
            for _, delivery, _, _ in screened:
                await asyncio.shield(self._release(delivery))
            raise
        except BatchLost as lost:
            # a handler ended the batch's transaction (SPEC H5), or took transaction-wide
            # state that would outlive its job (SET LOCAL, an advisory xact lock, COPY):
            # nothing of the batch committed and every delivery is still ours; each job runs
            # again on its own, so the culprit fails (or, isolated, succeeds) alone and the
            # others commit
            if lost.isolate is not None and running is not None:
                self.learned_isolated.add(running.name)
                log.warning(
                    "a handler took transaction-wide state inside a group-commit transaction; "
                    "its consumer's jobs now run one per transaction (declare the consumer "
                    "isolated=True to skip this re-run)",
                    extra={"consumer": running.name, "statement": lost.isolate},
                )
            else:
                log.warning(
                    "a handler ended its group-commit transaction; "
                    "running the batch's jobs one by one",
                    extra={"error": str(lost.problem)},
                )
            for index, delivery, _, _ in screened:
                outcomes[index] = await self.handle(delivery)
            return
        except Exception:
            if not started:
                # nothing ran: let each delivery take the single path (and its error handling)
                for index, delivery, _, _ in screened:
                    outcomes[index] = await self.handle(delivery)
                return
            log.exception("group commit failed; its jobs go back to the queue")
            for index, delivery, _, _ in screened:
                await self._release(delivery)
                outcomes[index] = Outcome.FAILED_TO_RECORD
            return
        after_commit = self.observers.wants_after_commit
        for job, duration in committed:
            if after_commit:
                await self.observers.after_commit(job)
            self.observers.job_processed(job, duration)
        for note in notes:
            note()

    async def _failed_in_batch(
        self,
        tx: Tx,
        delivery: Delivery,
        consumer: Consumer,
        exc: Exception,
        notes: list[Callable[[], None]],
    ) -> Outcome:
        """A job of a batch failed; its savepoint is rolled back. Undo its fence and ack, and
        write its retry or dead letter, all in the batch's transaction."""
        if isinstance(exc, BackOff):
            if self.fence_enabled:
                await fence.unclaim_tx(tx, consumer.name, delivery.job_id)
            delay = await self._hold_key(delivery, consumer, exc, tx)
            await self.transport.defer_tx(tx, delivery, delay, f"back-off: {exc.reason}")
            key = self._flow_key(consumer, delivery)
            notes.append(
                partial(self.observers.job_deferred, delivery, consumer.name, "backoff", key, delay)
            )
            return Outcome.DEFERRED
        failure = self._decide(delivery, consumer, exc)
        category, decision, error = failure.category, failure.decision, failure.error
        if self.fence_enabled:
            await fence.unclaim_tx(tx, consumer.name, delivery.job_id)
        if decision.retry:
            await self.transport.requeue_tx(
                tx, delivery, decision.delay, category, error, trace=failure.trace
            )
            notes.append(
                partial(
                    self.observers.job_retry,
                    delivery,
                    consumer.name,
                    category,
                    decision.delay,
                    error,
                    trace=failure.log_trace,
                )
            )
            return Outcome.RETRY
        letter_id, created = await letters.write(
            self.db,
            delivery,
            consumer.name,
            category,
            error,
            error_code(exc),
            ack=False,
            payload_limit=self.payload_limit,
            tx=tx,
            trace=failure.trace,
        )
        notes.append(
            partial(
                self.observers.job_dead,
                delivery,
                consumer.name,
                category,
                error,
                letter_id,
                created=created,
                trace=failure.log_trace,
            )
        )
        return Outcome.DEAD

    async def _call(self, consumer: Consumer, job: Job[Any], tx: Tx) -> None:
        token = current_tx.set(tx)
        began = time.perf_counter()
        guard = tx.guard
        if guard is not None:
            guard.active = True  # the handler holds jobfence's transaction (SPEC H5)
        sync_tx: SyncTx | None = None
        try:
            if consumer.is_async:
                result = consumer.handler(job, tx.session if consumer.wants_session else tx)
                if inspect.isawaitable(result):
                    await result
            else:
                loop = asyncio.get_running_loop()
                ctx = contextvars.copy_context()
                sync_tx = SyncTx(tx, loop)
                call = partial(ctx.run, consumer.handler, job, sync_tx)
                await loop.run_in_executor(self.executor, call)
        finally:
            if sync_tx is not None:
                # a thread cancelled mid-handler runs on: from now on its statements are
                # refused, before this transaction rolls back and its connection serves others
                sync_tx.end("the job was cancelled, or its handler had returned")
            if guard is not None:
                guard.active = False
            current_tx.reset(token)
            took = time.perf_counter() - began
            last = self.handler_time
            self.handler_time = took if last is None else 0.8 * last + 0.2 * took

    async def _release(self, delivery: Delivery) -> None:
        try:
            await self.transport.release(delivery, attempted=True)
        except Exception:
            log.exception("could not release job on shutdown; its lease will expire")

    @staticmethod
    def _decide(delivery: Delivery, consumer: Consumer, exc: Exception) -> Failure:
        """The one decision on a failed attempt: its category (R4), retry or not and when
        (R1/R2), its description and traceback."""
        category = classify(exc)
        requested = exc.delay if isinstance(exc, Retry) else None
        decision = consumer.policy.decide(category, delivery.attempt, requested_delay=requested)
        expected = isinstance(exc, Retry) or (
            isinstance(exc, HandlerError) and category is not Category.TECHNICAL_ERROR
        )
        return Failure(category, decision, describe(exc), trace_of(exc), expected)

    async def _hold_key(
        self, delivery: Delivery, consumer: Consumer, exc: BackOff, tx: Tx | None = None
    ) -> timedelta:
        """A handler raised :class:`BackOff`: hold its job's key on every worker (on a
        consumer with a Limit; without one only this job waits) and return how long this
        job waits (the key's hold from now: a longer one in place stays)."""
        if consumer.limit is None:
            return exc.delay
        key = self._flow_key(consumer, delivery)
        held = await hold(
            self.transport.jobs_db or self.db,
            delivery.queue,
            key,
            kind="backoff",
            seconds=exc.delay.total_seconds(),
            reason=exc.reason,
            held_by=default_holder(),
            tx=tx,
        )
        log.info(
            "a handler backed off: its key is held",
            extra={
                "job_id": delivery.job_id,
                "queue": delivery.queue,
                "key": key,
                "held_s": held,
                "reason": exc.reason,
            },
        )
        return exc.delay if held is None else max(timedelta(seconds=held), exc.delay)

    def _flow_key(self, consumer: Consumer, delivery: Delivery) -> str:
        """The job's flow key (the database queue's claim read it already)."""
        if delivery.flow_key is not None:
            return delivery.flow_key
        return key_for(consumer.limit, delivery.payload, consumer.decoder.decode)

    async def _back_off(self, delivery: Delivery, consumer: Consumer, exc: BackOff) -> Outcome:
        try:
            delay = await self._hold_key(delivery, consumer, exc)
            await self.transport.defer(delivery, delay, note=f"back-off: {exc.reason}")
        except Exception:
            log.exception(
                "could not record a back-off; the job returns when its lease expires",
                extra={"job_id": delivery.job_id, "correlation_id": delivery.correlation_id},
            )
            return Outcome.FAILED_TO_RECORD
        key = self._flow_key(consumer, delivery)
        self.observers.job_deferred(delivery, consumer.name, "backoff", key, delay)
        return Outcome.DEFERRED

    async def _failed(self, delivery: Delivery, consumer: Consumer, exc: Exception) -> Outcome:
        if isinstance(exc, BackOff):
            return await self._back_off(delivery, consumer, exc)
        failure = self._decide(delivery, consumer, exc)
        category, decision, error = failure.category, failure.decision, failure.error
        if not decision.retry:
            return await self._dead(
                delivery, consumer.name, category, error, error_code(exc), failure
            )
        try:
            await self.transport.retry(
                delivery, decision.delay, category, error, trace=failure.trace
            )
        except Exception:
            log.exception(
                "could not schedule a retry; the job returns when its lease expires",
                extra={"job_id": delivery.job_id, "correlation_id": delivery.correlation_id},
            )
            return Outcome.FAILED_TO_RECORD
        self.observers.job_retry(
            delivery, consumer.name, category, decision.delay, error, trace=failure.log_trace
        )
        return Outcome.RETRY

    # -- flow control (docs/flow-control.md) -----------------------------------------------

    def _key(self, consumer: Consumer, delivery: Delivery, job: Job[Any]) -> str:
        """The job's flow key, from the payload the handler gets (decoded once)."""
        return key_for(consumer.limit, delivery.payload, lambda _raw: job.payload)

    async def _admit(
        self, delivery: Delivery, consumer: Consumer, job: Job[Any]
    ) -> tuple[Outcome | None, int | None]:
        """Admit a broker delivery of a limited queue: (None, its slot or None) when it may
        run; else (its outcome, None), the delivery deferred to when capacity may be back,
        unrun, its attempt refunded."""
        assert self.flow is not None
        key = self._key(consumer, delivery, job)
        try:
            answer = await self.flow.admit(delivery.queue, key, delivery.job_id, self.lease)
        except Exception:
            log.exception(
                "flow control could not admit a job; it waits and asks again",
                extra={"job_id": delivery.job_id, "queue": delivery.queue},
            )
            return await self._defer(
                delivery, consumer, "unavailable", key, UNAVAILABLE_RECHECK
            ), None
        if isinstance(answer, Admitted):
            if answer.slot is not None:
                self.slots.add(answer.slot)
            return None, answer.slot
        return await self._defer(delivery, consumer, answer.reason, key, self._wait(answer)), None

    def _wait(self, answer: Deferred) -> float:
        """How long a deferred delivery waits before it asks again."""
        if answer.wait is None:  # paused until an operator resumes the key
            return PAUSE_RECHECK
        if answer.reason == "concurrency":
            # the earliest a slot frees for sure is its lease's end; a job ending frees one
            # sooner, about a handler's time from now
            recent = self.handler_time if self.handler_time is not None else RECHECK_MIN
            recheck = min(max(recent, RECHECK_MIN), RECHECK_MAX) * random.uniform(1.0, 1.5)
            return max(min(answer.wait, recheck), MIN_DEFER)
        return max(answer.wait, MIN_DEFER)  # a rate window's oldest start leaves it; a back-off

    async def _defer(
        self,
        delivery: Delivery,
        consumer: Consumer,
        reason: str,
        key: str,
        seconds: float,
    ) -> Outcome:
        """Defer an unrun delivery (its history untouched) and tell the observers."""
        delay = timedelta(seconds=seconds)
        try:
            await self.transport.defer(delivery, delay)
        except Exception:
            log.exception(
                "could not defer a job; it returns when its lease expires",
                extra={"job_id": delivery.job_id, "queue": delivery.queue, "reason": reason},
            )
            return Outcome.FAILED_TO_RECORD
        self.observers.job_deferred(delivery, consumer.name, reason, key, delay)
        return Outcome.DEFERRED

    async def _give_back(self, delivery: Delivery) -> None:
        try:
            await self.transport.release(delivery, attempted=False)
        except Exception:
            log.exception("could not hand back a job on shutdown; its lease will expire")

    async def _release_slot(self, slot: int) -> None:
        self.slots.discard(slot)
        assert self.flow is not None
        try:
            await self.flow.release(slot)
        except Exception:
            log.exception("could not give back a concurrency slot; it expires with its lease")

    async def renew_slots(self) -> None:
        """Renew the concurrency slots of the deliveries still running (with their leases:
        the worker's heartbeat). A worker that dies stops renewing them, and its slots count
        for nothing once a lease has passed."""
        if self.flow is not None and self.slots:
            await self.flow.extend(sorted(self.slots), self.lease)

    async def _dead(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        code: str | None,
        failure: Failure | None = None,
    ) -> Outcome:
        shares = self.acks_in_tx
        try:
            letter_id, created = await letters.write(
                self.db,
                delivery,
                consumer,
                category,
                error,
                code,
                ack=shares,
                payload_limit=self.payload_limit,
                trace=failure.trace if failure else None,
            )
            await self.transport.dead_lettered(
                delivery, consumer=consumer, category=category, code=code
            )
            if not shares:
                await self.transport.ack(delivery)
        except Exception:
            log.exception(
                "could not write the dead letter; the job returns when its lease expires",
                extra={"job_id": delivery.job_id, "correlation_id": delivery.correlation_id},
            )
            return Outcome.FAILED_TO_RECORD
        self.observers.job_dead(
            delivery,
            consumer,
            category,
            error,
            letter_id,
            created=created,
            trace=failure.log_trace if failure else None,
        )
        return Outcome.DEAD
