"""The transactional outbox (SPEC O1–O3): events written with the domain row, published later.

An application writes its domain row and an outbox event in **one transaction**
(:func:`write`); the event exists only if that transaction commits. A :class:`Relay` publishes
pending events to the app's queue port (any transport: a database queue or a broker) with
``job_id = event_id``, so the consumer's fence turns a second publish into a skipped
duplicate (O3). States, enforced by CHECK constraints::

    PENDING ──publish ok──► PUBLISHED ──after the retention──► (deleted)
      │  ▲
      │  └── failure with attempts left: wait (backoff), try again
      └── failure on the 5th attempt ──► PUBLISH_FAILED_RETRY ──operator re-drive──► PENDING

A relay *claims* a batch (a lease, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so several
relays share the work), publishes it, then marks it published. A relay killed between the
publish and the mark leaves its claim to expire; another relay publishes the events again
and the fence absorbs the duplicate. Events with the same ordering ``key`` are published one
after the other, in the order they were written: the next event of a key is not claimed
before the previous one is published (a key whose head event is ``PUBLISH_FAILED_RETRY``
waits for its re-drive, like a paused Pub/Sub ordering key).

Relays wake on PostgreSQL ``LISTEN/NOTIFY`` (an insert trigger notifies at commit) and poll
as a fallback (SQLite always polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from prometheus_client import Counter

from .db import Database, Tx, to_datetime
from .db.adopt import SyncConnection, adopt
from .errors import (
    Category,
    ConfigurationError,
    EnqueueError,
    InvalidRequest,
    classify,
    describe,
    error_code,
)
from .retry import RetryPolicy
from .store import OutgoingJob

if TYPE_CHECKING:
    from fastapi import APIRouter

    from .app import App

log = logging.getLogger("jobfence.outbox")

PENDING = "PENDING"
PUBLISHED = "PUBLISHED"
PUBLISH_FAILED_RETRY = "PUBLISH_FAILED_RETRY"
STATES = (PENDING, PUBLISHED, PUBLISH_FAILED_RETRY)

CHANNEL = "jobfence_outbox"
MAX_KEY_LENGTH = 255

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
DEFAULT_RETENTION = timedelta(days=7)
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


# -- writing, in the caller's transaction ------------------------------------------------------


def _event(
    queue: str,
    payload: Any,
    event_id: str | None,
    key: str | None,
    correlation_id: str | None,
) -> dict[str, Any]:
    from .app import App

    job = App.job(queue, payload, job_id=event_id, correlation_id=correlation_id)
    if key is not None:
        if not isinstance(key, str) or not key or "\x00" in key:
            raise EnqueueError("the ordering key must be a non-empty string without NUL")
        if len(key) > MAX_KEY_LENGTH:
            raise EnqueueError(f"the ordering key is longer than {MAX_KEY_LENGTH} characters")
    return {
        "event_id": job.job_id,
        "queue": job.queue,
        "ordering_key": key,
        "correlation_id": job.correlation_id,
        "payload": job.payload,
    }


def _duplicate(event_id: str) -> EnqueueError:
    return EnqueueError(
        f"event {event_id!r} is already in the outbox; an event id is written once (it is the "
        "job_id the consumer fences on)"
    )


async def write(
    connection: Any,
    queue: str,
    payload: Any,
    *,
    event_id: str | None = None,
    key: str | None = None,
    correlation_id: str | None = None,
) -> str:
    """Write one event in the caller's open transaction; return its event id.

    ``connection``: a jobfence :class:`~jobfence.db.Tx` (a handler's ``tx`` or one from
    ``db.transaction()``), a psycopg ``AsyncConnection`` or an aiosqlite ``Connection``, inside
    a transaction the caller commits. ``event_id`` defaults to a new UUID; it becomes the
    job_id the consumer fences on. ``key`` orders events: events with one key are published in
    the order they were written. Raises :class:`~jobfence.errors.EnqueueError` for a bad event
    or an event id already in the outbox (without aborting the transaction).
    """
    params = _event(queue, payload, event_id, key, correlation_id)
    tx = adopt(connection, doing="write an outbox event", sync_way="outbox.write_sync(tx, ...)")
    if not await tx.q("outbox_write", params):
        raise _duplicate(params["event_id"])
    return str(params["event_id"])


def write_sync(
    connection: Any,
    queue: str,
    payload: Any,
    *,
    event_id: str | None = None,
    key: str | None = None,
    correlation_id: str | None = None,
) -> str:
    """:func:`write` for synchronous code: a psycopg ``Connection``, an ``sqlite3.Connection``
    or a plain ``def`` handler's ``tx``, inside a transaction the caller commits."""
    params = _event(queue, payload, event_id, key, correlation_id)
    rows = SyncConnection(connection, doing="write an outbox event").run("outbox_write", params)
    if not rows:
        raise _duplicate(params["event_id"])
    return str(params["event_id"])


