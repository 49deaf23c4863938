"""Fence expiry (SPEC T1, T2) and the background duties of workers.

A fence row may go once it has expired (``expires_at``, set from the app's fence TTL when the
job ran) — but **never**:

- while it is younger than ``min_age``, the longest time a delivery of its job can still
  arrive (retry window + one lease per attempt, see :func:`jobfence.app.fence_exposure`) —
  a second guard next to the TTL check at start-up;
- while its job_id has a dead letter pending review, or one replayed less than ``min_age``
  ago (a replay must meet the fence);
- while a job with its job_id is still retrying in this database's queue.

Cleanup deletes in bounded batches, oldest first, each batch its own short transaction found
through the ``expires_at`` index (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), so a worker
inserting fences is never held up for more than one batch. One cleaner runs at a time: the
``fence-cleanup`` row of the lease table, renewed inside every batch's transaction, so a
cleaner that stalled past its lease can never commit another batch. Works the same on
PostgreSQL and SQLite (whose single writer alternates batches with the workers' commits).

:func:`housekeeping` is what a worker runs in the background: cleanup every
``Maintenance.cleanup_interval``, alert delivery, and the database gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .db import Database, Tx

if TYPE_CHECKING:
    from .alerts import AlertSink
    from .app import App

log = logging.getLogger("jobfence.cleanup")

LEASE_NAME = "fence-cleanup"
LEASE_TTL = timedelta(minutes=2)
DEFAULT_BATCH = 5000
DEFAULT_INTERVAL = timedelta(minutes=5)


@dataclass(frozen=True)
class Maintenance:
    """What a worker does in the background besides its jobs (``App(maintenance=…)``).

    ``alert_sinks`` None means "from the environment" (see :func:`jobfence.alerts.sinks_from_env`);
    an empty list means "record alerts, deliver them nowhere".
    """

    cleanup: bool = True
    cleanup_interval: timedelta = DEFAULT_INTERVAL
    cleanup_batch: int = DEFAULT_BATCH
    alerts: bool = True
    alert_sinks: Sequence[AlertSink] | None = None
    alert_interval: timedelta = timedelta(seconds=5)
    alert_window: timedelta = timedelta(minutes=5)
    alert_timeout: timedelta = timedelta(seconds=10)
    gauges_interval: timedelta = timedelta(seconds=30)

    def __post_init__(self) -> None:
        from .errors import ConfigurationError

        if self.cleanup_batch < 1:
            raise ConfigurationError("cleanup_batch must be at least 1")
        for name in (
            "cleanup_interval",
            "alert_interval",
            "alert_window",
            "alert_timeout",
            "gauges_interval",
        ):
            if getattr(self, name) <= timedelta(0):
                raise ConfigurationError(f"{name} must be a positive duration")


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Lease:
    """A named lease row: one holder at a time for a background duty, expiring if the holder
    dies. ``renew(tx)`` inside a duty's own transaction makes its work conditional on still
    holding the lease."""

    def __init__(self, db: Database, name: str, holder: str, ttl: timedelta) -> None:
        self.db, self.name, self.holder, self.ttl = db, name, holder, ttl

    def _params(self) -> dict[str, object]:
        return {"name": self.name, "holder": self.holder, "ttl": self.ttl.total_seconds()}

    async def acquire(self) -> bool:
        async with self.db.transaction() as tx:
            return bool(await tx.q("lease_acquire", self._params()))

    async def renew(self, tx: Tx) -> bool:
        return bool(await tx.q("lease_renew", self._params()))

    async def release(self) -> None:
        async with self.db.transaction() as tx:
            await tx.q("lease_release", {"name": self.name, "holder": self.holder})

    async def current_holder(self) -> str | None:
        rows = await self.db.run("lease_holder", {"name": self.name})
        return str(rows[0]["holder"]) if rows else None


@dataclass(frozen=True)
class CleanupResult:
    deleted: int
    batches: int
    seconds: float
    longest_batch: float  # seconds the longest batch transaction was open (its locks held)
    busy: str | None = None  # another cleaner held the lease: its holder; nothing was done

    @property
    def ran(self) -> bool:
        return self.busy is None


async def cleanup_fences(
    db: Database,
    *,
    min_age: timedelta,
    batch: int = DEFAULT_BATCH,
    max_batches: int | None = None,
    now: datetime | None = None,
    holder: str | None = None,
    pause: float = 0.0,
) -> CleanupResult:
    """Delete expired fence rows (see the module doc for what is kept), ``batch`` at a time,
    until none is left (or ``max_batches``). ``now`` pins the clock (tests); by default the
    database's clock decides. ``pause`` seconds between batches leave room for other writers.
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    if min_age < timedelta(0):
        raise ValueError("min_age must not be negative")
    lease = Lease(db, LEASE_NAME, holder or default_holder(), LEASE_TTL)
    started = time.monotonic()
    params = {
        "now": db.at(now),
        "min_age": min_age.total_seconds(),
        "limit": batch,
    }
    if not (await db.run("cleanup_due", {"now": params["now"]}))[0]["due"]:
        return CleanupResult(0, 0, time.monotonic() - started, 0.0)  # idle: write nothing
    if not await lease.acquire():
        return CleanupResult(0, 0, 0.0, 0.0, busy=await lease.current_holder() or "?")
    deleted = batches = 0
    longest = 0.0
    try:
        while max_batches is None or batches < max_batches:
            opened = time.monotonic()
            async with db.transaction() as tx:
                if not await lease.renew(tx):
                    log.warning("fence cleanup lost its lease; stopping")
                    break
                count = await _delete_batch(db, tx, params)
            longest = max(longest, time.monotonic() - opened)
            batches += 1
            deleted += count
            if count < batch:
                break
            await asyncio.sleep(pause)  # let queued writers in between batches
    finally:
        with contextlib.suppress(Exception):
            await lease.release()
    seconds = time.monotonic() - started
    if deleted:
        log.info(
            "expired fences deleted",
            extra={"deleted": deleted, "batches": batches, "seconds": round(seconds, 3)},
        )
    return CleanupResult(deleted, batches, seconds, longest)


