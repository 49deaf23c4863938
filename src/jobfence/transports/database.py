"""The database queue: a table in PostgreSQL or SQLite (the default transports).

Claims use ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (SQLite has a single writer). A claim
takes a lease; a worker renews its leases while it works; leases that run out (a killed
worker) are returned to the queue by any worker's maintenance, and that lost delivery counts
as an attempt. Idle workers wake on PostgreSQL LISTEN/NOTIFY; SQLite workers poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from ..core.jobs import Delivery, OutgoingJob, history_from, history_json, partner_of
from ..core.limits import Limit
from ..db import Database, Tx, to_datetime
from ..db.adopt import SyncConnection
from ..errors import Category
from ..sql import Dialect
from . import Transport
from .shielded import ShieldedFetch

log = logging.getLogger("jobfence.transport")

CHANNEL = "jobfence_jobs"
#: the category of a deferral in a job's history (not an error: no attempt was consumed)
DEFERRED = "DEFERRED"

MiB = 1024 * 1024
#: Room kept for a job row's other columns (ids, history) next to its payload.
ROW_ROOM = MiB
#: PostgreSQL returns a ``bytea`` as hex text, two characters a byte, and one value (indeed
#: one row) sent as text must stay under 1 GiB (MaxAllocSize): a payload of 512 MiB - 1 is
#: stored, but every claim of it then fails ("invalid memory alloc request size"), which
#: blocks its queue. 512 MiB less room for the other columns.
POSTGRESQL_MAX_PAYLOAD = 512 * MiB - ROW_ROOM


#: the rows a claim over several queues may lock in each queue, at least (or the whole limit)
PER_QUEUE_MIN = 50
#: a limited queue's claim reads at most this many due jobs of keys with room per job it may
#: take (at least FLOW_SCAN_MIN): a key with little room but many jobs at the head of the
#: queue fills this claim with less, and the next one skips it (saturated)
FLOW_SCAN_FACTOR = 4
FLOW_SCAN_MIN = 200
#: a limited claim hands back every expired job of its queue (no batch bound)
REAP_ALL = 2**31 - 1


def per_queue_limit(limit: int, queues: int) -> int:
    """How many ready jobs a claim of ``limit`` takes (and locks) from each of ``queues``
    queues at most: the whole limit for one queue; over several, an even share but never
    less than ``PER_QUEUE_MIN`` (a group-commit batch), so that one busy queue among idle
    ones still fills a batch per claim. The claim locks every row its queues' ranges take
    before it keeps the oldest ``limit``: without the share, 100 queues with work lock 100 ×
    ``limit`` rows to claim ``limit``."""
    if queues <= 1:
        return limit
    return min(limit, max(-(-limit // queues), PER_QUEUE_MIN))


@functools.cache
def _sqlite_max_length() -> int:
    """SQLite's largest string, BLOB and row (SQLITE_MAX_LENGTH, 1 000 000 000 by default)."""
    conn = sqlite3.connect(":memory:")
    try:
        return conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
    finally:
        conn.close()


def database_max_payload(dialect: str) -> int:
    """The largest payload a database queue of ``dialect`` takes, in bytes."""
    if dialect == "sqlite":
        return _sqlite_max_length() - ROW_ROOM
    return POSTGRESQL_MAX_PAYLOAD


def database_max_payload_reason(dialect: str) -> str:
    if dialect == "sqlite":
        return (
            f"SQLite's largest row, {_sqlite_max_length()} bytes, less room for the other columns"
        )
    return (
        "a bytea is read back as hex text, which must stay under PostgreSQL's 1 GiB per row, "
        "less room for the other columns"
    )


#: Every this many claim rounds, a worker claims by age alone (``claim_by_age``), priorities
#: aside: a due job then waits at most for the due jobs older than it, never for newer ones
#: of a higher priority, so no priority is starved (docs/flow-control.md "Priorities").
AGE_ROUND_EVERY = 10


#: from this many jobs on, a bulk enqueue on PostgreSQL uses COPY instead of batched INSERTs
COPY_THRESHOLD = 64


