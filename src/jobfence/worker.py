"""The worker: fetches deliveries and runs them through the harness, N at a time.

Graceful shutdown (SPEC H4): on SIGTERM/SIGINT it stops fetching, lets in-flight jobs finish
for ``shutdown_grace`` seconds, then cancels the rest (their transactions roll back and the
jobs are handed back to the queue).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .config import DEFAULT_BATCH_WINDOW, MAX_BATCH_SIZE
from .harness import Harness, Outcome
from .health import Health, register, unregister
from .jobs import Delivery
from .maintenance import housekeeping
from .metrics import WORKER_INFLIGHT, WORKER_SLOTS, WORKERS

if TYPE_CHECKING:
    from .app import App

log = logging.getLogger("jobfence.worker")


@dataclass
class WorkerStats:
    """What this worker's deliveries came to, counted once, where the worker learns each
    outcome; the periodic summary line reports the difference between two readings."""

    outcomes: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))

    @property
    def handled(self) -> int:
        return sum(self.outcomes.values())

    def since(self, before: dict[Outcome, int]) -> dict[Outcome, int]:
        """Outcomes counted since the reading ``before`` (a copy of :attr:`outcomes`)."""
        return {o: n - before.get(o, 0) for o, n in self.outcomes.items()}


def summary_fields(delta: dict[Outcome, int], seconds: float) -> dict[str, Any]:
    """The structured fields of the worker's INFO summary line."""
    return {
        "jobs_per_s": round(sum(delta.values()) / seconds, 2) if seconds > 0 else 0.0,
        "done": delta[Outcome.PROCESSED],
        "retries": delta[Outcome.RETRY],
        "dead_letters": delta[Outcome.DEAD],
        "duplicates": delta[Outcome.DUPLICATE],
        "lost": delta[Outcome.LOST] + delta[Outcome.FAILED_TO_RECORD],
        "interval_s": round(seconds, 3),
    }