# -- reading and operating --------------------------------------------------------------------


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

    def job(self) -> OutgoingJob:
        return OutgoingJob(self.queue, self.event_id, self.payload, self.correlation_id)


@dataclass(frozen=True)
class EventSummary:
    """An event for people (no payload)."""

    event_id: str
    queue: str
    ordering_key: str | None
    correlation_id: str | None
    state: str
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    created_at: datetime | None
    published_at: datetime | None
    payload_size: int
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            data[name] = value.isoformat() if isinstance(value, datetime) else value
        return data


def _summary(row: Mapping[str, Any]) -> EventSummary:
    history = row.get("history")
    if isinstance(history, str | bytes):
        history = json.loads(history)
    return EventSummary(
        event_id=row["event_id"],
        queue=row["queue"],
        ordering_key=row["ordering_key"],
        correlation_id=row["correlation_id"],
        state=row["state"],
        attempts=int(row["attempts"]),
        next_attempt_at=to_datetime(row["next_attempt_at"]),
        last_error=row["last_error"],
        created_at=to_datetime(row["created_at"]),
        published_at=to_datetime(row["published_at"]),
        payload_size=int(row["payload_size"]),
        history=list(history or []),
    )


async def list_events(
    db: Database, *, state: str | None = None, queue: str | None = None, limit: int = 50
) -> list[EventSummary]:
    """Events newest first, optionally of one state and queue (no payloads)."""
    if state is not None and state not in STATES:
        raise ConfigurationError(f"unknown outbox state {state!r}; one of {', '.join(STATES)}")
    rows = await db.run("outbox_list", {"state": state, "queue": queue, "limit": limit})
    return [_summary(row) for row in rows]


async def get_event(db: Database, event_id: str) -> EventSummary | None:
    """One event with its history of failed attempts and re-drives."""
    rows = await db.run("outbox_get", {"event_id": event_id})
    return _summary(rows[0]) if rows else None


async def counts(db: Database) -> dict[str, int]:
    """Number of events per state (every state present, zero when none)."""
    found = {row["state"]: int(row["events"]) for row in await db.run("outbox_counts")}
    return {state: found.get(state, 0) for state in STATES}


@dataclass(frozen=True)
class RedrivePreview:
    """What re-driving every failed event (of ``queue``) would touch: how many, per queue,
    and a sample (newest first). Confirm ``total`` as ``expected_total``."""

    total: int
    queues: dict[str, int]
    sample: list[EventSummary]
    queue: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "queue": self.queue,
            "queues": [{"queue": q, "events": n} for q, n in self.queues.items()],
            "sample": [e.to_json() for e in self.sample],
            "confirm": {"all": True, "queue": self.queue, "expected_total": self.total},
        }


def _queue(queue: str | None) -> str | None:

    if queue is not None and (not queue or len(queue) > 200 or "\x00" in queue):
        raise InvalidRequest("queue must be 1–200 characters without NUL")
    return queue


