"""Fences by day of expiry on PostgreSQL (issue 27): the days ahead are created before their
fences arrive, and an expired day goes whole.

``core.processed_jobs`` is partitioned by ``expires_at``, one partition per UTC day plus a
default partition (``9_fence_partitions.sql``). A worker's maintenance creates the days that
new fences will expire on (:func:`add_days`, from the fence TTL, a day before to two days
after) every round; a fence whose day does not exist yet lands in the default partition, so
an insert never fails. Cleanup (:mod:`jobfence.runtime.cleanup`) detaches every day whose fences
all expired more than ``min_age`` ago (:func:`detach_days`, after moving out the fences SPEC
T2 keeps: milliseconds under the table's lock), drops the detached tables in a transaction of
their own (:func:`purge`: removing the files is what takes time, and it holds nothing a fence
insert needs), and deletes the default partition's expired fences in batches.

Both take their locks for at most one second (``lock_timeout``): a day that could not be
created or dropped now is tried again at the next round (its fences wait in the default
partition, or stay a little longer). SQLite keeps one plain table (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from ..db import Database, Tx
from ..errors import Category, classify

log = logging.getLogger("jobfence.cleanup")

#: days created before the first fence that expires on them, and after the last
DAYS_BEFORE = timedelta(days=1)
DAYS_AFTER = timedelta(days=2)


def days_for(ttl: timedelta, now: datetime) -> tuple[date, date]:
    """The first and last UTC day that fences written around ``now`` with ``ttl`` expire on
    (with a day's margin before and two after)."""
    expires = now.astimezone(UTC) + ttl
    return (expires - DAYS_BEFORE).date(), (expires + DAYS_AFTER).date()


async def add_days(db: Database, ttl: timedelta, now: datetime | None = None) -> int:
    """Create the day partitions fences written now will expire on; how many were new (0
    on SQLite, whose fences are one plain table)."""
    if db.dialect != "postgresql":
        return 0
    first, last = days_for(ttl, now or datetime.now(UTC))
    async with db.transaction() as tx:
        rows = await tx.q("fence_partitions_add", {"first": first, "last": last})
    made = int(rows[0]["made"])
    if made:
        log.info("fence partitions created", extra={"partitions": made, "last_day": str(last)})
    return made


@dataclass(frozen=True)
class Dropped:
    name: str
    fences: int  # the planner's count of the fences dropped with it
    kept: int  # fences moved out first (SPEC T2)


async def detach_days(tx: Tx, *, now: object, min_age: timedelta) -> list[Dropped]:
    """Detach every day partition due (every fence in it expired ``min_age`` before ``now``,
    a database time or None for the database's clock), inside the caller's transaction, which
    then holds the fence table for milliseconds: the files go in :func:`purge`'s, later."""
    rows = await tx.q("fence_partitions_detach", {"now": now, "min_age": min_age.total_seconds()})
    return [Dropped(str(r["detached"]), int(r["fences"]), int(r["kept"])) for r in rows]


async def purge(tx: Tx) -> int:
    """Drop the detached day partitions (their files are removed when ``tx`` commits, without
    holding anything a fence insert needs); how many."""
    rows = await tx.q("fence_partitions_purge")
    return int(rows[0]["dropped"])


def busy(exc: BaseException) -> bool:
    """The database could not do it now (a lock wait ran out, a deadlock, a lost
    connection): try again at the next round."""
    return classify(exc) is Category.TEMPORARY_ERROR


async def days_loop(
    db: Database, *, ttl: timedelta, interval: timedelta, stop: asyncio.Event | None = None
) -> None:
    """Create the days ahead now and then every ``interval`` until ``stop`` is set or the task
    is cancelled. Failures are logged and retried at the next round."""
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            await add_days(db, ttl)
        except Exception as exc:
            if busy(exc):
                log.info("fence partitions not created now (the table is busy); next round")
            else:
                log.exception("creating fence partitions failed; trying again next round")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval.total_seconds()):
                await stop.wait()