async def enqueue(tx: Tx, jobs: Sequence[OutgoingJob]) -> None:
    """Write ``jobs`` into the queue's table in ``tx`` (one INSERT, a batch, or — from
    :data:`COPY_THRESHOLD` jobs without a delay on PostgreSQL — COPY); ``tx`` commits them."""
    params = [job.params() for job in jobs]
    if len(params) == 1:
        await tx.q("enqueue", params[0])
    elif len(params) >= COPY_THRESHOLD and tx.can_copy and not any(p["delay"] for p in params):
        rows = (
            (
                p["queue"],
                p["job_id"],
                p["correlation_id"],
                p["payload"],
                p["partner"],
                p["trace_context"],
                p["priority"],
                p["flow_key"],
            )
            for p in params
        )
        types = ["text", "text", "text", "bytea", "text", "text", "int2", "text"]
        await tx.copy("copy_jobs", rows, types)
    else:
        await tx.qmany("enqueue", params)


def enqueue_sync(conn: Any, jobs: Sequence[OutgoingJob], dialect: Dialect, schema: str) -> None:
    """Enqueue on a caller's *sync* connection (psycopg ``Connection`` or ``sqlite3``),
    inside whatever transaction the caller has open; the caller commits."""
    adopted = SyncConnection(conn, doing="enqueue", dialect=dialect, schema=schema)
    adopted.run_many("enqueue", [job.params() for job in jobs])


async def _write_back(
    tx: Tx,
    delivery: Delivery,
    attempts: int,
    delay: timedelta,
    category: str,
    error: str,
    trace: str | None,
) -> None:
    """Write ``delivery``'s row again in ``tx`` (its row was acked in ``tx`` by a group
    commit), due after ``delay``, with ``attempts`` used and an entry for this attempt in its
    history: every column the job had — priority and flow key included — goes back with it."""
    await tx.q(
        "requeue",
        {
            "queue": delivery.queue,
            "job_id": delivery.job_id,
            "correlation_id": delivery.correlation_id,
            "payload": delivery.payload,
            "attempts": attempts,
            "delay": delay.total_seconds(),
            "enqueued_at": delivery.enqueued_at,
            "history": history_json(delivery.history),
            "partner": partner_of(delivery.payload),
            "trace_context": delivery.trace_context,
            "priority": delivery.priority,
            "category": category,
            "error": error,
            "trace": trace,
            "flow_key": delivery.flow_key,
        },
    )