async def preview_redrive(
    db: Database, *, queue: str | None = None, sample: int = 10
) -> RedrivePreview:
    """Count the ``PUBLISH_FAILED_RETRY`` events (of ``queue``) a re-drive of all of them
    would take. Changes nothing."""

    if not 0 <= sample <= 100:
        raise InvalidRequest("sample must be between 0 and 100")
    _queue(queue)
    rows = await db.run("outbox_failed_counts", {"queue": queue})
    per_queue = {str(row["queue"]): int(row["events"]) for row in rows}
    shown = await list_events(db, state=PUBLISH_FAILED_RETRY, queue=queue, limit=sample)
    return RedrivePreview(sum(per_queue.values()), per_queue, shown, queue)


async def redrive(
    db: Database,
    *,
    actor: str,
    reason: str,
    event_ids: Sequence[str] | None = None,
    all_failed: bool = False,
    queue: str | None = None,
    expected_total: int | None = None,
    via: Literal["cli", "api", "library"] = "library",
) -> list[str]:
    """Put ``PUBLISH_FAILED_RETRY`` events back to ``PENDING`` with 5 fresh attempts.

    Which events is always explicit: name them (``event_ids``), or ask for every failed event
    (of ``queue``) with ``all_failed=True`` *and* ``expected_total``, the count
    :func:`preview_redrive` showed — when the failed events are no longer that many, nothing
    happens and :class:`~jobfence.errors.ReviewConflict` says so. Without either the call is
    refused (:class:`~jobfence.errors.InvalidRequest`): no ids never means "all".

    Who and why go into each event's history and, in the same transaction, one row of the
    audit log (``outbox.redrive``). Returns the event ids re-driven; events in another state
    are left alone, so repeating a re-drive is harmless (and audits nothing).
    """
    from .deadletters import Actor, record
    from .errors import ReviewConflict

    who = Actor(actor, via)
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigurationError("a re-drive needs a reason: say why the events may go out now")
    if queue is not None and not all_failed:
        raise InvalidRequest("queue goes with all_failed: named events are re-driven as named")
    if (event_ids is not None) == all_failed:
        raise InvalidRequest(
            "name the events to re-drive (event_ids), or ask for every PUBLISH_FAILED_RETRY "
            "event explicitly (all_failed, after a preview) — not both, not neither"
        )
    _queue(queue)
    if all_failed and expected_total is None:
        raise InvalidRequest(
            "re-driving every failed event needs the count you confirmed: preview first "
            "(preview_redrive, GET …/outbox/events/redrive/preview, or the CLI's --all without "
            "--yes) and pass its total as expected_total"
        )
    if event_ids is not None and not event_ids:
        return []
    async with db.transaction() as tx:
        if all_failed:
            locked = [
                str(r["event_id"]) for r in await tx.q("outbox_failed_lock", {"queue": queue})
            ]
            if len(locked) != expected_total:
                where = f" in queue {queue!r}" if queue is not None else ""
                raise ReviewConflict(
                    f"{len(locked)} events are PUBLISH_FAILED_RETRY{where}, not the "
                    f"{expected_total} expected; preview again to see them"
                )
            event_ids = locked
            if not locked:
                return []
        rows = await tx.q(
            "outbox_redrive",
            {
                "actor": who.name,
                "reason": reason,
                "event_ids": db.array(event_ids),
                "queue": queue,
            },
        )
        ids = [str(row["event_id"]) for row in rows]
        if ids:
            details: dict[str, Any] = {"event_ids": ids, "queue": queue}
            if all_failed:
                details.update({"all": True, "expected_total": expected_total})
            await record(
                tx,
                who,
                "outbox.redrive",
                reason=reason,
                details=details,
                old_state=PUBLISH_FAILED_RETRY,
                new_state=PENDING,
            )
    if ids:
        log.warning(
            "outbox events re-driven", extra={"events": len(ids), "by": actor, "reason": reason}
        )
    return ids


async def cleanup(db: Database, retention: timedelta = DEFAULT_RETENTION, batch: int = 1000) -> int:
    """Delete published events older than ``retention`` in bounded batches; return how many."""
    total = 0
    while True:
        rows = await db.run(
            "outbox_cleanup", {"retention": retention.total_seconds(), "limit": batch}
        )
        total += len(rows)
        if len(rows) < batch:
            return total


# -- the relay -------------------------------------------------------------------------------


