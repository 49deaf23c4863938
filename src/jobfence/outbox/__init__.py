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

The relay is :mod:`jobfence.outbox.relay`. A relay *claims* a batch (a lease, ``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, so several relays share the work), publishes it, then marks it
published. A relay killed between the publish and the mark leaves its claim to expire;
another relay publishes the events again and the fence absorbs the duplicate. Events with
the same ordering ``key`` are published one after the other, in the order they were written:
the next event of a key is not claimed before the previous one is published (a key whose
head event is ``PUBLISH_FAILED_RETRY`` waits for its re-drive, like a paused Pub/Sub
ordering key).

Relays wake on PostgreSQL ``LISTEN/NOTIFY`` (an insert trigger notifies at commit) and poll
as a fallback (SQLite always polls).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from .. import tracing
from ..core.jobs import DEFAULT_PRIORITY, outgoing_job
from ..db import Database, Tx, to_datetime
from ..db.adopt import SyncConnection, adopt_async
from ..errors import ConfigurationError, EnqueueError, InvalidRequest

log = logging.getLogger("jobfence.outbox")

PENDING = "PENDING"
PUBLISHED = "PUBLISHED"
PUBLISH_FAILED_RETRY = "PUBLISH_FAILED_RETRY"
STATES = (PENDING, PUBLISHED, PUBLISH_FAILED_RETRY)

MAX_KEY_LENGTH = 255

DEFAULT_RETENTION = timedelta(days=7)


# -- writing, in the caller's transaction ------------------------------------------------------


def _event(
    queue: str,
    payload: Any,
    event_id: str | None,
    key: str | None,
    correlation_id: str | None,
    priority: int = DEFAULT_PRIORITY,
) -> dict[str, Any]:
    job = outgoing_job(
        queue, payload, job_id=event_id, correlation_id=correlation_id, priority=priority
    )
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
        "trace_context": None,
        "priority": job.priority,
    }


def _creating(params: dict[str, Any], dialect: str) -> AbstractContextManager[str | None]:
    """The ``create`` span of an outbox write (docs/tracing.md), whose context the event and
    its job carry."""
    traces = tracing.get()
    if traces is None:
        return nullcontext(None)
    return traces.create(params["queue"], params["event_id"], params["correlation_id"], dialect)


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
    schema: str | None = None,
    priority: int = DEFAULT_PRIORITY,
) -> str:
    """Write one event in the caller's open transaction; return its event id.

    ``connection``: a jobfence :class:`~jobfence.db.Tx` (a handler's ``tx`` or one from
    ``db.transaction()``), a psycopg ``AsyncConnection``, an aiosqlite ``Connection`` or a
    SQLAlchemy ``AsyncSession``, inside a transaction the caller commits. ``event_id``
    defaults to a new UUID; it becomes the job_id the consumer fences on. ``key`` orders
    events: events with one key are published in the order they were written. Raises
    :class:`~jobfence.errors.EnqueueError` for a bad event or an event id already in the
    outbox (without aborting the transaction). ``schema``: where jobfence's tables are on
    PostgreSQL (default ``$JOBFENCE_SCHEMA``, else ``core``). ``priority``: the priority of
    the event's job, 0 (the default) to 9, higher runs first (docs/flow-control.md).
    """
    params = _event(queue, payload, event_id, key, correlation_id, priority)
    tx = await adopt_async(
        connection,
        doing="write an outbox event",
        sync_way="outbox.write_sync(tx, ...)",
        schema=schema,
    )
    with _creating(params, tx.dialect) as trace_context:
        params["trace_context"] = trace_context
        if not await tx.q("outbox_write", params):
            raise _duplicate(params["event_id"])
    return str(params["event_id"])


async def write_at_commit(
    tx: Tx,
    queue: str,
    payload: Any,
    *,
    event_id: str | None = None,
    key: str | None = None,
    correlation_id: str | None = None,
    priority: int = DEFAULT_PRIORITY,
) -> str:
    """:func:`write` in a transaction from :meth:`Database.work <jobfence.db.Database.work>`
    (e.g. ``idempotency_of(request).transaction``): the event goes to the server with the
    COMMIT, one round trip fewer (:meth:`Tx.q_at_commit <jobfence.db.Tx.q_at_commit>`). An
    event id already in the outbox then fails the commit (the whole transaction rolls back)
    instead of raising here, so leave ``event_id`` to the default (a new UUID) or make it
    unique yourself. Returns the event id."""
    params = _event(queue, payload, event_id, key, correlation_id, priority)
    with _creating(params, tx.dialect) as trace_context:
        params["trace_context"] = trace_context
        await tx.q_at_commit("outbox_write_at_commit", params)
    return str(params["event_id"])


def write_sync(
    connection: Any,
    queue: str,
    payload: Any,
    *,
    event_id: str | None = None,
    key: str | None = None,
    correlation_id: str | None = None,
    schema: str | None = None,
    priority: int = DEFAULT_PRIORITY,
) -> str:
    """:func:`write` for synchronous code: a psycopg ``Connection``, an ``sqlite3.Connection``
    or a plain ``def`` handler's ``tx``, inside a transaction the caller commits."""
    params = _event(queue, payload, event_id, key, correlation_id, priority)
    adopted = SyncConnection(connection, doing="write an outbox event", schema=schema)
    with _creating(params, adopted.dialect) as trace_context:
        params["trace_context"] = trace_context
        if not adopted.run("outbox_write", params):
            raise _duplicate(params["event_id"])
    return str(params["event_id"])


# -- reading and operating --------------------------------------------------------------------


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
    id: int = 0  # the row id: the cursor of the next page of list_events (not in to_json)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            if name == "id":
                continue
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
        id=int(row["id"]),
    )


async def list_events(
    db: Database,
    *,
    state: str | None = None,
    queue: str | None = None,
    limit: int = 50,
    before: int | None = None,
) -> list[EventSummary]:
    """Events newest first, optionally of one state and queue (no payloads); ``before``: the
    ``id`` of the previous page's last event (keyset pagination)."""
    if state is not None and state not in STATES:
        raise ConfigurationError(f"unknown outbox state {state!r}; one of {', '.join(STATES)}")
    rows = await db.run(
        "outbox_list", {"state": state, "queue": queue, "limit": limit, "before": before}
    )
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
    via: Literal["cli", "api", "library", "console"] = "library",
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
    from ..errors import ReviewConflict
    from ..review.deadletters import Actor, record

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
