"""The outbox relay (SPEC O2): publishes pending outbox events to the app's queue port.

A relay *claims* a batch (a lease, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so several relays
share the work), publishes it with ``job_id = event_id``, then marks it published; after five
failed attempts an event is ``PUBLISH_FAILED_RETRY`` until an operator re-drives it
(:func:`jobfence.outbox.redrive`). Relays wake on PostgreSQL ``LISTEN/NOTIFY`` and poll as a
fallback (SQLite always polls). An idle relay registers in ``core.outbox_waiters`` before it
waits: writers notify only while one waits, because a NOTIFY serialises committing writers.

When the app's queue is the job table of the same PostgreSQL database, a round is one
statement in one transaction: claim, queue as jobs, mark published (an event is queued exactly
once). See :mod:`jobfence.outbox` for the states.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from prometheus_client import Counter

from ..core.jobs import OutgoingJob
from ..core.retry import RetryPolicy
from ..db import Database, Tx
from ..errors import Category, ConfigurationError, classify, describe, error_code
from ..metrics import RELAYS
from ..runtime import holding
from ..runtime.context import RuntimeSource
from ..runtime.health import Health, register, unregister
from . import DEFAULT_RETENTION, PUBLISH_FAILED_RETRY, cleanup

log = logging.getLogger("jobfence.relay")


@dataclass(frozen=True)
class OutboxEvent:
    """An event as a relay publishes it."""

    id: int
    event_id: str
    queue: str
    ordering_key: str | None
    correlation_id: str | None
    payload: bytes
    attempts: int
    claim: Any = None
    #: the W3C trace context of the event's ``create`` span; its job carries it
    trace_context: str | None = None
    #: the priority its job gets (``outbox.write(..., priority=)``)
    priority: int = 0

    def job(self) -> OutgoingJob:
        return OutgoingJob(
            self.queue,
            self.event_id,
            self.payload,
            self.correlation_id,
            trace_context=self.trace_context,
            priority=self.priority,
        )


class RelayObserver:
    """Hooks of a relay; no-ops by default. A hook that raises is logged and ignored."""

    async def published(self, events: Sequence[OutboxEvent]) -> None:
        """The transport accepted ``events``; they are not marked published yet (a crash now
        means they are published again, and the consumer's fence absorbs it). On the
        database queue of the same database (:attr:`Relay.direct`) they are queued and
        marked in one transaction, and this runs after its commit."""

    def publish_failed(self, event: OutboxEvent, error: str, gave_up: bool) -> None:
        """One attempt failed; ``gave_up`` when the event is now PUBLISH_FAILED_RETRY."""


OnPublished = Callable[[Tx, Sequence[OutboxEvent]], Awaitable[None]]


@dataclass
class RelayStats:
    published: int = 0
    failed_attempts: int = 0
    gave_up: int = 0
    rounds: int = 0
    cleaned: int = 0


CHANNEL = "jobfence_outbox"
#: Seed 004 §10.3: the outbox publisher makes 5 attempts, then PUBLISH_FAILED_RETRY.
DEFAULT_PUBLISH_POLICY = RetryPolicy(
    max_retries=4,
    base=timedelta(seconds=1),
    cap=timedelta(seconds=30),
    justification=(
        "outbox publishing (seed 004 §10.3): 5 attempts per event, 1 s doubling to 30 s, then "
        "PUBLISH_FAILED_RETRY for an operator; a broker outage is visible within a minute"
    ),
)
#: events per round by default: claimed, published and marked (the publish path); where
#: one statement queues them into the same database (:attr:`Relay.direct`), a round's fixed
#: cost (a transaction: four round trips and a commit) is shared by more events
DEFAULT_BATCH = 100
DEFAULT_DIRECT_BATCH = 1000
DEFAULT_LEASE = timedelta(seconds=30)
DEFAULT_PUBLISH_TIMEOUT = timedelta(seconds=10)

PUBLISHED_EVENTS = Counter(
    "jobfence_outbox_published", "Outbox events published to their queue.", ["queue"]
)
PUBLISH_FAILURES = Counter(
    "jobfence_outbox_publish_failures",
    "Failed attempts to publish an outbox event.",
    ["queue", "category"],
)
GAVE_UP = Counter(
    "jobfence_outbox_publish_failed_retry",
    "Outbox events that used up their attempts (state PUBLISH_FAILED_RETRY).",
    ["queue"],
)


class Relay:
    """Publishes outbox events from ``app``'s database to ``app.transport``.

    Run it on its own (``jobfence relay``) or inside a worker's process
    (``relay.start()`` … ``await relay.stop()``); run as many as you like.

    ``on_published(tx, events)`` runs in the transaction that marks events published (e.g. to
    move a domain row to PUBLISHED); if it raises, the mark rolls back and the events are
    published again after their claim expires.

    ``one_transaction`` (default: whenever possible): when the app's queue is the job table of
    the outbox's own PostgreSQL database, each round claims, queues and marks its events in
    one statement and one transaction, so an event is queued exactly once; ``False`` keeps
    the publish-then-mark rounds that other queues need.
    """

    def __init__(
        self,
        app: RuntimeSource,
        *,
        batch_size: int | None = None,
        poll_interval: float | None = None,
        lease: timedelta = DEFAULT_LEASE,
        policy: RetryPolicy = DEFAULT_PUBLISH_POLICY,
        publish_timeout: timedelta = DEFAULT_PUBLISH_TIMEOUT,
        retention: timedelta = DEFAULT_RETENTION,
        cleanup_interval: timedelta = timedelta(minutes=1),
        on_published: OnPublished | None = None,
        observers: Sequence[RelayObserver] = (),
        relay_id: str | None = None,
        one_transaction: bool | None = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ConfigurationError("the relay's batch_size must be at least 1")
        if lease <= publish_timeout:
            raise ConfigurationError(
                f"the relay's claim lease ({lease}) must be longer than its publish timeout "
                f"({publish_timeout}), or a slow publish would be claimed twice"
            )
        if retention <= timedelta(0):
            raise ConfigurationError("the outbox retention must be a positive duration")
        self.app = app
        #: events per round; None: :data:`DEFAULT_DIRECT_BATCH` when a round is one statement
        #: into this database's job table, else :data:`DEFAULT_BATCH`
        self.requested_batch_size = batch_size
        self._poll_interval = poll_interval
        self.lease = lease
        self.policy = policy
        self.publish_timeout = publish_timeout
        self.retention = retention
        self.cleanup_interval = cleanup_interval
        self.on_published = on_published
        self.observers = list(observers)
        self.relay_id = relay_id or f"relay:{uuid.uuid4().hex[:10]}"
        self.stats = RelayStats()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[RelayStats] | None = None
        self._waiting = False  # registered in core.outbox_waiters
        self._one_transaction = one_transaction
        self._forced = False
        self._round: asyncio.Task[None] | None = None

        #: what /livez and /readyz report for this relay (jobfence.runtime.health)
        self.health = Health("relay")

    @property
    def direct(self) -> bool:
        """Whether a round is one statement (claim, queue as jobs, mark published): the
        app's queue is the job table of this same PostgreSQL database (unless
        ``one_transaction=False`` asks for the publish-then-mark rounds of other queues)."""
        transport = self.app.runtime.transport
        possible = self.db.dialect == "postgresql" and transport.commits_with(self.db)
        if self._one_transaction and not possible:
            raise ConfigurationError(
                "one_transaction=True needs the app's queue to be the job table of the same "
                "PostgreSQL database as its outbox"
            )
        return possible and self._one_transaction is not False

    @property
    def batch_size(self) -> int:
        """Events claimed per round (see :attr:`requested_batch_size`)."""
        if self.requested_batch_size is not None:
            return self.requested_batch_size
        return DEFAULT_DIRECT_BATCH if self.direct else DEFAULT_BATCH

    @property
    def poll_interval(self) -> float:
        if self._poll_interval is not None:
            return self._poll_interval
        # PostgreSQL relays are woken by NOTIFY; polling is only the fallback (for an event
        # whose writer checked for waiting relays before this one registered and committed
        # after it looked)
        return 1.0 if self.app.url.dialect == "postgresql" else 0.2

    @property
    def db(self) -> Database:
        return self.app.runtime.db

    def wake(self) -> None:
        """Look for events now (events were written in this process)."""
        self._wake.set()

    def request_stop(self) -> None:
        """Stop after the current round (what SIGTERM/SIGINT does)."""
        self._stop.set()
        self._wake.set()
        self.health.draining = True

    def force_stop(self) -> None:
        """Stop now (what a second SIGTERM/SIGINT does): the round in progress is cancelled.
        Nothing is lost: a round in one transaction rolls back; otherwise its claimed events
        are relayed again when their claim (``lease``) runs out — an event whose publish was
        under way may go out twice, with the same job id, which the consumer's fence skips."""
        self.request_stop()
        if self._forced:
            return
        self._forced = True
        if self._round is not None and not self._round.done():
            log.warning(
                "second signal: stopping the relay now, cancelling its current round "
                f"(its events are relayed again within {self.lease.total_seconds():g}s)",
                extra={"relay": self.relay_id},
            )
            self._round.cancel()

    def _on_signal(self) -> None:
        if not self._stop.is_set():
            log.info(
                "shutdown requested: the relay stops after its current round; a second "
                "Ctrl-C (SIGINT or SIGTERM) stops it now",
                extra={"relay": self.relay_id},
            )
            self.request_stop()
        else:
            self.force_stop()

    def start(self) -> asyncio.Task[RelayStats]:
        """Run in the background of the current event loop (e.g. next to a worker)."""
        if self._task is None or self._task.done():
            self._stop.clear()
            self._task = asyncio.create_task(self.run(), name=f"jobfence-{self.relay_id}")
        return self._task

    async def stop(self, *, force: bool = False) -> RelayStats:
        """Stop a :meth:`start`-ed relay after its round (``force``: now, :meth:`force_stop`)."""
        if force:
            self.force_stop()
        self.request_stop()
        if self._task is not None:
            await self._task
        return self.stats

    async def run(self, *, install_signal_handlers: bool = False) -> RelayStats:
        """Publish until :meth:`request_stop` (or SIGTERM/SIGINT with signal handlers)."""
        self.health = Health("relay")
        register(self.health)
        try:
            held = await holding.hold(self.app, pool_size=10)
        except BaseException:
            unregister(self.health)
            raise
        RELAYS.inc()
        watch = asyncio.create_task(self.health.watch(self.db), name="jobfence-relay-health")
        self.health.started = True
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal)
        self._forced = False
        listener = None
        if self.db.dialect == "postgresql":
            listener = asyncio.create_task(self._listen(), name="jobfence-outbox-listen")
        log.info(
            "relay started",
            extra={
                "relay": self.relay_id,
                "database": self.db.display,
                "transport": self.app.runtime.transport.name,
            },
        )
        try:
            self._round = asyncio.create_task(self._rounds(listener), name="jobfence-relay-rounds")
            try:
                await self._round
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not self._forced or (current is not None and current.cancelling()):
                    raise
        finally:
            self._round = None
            self.health.draining = True
            unregister(self.health)
            RELAYS.dec()
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            if self._waiting and self.app.is_open:
                await self._stop_waiting()
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            log.info(
                "relay stopped",
                extra={
                    "relay": self.relay_id,
                    "published": self.stats.published,
                    "forced": self._forced,
                },
            )
            if held:
                await holding.release(self.app)
        return self.stats

    async def _rounds(self, listener: asyncio.Task[None] | None) -> None:
        """Relay round after round until a stop is requested."""
        next_cleanup = 0.0
        while not self._stop.is_set():
            self._wake.clear()
            try:
                claimed = await self.run_once()
                if time.monotonic() >= next_cleanup:
                    self.stats.cleaned += await cleanup(self.db, self.retention)
                    next_cleanup = time.monotonic() + self.cleanup_interval.total_seconds()
            except Exception:
                log.exception("relay round failed; retrying shortly")
                await self._sleep(1.0)
                continue
            if claimed:
                # progress: more may be ready (a full batch, or the next event of a key
                # whose head just went out)
                if self._waiting:
                    await self._stop_waiting()
                continue
            wait = await self.idle_wait()
            # registered, look again: for events committed before writers could see it wait
            waiting = listener is not None and await self._start_waiting(wait)
            if waiting and await self.run_once():
                await self._stop_waiting()
                continue
            await self._sleep(wait)

    async def _start_waiting(self, seconds: float) -> bool:
        """Register as waiting (writers notify until ``seconds`` from now, plus a margin)."""
        try:
            await self.db.run(
                "outbox_wait_register", {"relay_id": self.relay_id, "seconds": seconds + 1.0}
            )
        except Exception:
            log.exception("could not register as a waiting relay; polling meanwhile")
            return False
        self._waiting = True
        try:
            await self.db.run("outbox_wait_writers", {"ms": f"{max(1, int(seconds * 1000))}ms"})
        except Exception as exc:  # a writer's transaction outlived the wait: poll as usual
            log.debug("waiting for outbox writers: %s", exc)
        return True

    async def _stop_waiting(self) -> None:
        self._waiting = False
        try:
            await self.db.run("outbox_wait_done", {"relay_id": self.relay_id})
        except Exception:
            log.exception("could not unregister a waiting relay (its row expires)")

    async def _listen(self) -> None:
        async for _ in self.db.wakeups(CHANNEL):
            self._wake.set()

    async def idle_wait(self) -> float:
        """Seconds an idle relay sleeps (unless NOTIFY wakes it): until a retry falls due or
        another relay's claim runs out, at most the polling interval. Events waiting behind
        their key's head add nothing, so a blocked key never makes a relay spin."""
        wait = self.poll_interval
        try:
            rows = await self.db.run("outbox_next_attempt")
        except Exception:
            return wait
        if rows and rows[0]["wait"] is not None:
            wait = max(0.0, min(wait, float(rows[0]["wait"])))
        return wait

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0 or self._stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def run_once(self) -> int:
        """One round: claim a batch, publish it, mark it. Returns the number claimed."""
        if self.direct:
            try:
                return await self._run_direct()
            except Exception:
                log.exception("relaying in one transaction failed; publishing this round apart")
        rows = await self.db.run(
            "outbox_claim",
            {
                "limit": self.batch_size,
                "lease": self.lease.total_seconds(),
                "relay_id": self.relay_id,
            },
        )
        self.stats.rounds += 1
        if not rows:
            return 0
        events = [
            OutboxEvent(
                id=int(row["id"]),
                event_id=row["event_id"],
                queue=row["queue"],
                ordering_key=row["ordering_key"],
                correlation_id=row["correlation_id"],
                payload=bytes(row["payload"]),
                attempts=int(row["attempts"]),
                claim=row["claim_token"],
                trace_context=row["trace_context"],
                priority=int(row["priority"]),
            )
            for row in rows
        ]
        # First attempts go as one batch; retried events go one by one, so that one event a
        # transport refuses cannot keep failing the others.
        fresh = [e for e in events if e.attempts == 1]
        groups = ([fresh] if fresh else []) + [[e] for e in events if e.attempts > 1]
        for group in groups:
            await self._publish(group)
        return len(events)

    async def _run_direct(self) -> int:
        """Claim, queue as jobs and mark published in one statement and one transaction;
        ``on_published`` runs in that transaction, observers after the commit.

        The commit does not wait for its WAL flush (``synchronous_commit = off``): the events
        are durable already (their writers committed them), and this transaction is all or
        nothing — lost in a crash, the jobs and the marks go together and the events are
        relayed again. A job it queued is durably gone only after a worker's commit, which
        flushes the WAL up to it first."""
        began = time.time_ns()
        async with self.db.transaction() as tx:
            await tx.execute("SET LOCAL synchronous_commit = off")
            rows = await tx.q(
                "outbox_relay_to_jobs",
                {
                    "limit": self.batch_size,
                    "relay_id": self.relay_id,
                    "with_payload": self.on_published is not None or bool(self.observers),
                },
            )
            events = [
                OutboxEvent(
                    id=int(row["id"]),
                    event_id=row["event_id"],
                    queue=row["queue"],
                    ordering_key=row["ordering_key"],
                    correlation_id=row["correlation_id"],
                    payload=bytes(row["payload"] or b""),
                    attempts=int(row["attempts"]),
                    trace_context=row["trace_context"],
                    priority=int(row["priority"]),
                )
                for row in rows
            ]
            if events and self.on_published is not None:
                await self.on_published(tx, events)
        self.stats.rounds += 1
        if not events:
            return 0
        traces = self.app.runtime.tracing
        if traces is not None:
            traces.end_spans(traces.relay_spans(events, self.app.runtime.transport.name, began))
        self.app.runtime.transport.wake()
        for observer in self.observers:
            try:
                await observer.published(events)
            except Exception:
                log.exception("relay observer %s failed", type(observer).__name__)
        for event in events:
            PUBLISHED_EVENTS.labels(event.queue).inc()
        self.stats.published += len(events)
        return len(events)

    async def _publish(self, group: list[OutboxEvent]) -> None:
        traces = self.app.runtime.tracing
        spans = [] if traces is None else traces.relay_spans(group, self.app.runtime.transport.name)
        try:
            async with asyncio.timeout(self.publish_timeout.total_seconds()):
                await self.app.runtime.transport.publish([e.job() for e in group])
        except Exception as exc:
            if traces is not None:
                traces.end_spans(spans, exc)
            await self._failed(group, exc)
            return
        if traces is not None:
            traces.end_spans(spans)
        for observer in self.observers:
            try:
                await observer.published(group)
            except Exception:
                log.exception("relay observer %s failed", type(observer).__name__)
        try:
            await self._mark(group)
        except Exception:
            # published but not marked: the claim expires and the events go out again;
            # the consumer's fence absorbs the duplicate
            log.exception(
                "could not mark published events; they will be published again",
                extra={"events": [e.event_id for e in group]},
            )
            return
        for event in group:
            PUBLISHED_EVENTS.labels(event.queue).inc()
        self.stats.published += len(group)

    async def _mark(self, group: list[OutboxEvent]) -> None:
        ids = self.db.array([e.id for e in group])
        async with self.db.transaction() as tx:
            rows = await tx.q("outbox_mark_published", {"ids": ids})
            if self.on_published is not None and rows:
                marked = {int(row["id"]) for row in rows}
                await self.on_published(tx, [e for e in group if e.id in marked])

    async def _failed(self, group: list[OutboxEvent], exc: BaseException) -> None:
        if isinstance(exc, TimeoutError):
            exc = TimeoutError(
                f"the transport did not accept the event within "
                f"{self.publish_timeout.total_seconds():g}s"
            )
        category = classify(exc)
        error = describe(exc)
        code = error_code(exc)
        for event in group:
            delay = self.policy.delay(max(event.attempts, 1)).total_seconds()
            gave_up = False
            try:
                async with self.db.transaction() as tx:
                    rows = await tx.q(
                        "outbox_mark_failed",
                        {
                            "id": event.id,
                            "token": event.claim,
                            "max_attempts": self.policy.max_attempts,
                            "delay": delay,
                            "category": category.value,
                            "error": error,
                        },
                    )
                    gave_up = bool(rows) and rows[0]["state"] == PUBLISH_FAILED_RETRY
                    if gave_up:
                        await self._alert(tx, event, category, code, error)
            except Exception:
                log.exception(
                    "could not record a failed publish; the claim will expire",
                    extra={"event_id": event.event_id},
                )
                continue
            self.stats.failed_attempts += 1
            PUBLISH_FAILURES.labels(event.queue, category.value).inc()
            if gave_up:
                self.stats.gave_up += 1
                GAVE_UP.labels(event.queue).inc()
            level = logging.ERROR if gave_up else logging.WARNING
            log.log(
                level,
                "outbox event gave up: PUBLISH_FAILED_RETRY (re-drive it once the transport "
                "is back)"
                if gave_up
                else "outbox publish failed; will retry",
                extra={
                    "event_id": event.event_id,
                    "queue": event.queue,
                    "correlation_id": event.correlation_id,
                    "attempt": event.attempts,
                    "category": category.value,
                    "error": error,
                    **({} if gave_up else {"retry_in_s": round(delay, 3)}),
                },
            )
            for observer in self.observers:
                try:
                    observer.publish_failed(event, error, gave_up)
                except Exception:
                    log.exception("relay observer %s failed", type(observer).__name__)

    async def _alert(
        self, tx: Tx, event: OutboxEvent, category: Category, code: str | None, error: str
    ) -> None:
        from ..alerts import enqueue_alert

        await enqueue_alert(
            tx,
            source="outbox",
            queue=event.queue,
            category=category.value,
            fingerprint=f"outbox:{event.queue}:{code or category.value}",
            title=(
                f"outbox event could not be published to {event.queue!r} after "
                f"{event.attempts} attempts (PUBLISH_FAILED_RETRY)"
            ),
            details={
                "event_id": event.event_id,
                "queue": event.queue,
                "correlation_id": event.correlation_id or "",
                "attempts": str(event.attempts),
                "error_code": code or "",
                "last_error": error,
                "action": f"jobfence outbox redrive {event.event_id} --reason '…'",
            },
        )
