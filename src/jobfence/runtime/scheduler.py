"""The scheduler: enqueues the ticks of an app's periodic jobs (:mod:`jobfence.core.periodic`).

No leader is elected. Every worker runs a scheduler for its app's periodic jobs (unless told
not to), and ``jobfence scheduler`` runs one alone; any number of them, on any number of
hosts, make one run per tick, twice over:

- each tick is a job whose job_id is its slot (``<name>:<slot in UTC>``), so a tick
  enqueued twice is run once: the second delivery meets the fence;
- each schedule's row (``core.schedules``) holds the tick it is at, locked and moved in the
  transaction that enqueues the ticks after it (``schedule_lock``, ``schedule_advance``). On
  the database queue in the fence's database the jobs are written in that transaction too,
  so a tick is even *enqueued* once. On a broker (or a queue in another database) the jobs
  are published before that transaction commits: a scheduler killed in between leaves the
  tick published but not recorded, the next one publishes it again, and the fence absorbs
  the duplicate.

Times come from the database clock (the one every scheduler shares); the scheduler sleeps
until the next tick of any of its schedules, measured on that clock.
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
from ..core.periodic import Due, Periodic
from ..db import Tx, to_datetime
from . import holding
from .context import Runtime, RuntimeSource

log = logging.getLogger("jobfence.scheduler")

#: the longest the scheduler sleeps without looking at the database again
MAX_SLEEP = 60.0
#: after a failed round (database unreachable, a payload function that raised)
RETRY_AFTER = 1.0
#: woken this long after a tick is due, so the database clock is past it too
SLACK = 0.005


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

    def stop(self) -> None:
        self._stop.set()

    def _db_now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self._offset, tz=UTC)

    async def define(self) -> None:
        """Register the definitions (made, or replaced when they changed)."""
        consumers = self.runtime.consumers
        for p in self.periodic.values():
            consumer = consumers[p.queue].name if p.queue in consumers else p.queue
            await self.runtime.db.run(
                "schedule_define",
                {
                    "name": p.name,
                    "cron": p.cron,
                    "tz": p.tz,
                    "queue": p.queue,
                    "consumer": consumer,
                    "missed": p.missed,
                },
            )

    async def tick(self) -> float:
        """Enqueue what is due; return how long to sleep until the next tick (seconds)."""
        now = self._db_now()
        for p in self.periodic.values():
            due = self._next.get(p.name)
            if due is None or due <= now:
                try:
                    await self._advance(p)
                except Exception:
                    # one schedule's failure (its payload function raised, a payload too
                    # large) must not hold up the others: it is tried again shortly
                    log.exception(
                        f"periodic job {p.name}: enqueuing its ticks failed; trying again shortly",
                        extra={"periodic": p.name},
                    )
                    self._next[p.name] = now + timedelta(seconds=RETRY_AFTER)
        if not self._next:
            return MAX_SLEEP
        soonest = min(self._next.values())
        return min(MAX_SLEEP, max(0.0, (soonest - self._db_now()).total_seconds() + SLACK))

    async def _advance(self, p: Periodic) -> None:
        """Lock ``p``'s row, enqueue its due ticks and move it past them, in one transaction."""
        async with self.runtime.db.transaction() as tx:
            rows = await tx.q("schedule_lock", {"name": p.name})
            if rows:
                enqueued, due, position = await self._enqueue_due(tx, p, rows[0])
        if not rows:
            # its row was deleted under it: store the definitions again (outside the
            # transaction: on SQLite that holds the write lock a second connection waits for)
            await self.define()
            return
        self._next[p.name] = p.next_slot(position)
        if enqueued:
            self.enqueued += len(enqueued)
            log.info(
                "periodic tick enqueued",
                extra={
                    "periodic": p.name,
                    "queue": p.queue,
                    "job_ids": [j.job_id for j in enqueued[-5:]],
                    "ticks": len(enqueued),
                },
            )
        if due.dropped:
            log.warning(
                f"periodic job {p.name}: {due.dropped}{' or more' if due.more else ''} missed "
                f"tick(s) not run (missed={p.missed!r}; no scheduler ran when they were due)",
                extra={"periodic": p.name, "dropped": due.dropped, "more": due.more},
            )

    async def _enqueue_due(
        self, tx: Tx, p: Periodic, row: Mapping[str, Any]
    ) -> tuple[list[OutgoingJob], Due, datetime]:
        """In ``tx``, holding ``p``'s row: publish the ticks due and move the row past them;
        return the jobs, what was due, and the tick the schedule is at now."""
        now, since = to_datetime(row["now"]), to_datetime(row["created_at"])
        assert now is not None
        assert since is not None
        self._offset = now.timestamp() - time.time()
        last = to_datetime(row["last_slot"])
        due = p.due(last, since, now)
        if due.last is None:
            return [], due, last or since
        enqueued = [
            outgoing_job(p.queue, p.payload_for(slot), job_id=p.job_id(slot))
            for slot in due.enqueue
        ]
        await tx.q(
            "schedule_advance",
            {
                "name": p.name,
                "slot": self.runtime.db.at(due.last),
                "job_id": enqueued[-1].job_id if enqueued else None,
            },
        )
        if enqueued:
            self.runtime.transport.check_payloads(enqueued)
            await self.runtime.transport.publish_tx(tx, enqueued)
        return enqueued, due, due.last

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