class Worker:
    def __init__(
        self,
        app: App,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        poll_interval: float = 2.0,
        shutdown_grace: float = 30.0,
        prefetch: int | None = None,
        batch_size: int = 1,
        batch_window: float = DEFAULT_BATCH_WINDOW,
        summary_interval: float = 60.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(
                f"batch_size must be between 1 and {MAX_BATCH_SIZE} (PostgreSQL caches "
                f"{MAX_BATCH_SIZE} subtransactions per backend; more slow every snapshot)"
            )
        if prefetch is not None and prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        if batch_window < 0:
            raise ValueError("batch_window must be >= 0 seconds")
        if summary_interval < 0:
            raise ValueError("summary_interval must be >= 0 seconds (0: no summary)")
        self.app = app
        known = app.consumed_queues
        wanted = list(queues) if queues else known
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            from .errors import ConfigurationError

            raise ConfigurationError(
                f"no consumer for queue(s) {', '.join(unknown)}; this app consumes: "
                f"{', '.join(known) or '(nothing: register one with @app.consumer)'}"
            )
        if not wanted:
            from .errors import ConfigurationError

            raise ConfigurationError("the app has no consumers; register one with @app.consumer")
        self.queues = wanted
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        #: group commit: up to this many jobs share one transaction (PostgreSQL, queue in the
        #: same database), each in its own savepoint; 1 = one transaction per job
        self.batch_size = batch_size
        #: without a backlog, ready jobs share a batch while their handlers' expected time in a
        #: row stays within this many seconds (0: batches form only under a backlog)
        self.batch_window = batch_window
        #: an INFO line with what happened every this many seconds (0: none)
        self.summary_interval = summary_interval
        #: jobs claimed beyond the free slots, held (with renewed leases) until a slot frees
        self.prefetch = concurrency * batch_size if prefetch is None else prefetch
        self._buffer: collections.deque[Delivery] = collections.deque()
        self.stats = WorkerStats()
        self._stop = asyncio.Event()
        self._inflight: dict[asyncio.Task[list[Outcome]], list[Delivery]] = {}
        #: what /livez and /readyz report for this worker (jobfence.health)
        self.health = Health("worker")
        self._inflight_reported = 0

    def request_stop(self) -> None:
        """Stop fetching and shut down gracefully (what SIGTERM does)."""
        if not self._stop.is_set():
            log.info(
                "shutdown requested: finishing in-flight jobs",
                extra={"inflight": len(self._inflight)},
            )
        self._stop.set()
        self.health.draining = True
        if self.app.is_open:
            self.app.transport.wake()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self, *, install_signal_handlers: bool = False) -> WorkerStats:
        app = self.app
        register(self.health)
        try:
            await app.open(pool_size=self.concurrency + 4)
        except BaseException:
            unregister(self.health)
            raise
        WORKERS.inc()
        WORKER_SLOTS.inc(self.concurrency)
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="jobfence-handler")
        harness = Harness(
            consumers=app.consumers,
            db=app.db,
            transport=app.transport,
            observers=app.observers,
            fence_ttl=app.fence_ttl,
            payload_limit=app.payload_limit,
            executor=executor,
            fence_enabled=app._fence_enabled,
            work=app.work_source,
        )
        background = [
            asyncio.create_task(
                self.health.watch(app.db, self._report_inflight), name="jobfence-health"
            ),
            asyncio.create_task(self._heartbeat(), name="jobfence-heartbeat"),
            asyncio.create_task(self._maintenance(), name="jobfence-maintenance"),
        ]
        if self.summary_interval > 0:
            background.append(asyncio.create_task(self._summary(), name="jobfence-summary"))
        log.info(
            "worker started",
            extra={
                "queues": self.queues,
                "concurrency": self.concurrency,
                "database": app.db.display,
                "transport": app.transport.name,
            },
        )
        self.health.started = True
        try:
            await self._loop(harness)
            self.health.draining = True
            await self._drain()
        finally:
            self.health.draining = True
            unregister(self.health)
            WORKERS.dec()
            WORKER_SLOTS.dec(self.concurrency)
            WORKER_INFLIGHT.dec(self._inflight_reported)
            self._inflight_reported = 0
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            executor.shutdown(wait=False, cancel_futures=True)
            log.info("worker stopped", extra={"handled": self.stats.handled})
        return self.stats

    async def _loop(self, harness: Harness) -> None:
        while not self._stop.is_set():
            while self._buffer and len(self._inflight) < self.concurrency:
                self._start(harness)
            if len(self._inflight) >= self.concurrency:
                stop = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait([*self._inflight, stop], return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                continue
            try:
                # claim for the free slots plus a prefetch, so one round trip feeds many jobs
                free = (self.concurrency - len(self._inflight)) * self.batch_size
                self._buffer.extend(await self._fetch(free + self.prefetch))
            except Exception:
                log.exception("fetch failed; retrying shortly")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=1.0)
        # stopping: what was claimed but never started goes back, without costing an attempt
        while self._buffer:
            await self._give_back(self._buffer.popleft())

    async def _fetch(self, limit: int) -> list[Delivery]:
        """Fetch, but give up as soon as a stop is requested (a fetch may be queued behind a
        long transaction, e.g. SQLite's single writer)."""
        fetch = asyncio.ensure_future(
            self.app.transport.fetch(self.queues, limit, self.poll_interval)
        )
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([fetch, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if fetch.done():
            return fetch.result()
        fetch.cancel()
        try:
            return await fetch  # it may have claimed just before the cancellation landed
        except asyncio.CancelledError:
            return []

    def _start(self, harness: Harness) -> None:
        """Start the next batch. The buffer is spread over the free slots, at most
        ``batch_size`` jobs each, so that under a backlog batches fill up. Without a backlog,
        jobs that are ready together still share a group-commit transaction while the batch
        fits in ``batch_window`` by the recent handler time (fast handlers: one commit instead
        of several, which keeps latency low at high rates); slow handlers run side by side."""
        free = self.concurrency - len(self._inflight)
        size = -(-len(self._buffer) // free)
        handler_time = harness.handler_time
        if self.batch_size > 1 and harness.can_batch and handler_time is not None:
            size = max(size, int(self.batch_window / max(handler_time, 1e-6)))
        size = max(1, min(self.batch_size, size, len(self._buffer)))
        batch = [self._buffer.popleft() for _ in range(size)]
        task = asyncio.create_task(harness.handle_batch(batch))
        self._inflight[task] = batch
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[list[Outcome]]) -> None:
        self._inflight.pop(task, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # the harness handles everything; this is a bug if it happens
            log.error("harness raised", exc_info=exc)
            return
        outcomes = task.result()
        for outcome in outcomes:
            self.stats.outcomes[outcome] += 1
        if Outcome.RETRY in outcomes:
            # a waiting fetch looked for the next due job before this retry was written:
            # wake it, so that it reads the retry's due time instead of sleeping a full poll
            self.app.transport.wake()

    async def _give_back(self, delivery: Delivery) -> None:
        try:
            await self.app.transport.release(delivery, attempted=False)
        except Exception:
            log.exception("could not release a job on shutdown; its lease will expire")

    async def _drain(self) -> None:
        if not self._inflight:
            return
        _, pending = await asyncio.wait(list(self._inflight), timeout=self.shutdown_grace)
        if pending:
            log.warning(
                "shutdown grace period over: cancelling in-flight jobs (they are handed back)",
                extra={"jobs": len(pending)},
            )
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)

    async def _summary(self) -> None:
        """Every ``summary_interval``: one INFO line with the jobs/s and outcomes since the
        last one (a healthy worker logs its successes at DEBUG only); a quiet stretch is
        said once ("worker idle"), not every interval."""
        before = dict(self.stats.outcomes)
        started = time.monotonic()
        idle_said = False
        while True:
            await asyncio.sleep(self.summary_interval)
            now = time.monotonic()
            delta = self.stats.since(before)
            before, seconds, started = dict(self.stats.outcomes), now - started, now
            if any(delta.values()):
                idle_said = False
                fields = summary_fields(delta, seconds)
                log.info("worker summary", extra={**fields, "inflight": self._busy()})
            elif not idle_said and not self._busy():
                idle_said = True
                log.info("worker idle", extra={"queues": self.queues})

    def _busy(self) -> int:
        return sum(len(batch) for batch in self._inflight.values())

    def _report_inflight(self) -> None:
        """Every second: this worker's share of ``jobfence_worker_inflight_jobs`` (read on
        the tick, not per job: the job path pays nothing for it)."""
        busy = self._busy()
        WORKER_INFLIGHT.inc(busy - self._inflight_reported)
        self._inflight_reported = busy

    async def _heartbeat(self) -> None:
        interval = max(self.app.lease.total_seconds() / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            held = [d for batch in self._inflight.values() for d in batch] + list(self._buffer)
            if held:
                try:
                    await self.app.transport.extend(held)
                except Exception:
                    log.exception("lease renewal failed")

    async def _maintenance(self) -> None:
        """Queue upkeep (expired leases) plus the app's housekeeping: fence cleanup, alert
        delivery and database gauges (see :mod:`jobfence.cleanup`)."""

        async def queue_upkeep() -> None:
            interval = max(min(self.app.lease.total_seconds() / 2, 5.0), 0.2)
            while True:
                try:
                    await self.app.transport.maintenance()
                except Exception:
                    log.exception("queue maintenance failed")
                await asyncio.sleep(interval)

        async with asyncio.TaskGroup() as group:
            group.create_task(queue_upkeep(), name="jobfence-queue-upkeep")
            group.create_task(
                housekeeping(
                    self.app.maintenance,
                    self.app.db,
                    queue_db=self.app.queue_db,
                    min_age=self.app.redelivery_exposure(),
                ),
                name="jobfence-housekeeping",
            )