class DatabaseQueue(Transport):
    """Jobs as rows of ``core.jobs`` in the given database."""

    priorities = True

    def __init__(
        self,
        db: Database,
        *,
        shares_database: bool,
        lease: timedelta = timedelta(seconds=30),
        worker_id: str | None = None,
        sqlite_poll: float = 0.05,
    ) -> None:
        self.db = self.queue_db = db
        self.name = db.dialect
        self.shares_database = shares_database
        self.lease = lease
        self.worker_id = worker_id or f"{uuid.uuid4().hex[:12]}"
        self._sqlite_poll = sqlite_poll
        self._wake = asyncio.Event()
        self._listened: set[str] = set()
        self._listener: asyncio.Task[None] | None = None
        # the queues whose last claim came back short: until a wake-up, claiming them again
        # at once would find nothing (PostgreSQL only, where enqueues notify)
        self._drained: tuple[str, ...] | None = None
        self._reads = ShieldedFetch()
        self._rounds = 0  # claim rounds so far (AGE_ROUND_EVERY)
        #: flow control: the queues with a Limit, claimed by flow_claim (docs/flow-control.md)
        self.limits: dict[str, Limit] = {}

    def use_limits(self, limits: Mapping[str, Limit]) -> None:
        self.limits = dict(limits)

    def _queues_param(self, queues: Sequence[str]) -> Any:
        return self.db.array(queues)

    async def close(self) -> None:
        for delivery in await self._reads.settle():
            try:
                await self.release(delivery, attempted=False)
            except Exception:
                log.exception("could not hand back a claimed job; its lease will expire")
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None

    @property
    def max_payload(self) -> int:
        return database_max_payload(self.db.dialect)

    @property
    def max_payload_reason(self) -> str:
        return database_max_payload_reason(self.db.dialect)

    async def publish(self, jobs: Sequence[OutgoingJob]) -> None:
        self.check_payloads(jobs)
        async with self.db.transaction() as tx:
            await enqueue(tx, jobs)
        self.wake()

    async def publish_tx(self, tx: Tx, jobs: Sequence[OutgoingJob]) -> bool:
        if not self.shares_database:
            return await super().publish_tx(tx, jobs)
        self.check_payloads(jobs)
        await enqueue(tx, jobs)
        return True  # the caller wakes local workers after its commit

    def commits_with(self, db: Database) -> bool:
        return self.shares_database and self.db is db

    def wake(self) -> None:
        self._wake.set()

    async def _listen(self) -> None:
        async for queue in self.db.wakeups(CHANNEL):
            if not queue or queue in self._listened:
                self._wake.set()

    async def _claim(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        if not self.limits:
            return await self._claim_plain(queues, limit)
        plain = [q for q in queues if q not in self.limits]
        share = per_queue_limit(limit, len(queues))
        found: list[Delivery] = []
        for queue in queues:
            if queue in self.limits and len(found) < limit:
                found += await self._claim_limited(queue, min(share, limit - len(found)))
        if plain and len(found) < limit:
            found += await self._claim_plain(plain, limit - len(found))
        return found

    async def _claim_limited(self, queue: str, limit: int) -> list[Delivery]:
        """The claim of a queue with a Limit: under its flow lock, a killed worker's expired
        jobs handed back (their slots free from their lease's end), due jobs of keys with
        room claimed and their starts recorded, in one transaction (``flow_claim``)."""
        flow = self.limits[queue]
        rate = flow.rate
        async with self.db.transaction() as tx:
            if tx.dialect == "postgresql":
                await tx.q("flow_lock", {"queue": queue})
            await tx.q("reap_expired", {"queue": queue, "limit": REAP_ALL})
            rows = await tx.q(
                "flow_claim",
                {
                    "queue": queue,
                    "limit": limit,
                    "scan": max(limit * FLOW_SCAN_FACTOR, FLOW_SCAN_MIN),
                    "concurrency": flow.concurrency,
                    "rate": rate.count if rate is not None else None,
                    "per": rate.seconds if rate is not None else 0.0,
                    "lease": self.lease.total_seconds(),
                    "worker_id": self.worker_id,
                },
            )
            if rows and rate is not None:
                # at the time the claim counted the window (the earliest of its rows' clock
                # on SQLite): a claim's own duration never shifts the next window
                keys = [row["flow_key"] for row in rows]
                at = min(row["claimed_at"] for row in rows)
                params = {"queue": queue, "keys": self.db.array(keys), "at": at}
                await tx.q("flow_record_starts", params)
        return self._deliveries(rows)

    async def _claim_plain(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        # every AGE_ROUND_EVERY-th round by age alone: the bound on starving a low priority
        self._rounds += 1
        by_age = self._rounds % AGE_ROUND_EVERY == 0
        rows = await self.db.run(
            "claim_by_age" if by_age else "claim",
            {
                "queues": self._queues_param(queues),
                "limit": limit,
                "per_queue": per_queue_limit(limit, len(queues)),
                "lease": self.lease.total_seconds(),
                "worker_id": self.worker_id,
            },
        )
        return self._deliveries(rows)

    def _deliveries(self, rows: Sequence[Mapping[str, Any]]) -> list[Delivery]:
        return [
            Delivery(
                queue=row["queue"],
                job_id=row["job_id"],
                payload=bytes(row["payload"]),
                attempt=int(row["attempts"]),
                correlation_id=row["correlation_id"],
                enqueued_at=to_datetime(row["enqueued_at"]),
                history=history_from(row["history"]),
                token=row["lease_token"],
                ref=row["id"],
                trace_context=row["trace_context"],
                priority=int(row["priority"]),
                flow_key=row.get("flow_key"),
            )
            for row in rows
        ]

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        if limit <= 0:
            return []
        kept = self._reads.take(limit)  # claimed by a fetch that was cancelled
        if kept:
            return kept
        postgres = self.db.dialect == "postgresql"
        if postgres and self._listener is None:
            self._listened = set(queues)
            self._listener = asyncio.create_task(self._listen(), name="jobfence-listen")
        # Skip the first claim when the last one drained these queues and nothing woke us
        # since: at low rates that is one empty claim per job less. Jobs that become due by
        # time are covered by next_run_at below, enqueues and releases by the wake-up.
        if not (postgres and self._drained == tuple(queues) and not self._wake.is_set()):
            found = await self._claim_noting(queues, limit)
            if found:
                return found
        wait = min(timeout, await self._next_wait(queues))
        if self.db.dialect == "sqlite":
            # No notifications across processes: poll briefly (in-process enqueues wake us).
            wait = min(wait, self._sqlite_poll)
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
        return await self._claim_noting(queues, limit)

    async def _next_wait(self, queues: Sequence[str]) -> float:
        """Seconds until a job of ``queues`` can be claimed at the earliest (inf: none waits):
        a due time; on a limited queue also a back-off's end, the rate window's oldest start
        leaving it, a full key's first lease running out (a job's end wakes the worker)."""
        plain = [q for q in queues if q not in self.limits]
        waits: list[float] = []
        if plain:
            rows = await self.db.run("next_run_at", {"queues": self._queues_param(plain)})
            if rows and rows[0]["wait"] is not None:
                waits.append(float(rows[0]["wait"]))
        for queue in queues:
            flow = self.limits.get(queue)
            if flow is None:
                continue
            rate = flow.rate
            rows = await self.db.run(
                "flow_next_run",
                {
                    "queue": queue,
                    "concurrency": flow.concurrency,
                    "rate": rate.count if rate is not None else None,
                    "per": rate.seconds if rate is not None else 0.0,
                },
            )
            if rows and rows[0]["wait"] is not None:
                waits.append(float(rows[0]["wait"]))
        return max(0.0, min(waits, default=float("inf")))

    async def _claim_noting(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """Claim, noting whether the queues were drained. The wake-up flag is cleared
        first, so a notification that arrives during the claim is not lost."""
        self._wake.clear()
        # shielded: a claim cancelled mid-statement may have committed at the server (a worker
        # cancels its fetch when it stops); its jobs are kept for the next fetch, or handed back
        # refunded on close, instead of waiting out their lease with an attempt lost
        found = await self._reads.run(self._claim(queues, limit))
        # fewer than one queue's share: every queue gave all it had ready
        drained = len(found) < per_queue_limit(limit, len(queues))
        self._drained = tuple(queues) if drained else None
        return found

    def _ref(self, delivery: Delivery) -> dict[str, Any]:
        return {"id": delivery.ref, "token": delivery.token}

    async def ack(self, delivery: Delivery) -> None:
        await self.db.run("ack", self._ref(delivery))

    async def retry(
        self,
        delivery: Delivery,
        delay: timedelta,
        category: Category,
        error: str,
        *,
        trace: str | None = None,
    ) -> None:
        await self.db.run(
            "retry",
            {
                **self._ref(delivery),
                "delay": delay.total_seconds(),
                "category": category.value,
                "error": error,
                "trace": trace,
            },
        )

    async def requeue_tx(
        self,
        tx: Tx,
        delivery: Delivery,
        delay: timedelta,
        category: Category,
        error: str,
        *,
        trace: str | None = None,
    ) -> None:
        """:meth:`retry` for a delivery whose queue row was already acked in ``tx`` (group
        commit): the row is written again, scheduled, with this attempt in its history, in
        the caller's transaction."""
        await _write_back(tx, delivery, delivery.attempt, delay, category.value, error, trace)

    async def defer(self, delivery: Delivery, delay: timedelta, *, note: str | None = None) -> None:
        await self.db.run(
            "defer", {**self._ref(delivery), "delay": delay.total_seconds(), "note": note}
        )
        self.wake()

    async def defer_tx(self, tx: Tx, delivery: Delivery, delay: timedelta, note: str) -> None:
        """:meth:`defer` for a delivery already acked in ``tx`` (group commit): its row is
        written again, scheduled, the attempt refunded, the deferral in its history."""
        await _write_back(tx, delivery, max(delivery.attempt - 1, 0), delay, DEFERRED, note, None)

    async def release(self, delivery: Delivery, *, attempted: bool) -> None:
        await self.db.run("release", {**self._ref(delivery), "refund": 0 if attempted else 1})
        self.wake()

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        params = {
            "ids": self.db.array(d.ref for d in deliveries),
            "tokens": self.db.array(d.token for d in deliveries),
            "lease": self.lease.total_seconds(),
        }
        await self.db.run("extend_leases", params)

    async def maintenance(self) -> None:
        rows = await self.db.run("reap_expired", {"queue": None, "limit": 1000})
        if rows:
            queues = sorted({row["queue"] for row in rows})
            log.warning(
                "returned jobs whose lease expired (worker killed or lost)",
                extra={"jobs": len(rows), "queues": queues},
            )
            if self.db.dialect == "postgresql":
                await self.db.run("notify_queues", {"queues": queues})
            self.wake()


def queue_in(
    db: Database, *, fence_db: Database, lease: timedelta, worker_id: str | None
) -> Transport:
    """The database queue in ``db``; its acks and :meth:`~Transport.publish_tx` join the work
    transaction when ``db`` is ``fence_db``, the database of the fence and the handlers'
    work (:meth:`~Transport.commits_with`)."""
    return DatabaseQueue(db, shares_database=db is fence_db, lease=lease, worker_id=worker_id)
