"""Fence expiry (SPEC T1, T2) and the background duties of workers.

A fence row may go once it has expired (``expires_at``, set from the app's fence TTL when the
job ran) — but **never**:

- while it is younger than ``min_age``, the longest time a delivery of its job can still
  arrive (retry window + one lease per attempt, see :func:`jobfence.core.fence.exposure`) —
  a second guard next to the TTL check at start-up;
- while its job_id has a dead letter pending review, or one replayed less than ``min_age``
  ago (a replay must meet the fence);
- while a job with its job_id is still retrying in this database's queue.

On PostgreSQL the fences are partitioned by day of expiry (:mod:`jobfence.runtime.partitions`):
cleanup first detaches every day whose fences all expired more than ``min_age`` ago, in one
short transaction (the fences kept for the reasons above are moved out first), drops them
whole in a second one that holds nothing a fence insert waits for, then deletes the expired
fences of the default partition as below.

Cleanup deletes in bounded batches, oldest first, each batch its own short transaction found
through the ``expires_at`` index (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, where each batch
starts at the last ``expires_at`` of the one before, so a round over millions of expired rows
does not read the earlier batches' dead index entries again), so a worker
inserting fences is never held up for more than one batch. One cleaner runs at a time: the
``fence-cleanup`` row of the lease table, renewed inside every batch's transaction, so a
cleaner that stalled past its lease can never commit another batch. Works the same on
PostgreSQL and SQLite (whose single writer alternates batches with the workers' commits).

A worker runs :func:`cleanup_loop` in the background (:mod:`jobfence.runtime.maintenance`);
each round that ran also removes the decided dead letters past the retention the database's
owner set, if any (:func:`expire_letters`; never a letter pending review).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..core.leases import Lease, default_holder
from ..db import Database, Tx
from ..metrics import CLEANUP_FAILURES, CLEANUP_SUCCEEDED, FENCES_DELETED
from .partitions import Dropped, busy, detach_days, purge

log = logging.getLogger("jobfence.cleanup")

LEASE_NAME = "fence-cleanup"
LEASE_TTL = timedelta(minutes=2)
DEFAULT_BATCH = 5000
DEFAULT_INTERVAL = timedelta(minutes=5)


@dataclass(frozen=True)
class CleanupResult:
    deleted: int
    batches: int
    seconds: float
    longest_batch: float  # seconds the longest batch transaction was open (its locks held)
    busy: str | None = None  # another cleaner held the lease: its holder; nothing was done
    #: nothing expired was left when it stopped (False: it lost its lease or hit max_batches)
    caught_up: bool = True
    #: day partitions dropped whole (PostgreSQL); their fences are counted in ``deleted``
    days: int = 0
    #: seconds of the transaction that dropped the detached days (their files removed at its
    #: commit): it holds no lock a fence insert waits for, so ``longest_batch`` leaves it out
    dropping: float = 0.0

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
    params: dict[str, object] = {
        "now": db.at(now),
        "min_age": min_age.total_seconds(),
        "limit": batch,
    }
    if db.dialect == "postgresql":
        params["after"] = None  # each batch starts where the previous one ended
    due = {"now": params["now"], "min_age": params["min_age"]}
    if not (await db.run("cleanup_due", due))[0]["due"]:
        return CleanupResult(0, 0, time.monotonic() - started, 0.0)  # idle: write nothing
    if not await lease.acquire():
        return CleanupResult(0, 0, 0.0, 0.0, busy=await lease.current_holder() or "?")
    deleted = batches = days = 0
    longest = dropping = 0.0
    caught_up = False
    try:
        if db.dialect == "postgresql":
            days, deleted, longest, dropping = await _drop_days(
                db, lease, now=params["now"], min_age=min_age
            )
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
            FENCES_DELETED.inc(count)
            if count < batch:
                caught_up = True
                break
            await asyncio.sleep(pause)  # let queued writers in between batches
    finally:
        with contextlib.suppress(Exception):
            await lease.release()
    seconds = time.monotonic() - started
    if deleted:
        log.info(
            "expired fences deleted",
            extra={
                "deleted": deleted,
                "batches": batches,
                "days": days,
                "seconds": round(seconds, 3),
            },
        )
    return CleanupResult(
        deleted, batches, seconds, longest, caught_up=caught_up, days=days, dropping=dropping
    )


async def _drop_days(
    db: Database, lease: Lease, *, now: object, min_age: timedelta
) -> tuple[int, int, float, float]:
    """Detach the day partitions that are due, all in one short transaction under the lease,
    then drop them (and any a stopped cleaner left detached) in a second one, which holds
    nothing the workers need while their files are removed: (days, their fences, the
    detaching transaction's seconds, the dropping one's). Days whose locks were not free
    within a second stay for the next round."""
    days: list[Dropped] = []
    held = dropping = 0.0
    try:
        opened = time.monotonic()
        async with db.transaction() as tx:
            if not await lease.renew(tx):
                log.warning("fence cleanup lost its lease; stopping")
                return 0, 0, 0.0, 0.0
            days = await detach_days(tx, now=now, min_age=min_age)
        held = time.monotonic() - opened
        opened = time.monotonic()
        async with db.transaction() as tx:
            if not await lease.renew(tx):
                log.warning("fence cleanup lost its lease; stopping")
            else:
                await purge(tx)
        dropping = time.monotonic() - opened
    except Exception as exc:
        if not busy(exc):
            raise
        log.info("expired fence partitions stay until the next round: %s", exc)
    fences = sum(d.fences for d in days)
    FENCES_DELETED.inc(fences)
    for day in days:
        log.info(
            "expired fence partition dropped",
            extra={"partition": day.name, "fences": day.fences, "kept": day.kept},
        )
    return len(days), fences, held, dropping


async def _delete_batch(db: Database, tx: Tx, params: dict[str, object]) -> int:
    rows = await tx.q("cleanup_fences", params)
    if db.dialect == "postgresql":
        if rows[0]["last"] is not None:
            params["after"] = rows[0]["last"]
        return int(rows[0]["deleted"])
    return int((await tx.q("changes"))[0]["changed"])


async def expire_letters(db: Database, *, batch: int = DEFAULT_BATCH) -> int:
    """Remove the decided dead letters past the retention the database's owner set (docs/
    dead-letters.md; none set: none), ``batch`` per transaction, until none is left; how
    many went. Letters pending review are never removed. 0 on SQLite, which keeps every
    letter."""
    if db.dialect != "postgresql":
        return 0
    total = 0
    while True:
        async with db.transaction() as tx:
            rows = await tx.q("dead_letters_expire", {"batch": batch})
        count = int(rows[0]["expired"])
        total += count
        if count < batch:
            break
    if total:
        log.info("decided dead letters past their retention removed", extra={"letters": total})
    return total


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
            elif result.caught_up:
                CLEANUP_SUCCEEDED.set_to_current_time()
            if not result.busy:  # this round ran (no other cleaner held the lease)
                await expire_letters(db, batch=batch)
        except Exception:
            CLEANUP_FAILURES.inc()
            log.exception("fence cleanup failed; trying again next round")
        wait = interval.total_seconds() * random.uniform(0.9, 1.1)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await stop.wait()