async def _delete_batch(db: Database, tx: Tx, params: dict[str, object]) -> int:
    rows = await tx.q("cleanup_fences", params)
    if db.dialect == "postgresql":
        return int(rows[0]["deleted"])
    return int((await tx.q("changes"))[0]["changed"])


def min_age_for(app: App) -> timedelta:
    """The longest redelivery exposure among the app's queues (default policy if none)."""
    from .app import fence_exposure
    from .retry import DEFAULT_POLICY

    policies = [c.policy for c in app.consumers.values()] or [DEFAULT_POLICY]
    return max(fence_exposure(policy, app.lease) for policy in policies)


async def cleanup_loop(
    db: Database,
    *,
    min_age: timedelta,
    interval: timedelta,
    batch: int = DEFAULT_BATCH,
    stop: asyncio.Event | None = None,
) -> None:
    """Clean up now and then every ``interval`` (with ±10 % jitter) until ``stop`` is set or
    the task is cancelled. Failures are logged and retried at the next round."""
    stop = stop or asyncio.Event()
    holder = default_holder()
    while not stop.is_set():
        try:
            result = await cleanup_fences(db, min_age=min_age, batch=batch, holder=holder)
            if result.busy:
                log.debug("another cleaner is running", extra={"holder": result.busy})
        except Exception:
            log.exception("fence cleanup failed; trying again next round")
        wait = interval.total_seconds() * random.uniform(0.9, 1.1)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=wait)


async def _gauges_loop(app: App, interval: timedelta) -> None:
    from .deadletters import refresh_gauges
    from .transports.database import DatabaseQueue

    while True:
        try:
            transport = app.transport
            queue_db = transport.db if isinstance(transport, DatabaseQueue) else None
            await refresh_gauges(app.db, queue_db)
        except Exception:
            log.exception("refreshing the database gauges failed")
        await asyncio.sleep(interval.total_seconds())


async def housekeeping(app: App) -> None:
    """A worker's background duties, until cancelled: fence cleanup, alert delivery and the
    database gauges, as configured by ``app.maintenance``. Never raises."""
    from .alerts import AlertDispatcher, sinks_from_env
    from .errors import ConfigurationError

    settings = app.maintenance
    async with asyncio.TaskGroup() as group:
        if settings.cleanup:
            group.create_task(
                cleanup_loop(
                    app.db,
                    min_age=min_age_for(app),
                    interval=settings.cleanup_interval,
                    batch=settings.cleanup_batch,
                ),
                name="jobfence-cleanup",
            )
        if settings.alerts:
            try:
                sinks = sinks_from_env() if settings.alert_sinks is None else settings.alert_sinks
                dispatcher = AlertDispatcher(
                    app.db,
                    sinks,
                    window=settings.alert_window,
                    timeout=settings.alert_timeout.total_seconds(),
                )
            except ConfigurationError as exc:
                log.error("alerts will not be delivered: %s", exc)
            else:
                group.create_task(
                    dispatcher.run(interval=settings.alert_interval), name="jobfence-alerts"
                )
        group.create_task(_gauges_loop(app, settings.gauges_interval), name="jobfence-gauges")
