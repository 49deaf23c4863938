"""The scheduler: enqueues the ticks of an app's periodic jobs (:mod:`jobfence.core.periodic`).

No leader is elected. Every worker runs a scheduler for its app's periodic jobs (unless told
not to), and ``jobfence scheduler`` runs one alone; any number of them, on any number of
hosts, make one run per tick, twice over:

- each tick is a job whose job_id is its slot (``<name>:<slot in UTC>``), so a tick
  enqueued twice is run once: the second delivery meets the fence;
- each schedule's row (``core.schedules``) holds the tick it is at, locked and moved in the
  transaction that enqueues the ticks after it. A *round* does every due schedule of the app
  at once: one statement claims their rows (``schedules_claim``; on PostgreSQL ``FOR UPDATE
  SKIP LOCKED``, so two schedulers split a round's schedules instead of waiting for each
  other; SQLite's one writer serialises them), one publish enqueues all their ticks, one
  statement moves all the rows (``schedules_advance``). A transaction is bounded
  (:data:`ROUND_SCHEDULES` schedules, :data:`ROUND_TICKS` ticks): a larger round — a
  catch-up after downtime — takes several. On the database queue in the fence's database the
  jobs are written in that transaction too, so a tick is even *enqueued* once. On a broker
  (or a queue in another database) the jobs are published before that transaction commits:
  a scheduler killed in between leaves the ticks published but not recorded, the next one
  publishes them again, and the fence absorbs the duplicates.

Times come from the database clock (the one every scheduler shares); the scheduler sleeps
until the next tick of any of its schedules, measured on that clock. It declares its
schedules when it starts and every :data:`~jobfence.core.periodic.DECLARE_EVERY` (and a
round stamps the rows it moves), so a schedule no running app declares any more shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ..core.jobs import OutgoingJob, outgoing_job
from ..core.periodic import DECLARE_EVERY, Due, Periodic
from ..db import to_datetime
from . import holding
from .context import Runtime, RuntimeSource

log = logging.getLogger("jobfence.scheduler")

#: the longest the scheduler sleeps without looking at the database again
MAX_SLEEP = 60.0
#: after a failed round (database unreachable, a payload function that raised)
RETRY_AFTER = 1.0
#: woken this long after a tick is due, so the database clock is past it too
SLACK = 0.005
#: a round's transaction claims at most this many schedules ...
ROUND_SCHEDULES = 500
#: ... and enqueues at most this many ticks; a round with more takes more transactions
ROUND_TICKS = 1000


class Scheduler:
    """Enqueues the ticks of ``runtime.periodic`` until :meth:`stop` (``await run()``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.periodic: Mapping[str, Periodic] = runtime.periodic
        #: per schedule, the next tick after the one it is at (as last read)
        self._next: dict[str, datetime] = {}
        #: the database clock minus this process' clock, as last read
        self._offset = 0.0
        self._stop = asyncio.Event()
        #: ticks this scheduler enqueued (another scheduler may have enqueued the rest)
        self.enqueued = 0
        #: the transactions its rounds took, and the most ticks one of them enqueued
        self.transactions = 0
        self.largest = 0
        #: when it last declared its schedules (time.monotonic(); 0: not yet)
        self._declared = 0.0

    def stop(self) -> None:
        self._stop.set()

    def _db_now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self._offset, tz=UTC)

    async def define(self) -> None:
        """Declare the definitions, in one transaction: made, replaced when they changed, and
        marked as declared now (``defined_at``: what tells a schedule no running app declares
        any more, see :func:`jobfence.review.schedules.prune_schedules`)."""
        consumers = self.runtime.consumers
        params = [
            {
                "name": p.name,
                "cron": p.cron,
                "tz": p.tz,
                "queue": p.queue,
                "consumer": consumers[p.queue].name if p.queue in consumers else p.queue,
                "missed": p.missed,
            }
            for p in self.periodic.values()
        ]
        if not params:
            return
        async with self.runtime.db.transaction() as tx:
            await tx.qmany("schedule_define", params)
        self._declared = time.monotonic()

    async def tick(self) -> float:
        """Enqueue what is due; return how long to sleep until the next tick (seconds)."""
        if time.monotonic() - self._declared >= DECLARE_EVERY.total_seconds():
            await self.define()
        now = self._db_now()
        due = [
            p for p in self.periodic.values() if (at := self._next.get(p.name)) is None or at <= now
        ]
        if due:
            await self._round(due)
        if not self._next:
            return MAX_SLEEP
        soonest = min(self._next.values())
        return min(MAX_SLEEP, max(0.0, (soonest - self._db_now()).total_seconds() + SLACK))

    async def _round(self, due: list[Periodic]) -> None:
        """Claim ``due``'s rows and enqueue their ticks: one transaction for at most
        :data:`ROUND_SCHEDULES` schedules and :data:`ROUND_TICKS` ticks, as many as it takes
        (a catch-up of 10 000 missed ticks is ten short transactions, not one long one)."""
        pending = {p.name: p for p in due}
        while pending:
            batch = list(pending.values())[:ROUND_SCHEDULES]
            try:
                done = await self._transaction(batch)
            except Exception:
                # the database or the broker failed the whole transaction: nothing of it was
                # recorded, and its schedules are tried again shortly
                log.exception(
                    "enqueuing periodic ticks failed; trying again shortly",
                    extra={"periodic": [p.name for p in batch]},
                )
                retry = self._db_now() + timedelta(seconds=RETRY_AFTER)
                for p in batch:
                    self._next[p.name] = retry
                    del pending[p.name]
                continue
            for name in done:
                del pending[name]

    async def _transaction(self, batch: list[Periodic]) -> list[str]:
        """One transaction of a round: lock the rows of ``batch`` not held by another
        scheduler, enqueue their due ticks (one publish) and move every row (one statement).
        Return the schedules done with; the others (out of the transaction's room for ticks)
        have more ticks due, from where their rows now are."""
        db = self.runtime.db
        names = [p.name for p in batch]
        room = ROUND_TICKS
        moved: list[tuple[Periodic, Due, list[OutgoingJob], datetime]] = []
        done: list[str] = []
        async with db.transaction() as tx:
            rows = await tx.q("schedules_claim", {"names": db.array(names)})
            for row in rows:
                p = self.periodic[row["name"]]
                if room == 0:
                    break  # not done: the next transaction takes it
                try:
                    due, jobs, position = self._due(p, row, room)
                except Exception:
                    # one schedule's failure (its payload function raised, a payload too
                    # large) must not hold up the others: it is tried again shortly
                    log.exception(
                        f"periodic job {p.name}: enqueuing its ticks failed; trying again shortly",
                        extra={"periodic": p.name},
                    )
                    self._next[p.name] = self._db_now() + timedelta(seconds=RETRY_AFTER)
                    done.append(p.name)
                    continue
                room -= len(jobs)
                if due.last is not None:
                    moved.append((p, due, jobs, position))
                if due.last is None or position == due.last:
                    done.append(p.name)
                self._next[p.name] = p.next_slot(position)
            if moved:
                await tx.q(
                    "schedules_advance",
                    {
                        "names": db.array(p.name for p, *_ in moved),
                        "slots": db.array(db.at(at) for *_, at in moved),
                        "job_ids": db.array(j[-1].job_id if j else None for _, _, j, _ in moved),
                    },
                )
            jobs = [job for _, _, j, _ in moved for job in j]
            if jobs:
                await self.runtime.transport.publish_tx(tx, jobs)
        self.transactions += 1
        self.largest = max(self.largest, len(jobs))
        claimed = {row["name"] for row in rows}
        missing = [name for name in names if name not in claimed]
        if missing:
            await self._missing(missing)
            done += missing
        for p, due, j, _ in moved:
            self._logged(p, due, j)
        return done

    def _due(
        self, p: Periodic, row: Mapping[str, Any], room: int
    ) -> tuple[Due, list[OutgoingJob], datetime]:
        """What ``p``'s claimed ``row`` has due: the ticks to enqueue in this transaction (at
        most ``room``, the oldest) and the tick the row moves to."""
        now, since = to_datetime(row["now"]), to_datetime(row["created_at"])
        assert now is not None
        assert since is not None
        self._offset = now.timestamp() - time.time()
        last = to_datetime(row["last_slot"])
        due = p.due(last, since, now)
        if due.last is None:
            return due, [], last or since
        slots = due.enqueue[:room]
        jobs = [outgoing_job(p.queue, p.payload_for(slot), job_id=p.job_id(slot)) for slot in slots]
        self.runtime.transport.check_payloads(jobs)
        position = slots[-1] if len(slots) < len(due.enqueue) else due.last
        return due, jobs, position

    async def _missing(self, names: list[str]) -> None:
        """Schedules a claim did not return: held by another scheduler (read again shortly,
        where it moved them) or deleted (stored again, outside the round's transaction: on
        SQLite that holds the write lock a second connection waits for)."""
        rows = await self.runtime.db.run(
            "schedules_present", {"names": self.runtime.db.array(names)}
        )
        present = {row["name"] for row in rows}
        now = self._db_now()
        for name in present:
            self._next[name] = min(
                self.periodic[name].next_slot(now), now + timedelta(seconds=RETRY_AFTER)
            )
        if len(present) < len(names):
            await self.define()
            for name in names:
                if name not in present:
                    self._next[name] = now  # the next round claims it, from its new row

    def _logged(self, p: Periodic, due: Due, jobs: list[OutgoingJob]) -> None:
        if jobs:
            self.enqueued += len(jobs)
            log.info(
                "periodic tick enqueued",
                extra={
                    "periodic": p.name,
                    "queue": p.queue,
                    "job_ids": [j.job_id for j in jobs[-5:]],
                    "ticks": len(jobs),
                },
            )
        if due.dropped:
            log.warning(
                f"periodic job {p.name}: {due.dropped}{' or more' if due.more else ''} missed "
                f"tick(s) not run (missed={p.missed!r}; no scheduler ran when they were due)",
                extra={"periodic": p.name, "dropped": due.dropped, "more": due.more},
            )

    async def run(self) -> None:
        """Define the schedules, then enqueue their ticks until :meth:`stop`."""
        if not self.periodic:
            return
        log.info(
            "scheduler started",
            extra={"periodic": sorted(self.periodic), "database": self.runtime.db.display},
        )
        defined = False
        while not self._stop.is_set():
            try:
                if not defined:
                    await self.define()
                    defined = True
                wait = await self.tick()
            except Exception:
                log.exception("scheduling failed; retrying shortly")
                wait = RETRY_AFTER
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._stop.wait()
        log.info("scheduler stopped", extra={"enqueued": self.enqueued})


async def run_alone(
    app: RuntimeSource, *, install_signal_handlers: bool = False, ready: asyncio.Event | None = None
) -> int:
    """``jobfence scheduler``: run the scheduler of ``app`` alone until SIGTERM/SIGINT (or
    until cancelled); return how many ticks it enqueued."""
    held = await holding.hold(app, pool_size=2)
    try:
        scheduler = Scheduler(app.runtime)
        if install_signal_handlers:
            import signal

            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, scheduler.stop)
        if ready is not None:
            ready.set()
        await scheduler.run()
        return scheduler.enqueued
    finally:
        if held:
            await holding.release(app)