class RelayObserver:
    """Hooks of a relay; no-ops by default. A hook that raises is logged and ignored."""

    async def published(self, events: Sequence[OutboxEvent]) -> None:
        """The transport accepted ``events``; they are not marked published yet (a crash now
        means they are published again, and the consumer's fence absorbs it)."""

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


class Relay:
    """Publishes outbox events from ``app``'s database to ``app.transport``.

    Run it on its own (``jobfence relay``) or inside a worker's process
    (``relay.start()`` … ``await relay.stop()``); run as many as you like.

    ``on_published(tx, events)`` runs in the transaction that marks events published (e.g. to
    move a domain row to PUBLISHED); if it raises, the mark rolls back and the events are
    published again after their claim expires.
    """

    def __init__(
        self,
        app: App,
        *,
        batch_size: int = 100,
        poll_interval: float | None = None,
        lease: timedelta = DEFAULT_LEASE,
        policy: RetryPolicy = DEFAULT_PUBLISH_POLICY,
        publish_timeout: timedelta = DEFAULT_PUBLISH_TIMEOUT,
        retention: timedelta = DEFAULT_RETENTION,
        cleanup_interval: timedelta = timedelta(minutes=1),
        on_published: OnPublished | None = None,
        observers: Sequence[RelayObserver] = (),
        relay_id: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigurationError("the relay's batch_size must be at least 1")
        if lease <= publish_timeout:
            raise ConfigurationError(
                f"the relay's claim lease ({lease}) must be longer than its publish timeout "
                f"({publish_timeout}), or a slow publish would be claimed twice"
            )
        if retention <= timedelta(0):
            raise ConfigurationError("the outbox retention must be a positive duration")
        self.app = app
        self.batch_size = batch_size
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

    @property
    def poll_interval(self) -> float:
        if self._poll_interval is not None:
            return self._poll_interval
        # PostgreSQL relays are woken by NOTIFY; polling is only the fallback
        return 5.0 if self.app.url.dialect == "postgresql" else 0.2

    @property
    def db(self) -> Database:
        return self.app.db

    def wake(self) -> None:
        """Look for events now (events were written in this process)."""
        self._wake.set()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def start(self) -> asyncio.Task[RelayStats]:
        """Run in the background of the current event loop (e.g. next to a worker)."""
        if self._task is None or self._task.done():
            self._stop.clear()
            self._task = asyncio.create_task(self.run(), name=f"jobfence-{self.relay_id}")
        return self._task

    async def stop(self) -> RelayStats:
        """Stop a relay started with :meth:`start` after its current round."""
        self.request_stop()
        if self._task is not None:
            await self._task
        return self.stats

    async def run(self, *, install_signal_handlers: bool = False) -> RelayStats:
        """Publish until :meth:`request_stop` (or SIGTERM/SIGINT with signal handlers)."""
        await self.app.open()
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        listener = None
        if self.db.dialect == "postgresql":
            listener = asyncio.create_task(self._listen(), name="jobfence-outbox-listen")
        log.info(
            "relay started",
            extra={
                "relay": self.relay_id,
                "database": self.db.display,
                "transport": self.app.transport.name,
            },
        )
        next_cleanup = 0.0
        try:
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
                    continue
                await self._sleep(await self.idle_wait())
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            log.info(
                "relay stopped", extra={"relay": self.relay_id, "published": self.stats.published}
            )
        return self.stats

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
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def run_once(self) -> int:
        """One round: claim a batch, publish it, mark it. Returns the number claimed."""
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

    async def _publish(self, group: list[OutboxEvent]) -> None:
        try:
            await asyncio.wait_for(
                self.app.transport.publish([e.job() for e in group]),
                timeout=self.publish_timeout.total_seconds(),
            )
        except Exception as exc:
            await self._failed(group, exc)
            return
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
        from .alerts import enqueue_alert

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


# -- the ops API route -------------------------------------------------------------------------


def ops_router() -> APIRouter:
    """FastAPI routes for operators: list/show outbox events and re-drive failed ones (see
    :mod:`jobfence.http.ops_outbox`; needs the ``ops`` extra)."""
    from .http.ops_outbox import router

    return router()
