"""The worker: fetches deliveries and runs them through the harness, N at a time.

Graceful shutdown (SPEC H4): on SIGTERM/SIGINT it stops fetching, lets in-flight jobs finish
for ``shutdown_grace`` seconds, then cancels the rest (their transactions roll back and the
jobs are handed back to the queue). A second signal cancels them at once. It says what it waits
for: the jobs in flight when the stop was asked, every few seconds while it waits, and what it
cancelled. Plain ``def`` handlers run in daemon threads (:mod:`jobfence.runtime.threads`), so
one still blocked cannot keep the process alive once the worker has stopped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import DEFAULT_BATCH_SIZE, DEFAULT_BATCH_WINDOW, MAX_BATCH_SIZE
from ..core.jobs import Delivery
from ..core.leases import default_holder
from ..metrics import WORKER_INFLIGHT, WORKER_SLOTS, WORKERS
from . import holding
from .context import Runtime, RuntimeSource
from .flow import FlowControl
from .harness import Harness, Outcome
from .health import Health, register, unregister
from .maintenance import housekeeping
from .scheduler import Scheduler
from .threads import DaemonThreadPool

log = logging.getLogger("jobfence.worker")

#: in-flight jobs named by id in a shutdown line (the count is always given)
NAMED_JOBS = 5
#: how long cancelled jobs get to roll back and be handed back before the worker stops anyway
CANCEL_TIMEOUT = 10.0
#: flow control's keying pass runs at most this often (seconds)
KEYING_INTERVAL = 0.2


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
        "deferred": delta[Outcome.DEFERRED],
        "lost": delta[Outcome.LOST] + delta[Outcome.FAILED_TO_RECORD],
        "interval_s": round(seconds, 3),
    }


class Worker:
    def __init__(
        self,
        app: RuntimeSource,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        poll_interval: float = 2.0,
        shutdown_grace: float = 30.0,
        prefetch: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        batch_window: float = DEFAULT_BATCH_WINDOW,
        summary_interval: float = 60.0,
        scheduler: bool = True,
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
            from ..errors import ConfigurationError

            raise ConfigurationError(
                f"no consumer for queue(s) {', '.join(unknown)}; this app consumes: "
                f"{', '.join(known) or '(nothing: register one with @app.consumer)'}"
            )
        if not wanted:
            from ..errors import ConfigurationError

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
        #: (None: concurrency × the jobs a batch takes now, see Harness.batch_limit)
        self.prefetch = prefetch
        self._runtime: Runtime | None = None  # the app's, once run() opened it
        self._harness: Harness | None = None  # once run() built it
        self._buffer: collections.deque[Delivery] = collections.deque()
        self.stats = WorkerStats()
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._inflight: dict[asyncio.Task[list[Outcome]], list[Delivery]] = {}
        self._began: dict[asyncio.Task[list[Outcome]], float] = {}
        self._deadline: float | None = None
        #: while shutting down, a line on what the worker still waits for this often (seconds)
        self.wait_report_interval = 5.0
        #: jobs cancelled at the end of the grace or by a forced stop (rolled back, handed back)
        self.cancelled = 0

        #: flow control over the limited queues among ``queues`` (set by run(); None: none)
        self.flow: FlowControl | None = None
        self._keyed_at = 0.0
        #: run the scheduler of the app's periodic jobs beside the worker (any number of
        #: schedulers make one run per tick: jobfence.runtime.scheduler)
        self.scheduler = scheduler
        #: what /livez and /readyz report for this worker (jobfence.runtime.health)
        self.health = Health("worker")
        self._inflight_reported = 0

    @property
    def runtime(self) -> Runtime:
        """What the worker runs on (its app's :class:`~jobfence.runtime.context.Runtime`)."""
        if self._runtime is None:
            raise RuntimeError("the worker is not running: its runtime exists from run() on")
        return self._runtime

    def request_stop(self) -> None:
        """Stop fetching and shut down gracefully (what SIGTERM does): in-flight jobs get
        ``shutdown_grace`` seconds to finish."""
        if not self._stop.is_set():
            self._deadline = time.monotonic() + self.shutdown_grace
            if self._inflight:
                log.info(
                    f"shutdown requested: waiting up to {self.shutdown_grace:g}s for "
                    f"{self._busy()} in-flight job(s); a second Ctrl-C (SIGINT or SIGTERM) "
                    "cancels them now (rolled back and redelivered)",
                    extra=self._waiting_for(),
                )
            else:
                log.info("shutdown requested: no job in flight")
        self._stop.set()
        self.health.draining = True
        if self._runtime is not None and self.app.is_open:
            self._runtime.transport.wake()

    def force_stop(self) -> None:
        """Stop now (what a second SIGTERM/SIGINT does): in-flight jobs are cancelled, their
        transactions roll back and the jobs are handed back for redelivery."""
        if self._force.is_set():
            return
        self.request_stop()
        self._force.set()
        if self._inflight:
            log.warning(
                f"second signal: forcing the stop, cancelling {self._busy()} in-flight job(s)",
                extra=self._waiting_for(),
            )

    def _on_signal(self) -> None:
        if self._stop.is_set():
            self.force_stop()
        else:
            self.request_stop()

    def _waiting_for(self) -> dict[str, Any]:
        """The shutdown lines' fields: the in-flight count, the first few jobs (id, queue,
        seconds running) and the grace left."""
        now = time.monotonic()
        jobs = [
            {"job_id": d.job_id, "queue": d.queue, "running_s": round(now - began, 1)}
            for task, batch in self._inflight.items()
            for began in (self._began.get(task, now),)
            for d in batch
        ]
        left = 0.0 if self._deadline is None else max(0.0, self._deadline - now)
        return {"inflight": len(jobs), "jobs": jobs[:NAMED_JOBS], "grace_left_s": round(left, 1)}

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def forced(self) -> bool:
        """Whether the stop was forced (a second signal, or :meth:`force_stop`)."""
        return self._force.is_set()

    async def run(self, *, install_signal_handlers: bool = False) -> WorkerStats:
        register(self.health)
        try:
            held = await holding.hold(self.app, pool_size=self.concurrency + 4)
        except BaseException:
            unregister(self.health)
            raise
        self._runtime = rt = self.app.runtime
        # every consumer's limit (the transport may serve another worker of this app on other
        # queues); this worker keys and prunes its own queues
        every = {q: c.limit for q, c in rt.consumers.items() if c.limit is not None}
        rt.transport.use_limits(every)
        limits = {q: limit for q, limit in every.items() if q in self.queues}
        if limits:
            flow_db = rt.transport.jobs_db or rt.db
            self.flow = FlowControl(flow_db, limits, holder=default_holder())
        WORKERS.inc()
        WORKER_SLOTS.inc(self.concurrency)
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal)
        # daemon threads: a `def` handler still blocked after the worker gave up on it (its
        # statements are refused from then on) does not keep the process alive
        executor = DaemonThreadPool(self.concurrency, thread_name_prefix="jobfence-handler")
        harness = Harness(
            consumers=rt.consumers,
            db=rt.db,
            transport=rt.transport,
            observers=rt.observers,
            fence_ttl=rt.fence_ttl,
            payload_limit=rt.payload_limit,
            executor=executor,
            fence_enabled=rt.fence_enabled,
            work=rt.work,
            tracing=rt.tracing,
            ledger=rt.ledger,
            flow=self.flow,
            lease=rt.lease,
        )
        self._harness = harness
        background = [
            asyncio.create_task(
                self.health.watch(rt.db, self._report_inflight), name="jobfence-health"
            ),
            asyncio.create_task(self._heartbeat(), name="jobfence-heartbeat"),
            asyncio.create_task(self._renew_slots(), name="jobfence-slot-renewal"),
            asyncio.create_task(self._maintenance(), name="jobfence-maintenance"),
        ]
        if self.summary_interval > 0:
            background.append(asyncio.create_task(self._summary(), name="jobfence-summary"))
        if self.scheduler and rt.periodic:
            background.append(asyncio.create_task(Scheduler(rt).run(), name="jobfence-scheduler"))
        log.info(
            "worker started",
            extra={
                "queues": self.queues,
                "concurrency": self.concurrency,
                "database": rt.db.display,
                "transport": rt.transport.name,
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
            log.info(
                "worker stopped",
                extra={"handled": self.stats.handled, "cancelled": self.cancelled},
            )
            if held:
                await holding.release(self.app)
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
                per_slot = harness.batch_limit(self.batch_size)
                free = (self.concurrency - len(self._inflight)) * per_slot
                prefetch = self.concurrency * per_slot if self.prefetch is None else self.prefetch
                await self._key_jobs()
                self._buffer.extend(await self._fetch(free + prefetch))
            except Exception:
                log.exception("fetch failed; retrying shortly")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._stop.wait()
        # stopping: what was claimed but never started goes back, without costing an attempt
        while self._buffer:
            await self._give_back(self._buffer.popleft())

    async def _key_jobs(self) -> None:
        """The keying pass of flow control (at most every ``KEYING_INTERVAL``): jobs of a
        limited database queue enqueued without their key get it, so the claim can take them."""
        flow = self.flow
        if flow is None or self.runtime.transport.jobs_db is None:
            return
        now = time.monotonic()
        if now - self._keyed_at < KEYING_INTERVAL:
            return
        self._keyed_at = now
        keyed = 0
        for queue in flow.limits:
            keyed += await flow.key_jobs(queue, self.runtime.consumers[queue].decoder.decode)
        if keyed:
            self.runtime.transport.wake()

    async def _fetch(self, limit: int) -> list[Delivery]:
        """Fetch, but give up as soon as a stop is requested (a fetch may be queued behind a
        long transaction, e.g. SQLite's single writer)."""
        fetch = asyncio.ensure_future(
            self.runtime.transport.fetch(self.queues, limit, self.poll_interval)
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
        size = max(1, min(harness.batch_limit(self.batch_size), size, len(self._buffer)))
        batch = harness.take(self._buffer, size)
        task = asyncio.create_task(harness.handle_batch(batch))
        self._inflight[task] = batch
        self._began[task] = time.monotonic()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[list[Outcome]]) -> None:
        batch = self._inflight.pop(task, None)
        self._began.pop(task, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # the harness handles everything; this is a bug if it happens
            log.error("harness raised", exc_info=exc)
            return
        outcomes = task.result()
        for outcome in outcomes:
            self.stats.outcomes[outcome] += 1
        if Outcome.RETRY in outcomes or Outcome.DEFERRED in outcomes:
            # a waiting fetch looked for the next due job before this retry was written:
            # wake it, so that it reads the retry's due time instead of sleeping a full poll
            self.runtime.transport.wake()
        elif self.flow is not None and batch and any(self._frees_slot(d) for d in batch):
            # a job of a queue with a concurrency limit ended: its key has room again (a
            # waiting fetch may wait for a lease's end, the latest that room comes back)
            self.runtime.transport.wake()

    def _frees_slot(self, delivery: Delivery) -> bool:
        limit = self.flow.limits.get(delivery.queue) if self.flow is not None else None
        return limit is not None and limit.concurrency is not None

    async def _give_back(self, delivery: Delivery) -> None:
        try:
            await self.runtime.transport.release(delivery, attempted=False)
        except Exception:
            log.exception("could not release a job on shutdown; its lease will expire")

    async def _drain(self) -> None:
        """Wait for the in-flight jobs until they finish, the grace ends or a second signal
        forces the stop, saying every ``wait_report_interval`` what is still running; then
        cancel the rest (their transactions roll back; the harness hands them back)."""
        deadline = self._deadline or time.monotonic() + self.shutdown_grace
        force = asyncio.ensure_future(self._force.wait())
        report = time.monotonic() + self.wait_report_interval
        try:
            while self._inflight and not self._force.is_set():
                now = time.monotonic()
                if now >= deadline:
                    log.warning(
                        f"shutdown grace period over: cancelling {self._busy()} in-flight "
                        "job(s) (rolled back and handed back for redelivery)",
                        extra=self._waiting_for(),
                    )
                    break
                if now >= report:
                    report = now + self.wait_report_interval
                    log.info(
                        f"still waiting for {self._busy()} in-flight job(s); a second "
                        "Ctrl-C cancels them",
                        extra=self._waiting_for(),
                    )
                await asyncio.wait(
                    [*self._inflight, force],
                    timeout=min(deadline, report) - now,
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            force.cancel()
        pending = list(self._inflight)
        if not pending:
            return
        cancelled = [d for task in pending for d in self._inflight.get(task, [])]
        for task in pending:
            task.cancel()
        _, stuck = await asyncio.wait(pending, timeout=CANCEL_TIMEOUT)
        self.cancelled += len(cancelled)
        log.warning(
            f"cancelled {len(cancelled)} in-flight job(s): rolled back, handed back for redelivery",
            extra={
                "jobs": [{"job_id": d.job_id, "queue": d.queue} for d in cancelled[:NAMED_JOBS]]
            },
        )
        if stuck:
            log.error(
                f"{len(stuck)} cancelled job(s) did not wind up within {CANCEL_TIMEOUT:g}s; "
                "stopping anyway (their leases expire and they are redelivered)"
            )

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

    def _renewal_interval(self) -> float:
        return max(self.runtime.lease.total_seconds() / 3, 0.2)

    async def _heartbeat(self) -> None:
        """Renew the leases of every delivery this worker holds (running or buffered).

        Its own loop, apart from :meth:`_renew_slots`: a slot renewal waits for a database
        connection (admissions may hold them all, waiting on the queue's flow lock), and a
        broker's lease is renewed in memory — it must never wait behind the database, or
        a busy worker's buffered deliveries expire and are redelivered as lost."""
        while True:
            await asyncio.sleep(self._renewal_interval())
            held = [d for batch in self._inflight.values() for d in batch] + list(self._buffer)
            if held:
                try:
                    await self.runtime.transport.extend(held)
                except Exception:
                    log.exception("lease renewal failed")

    async def _renew_slots(self) -> None:
        """Renew the concurrency slots of the running deliveries of limited queues (brokers;
        see :meth:`Harness.renew_slots`)."""
        while True:
            await asyncio.sleep(self._renewal_interval())
            if self._harness is not None and self._harness.slots:
                try:
                    await self._harness.renew_slots()
                except Exception:
                    log.exception("concurrency slot renewal failed")

    async def _maintenance(self) -> None:
        """Queue upkeep (expired leases) plus the app's housekeeping: fence cleanup, alert
        delivery and database gauges (see :mod:`jobfence.runtime.cleanup`)."""

        async def queue_upkeep() -> None:
            interval = max(min(self.runtime.lease.total_seconds() / 2, 5.0), 0.2)
            while True:
                try:
                    await self.runtime.transport.maintenance()
                    if self.flow is not None:
                        await self.flow.prune()
                except Exception:
                    log.exception("queue maintenance failed")
                await asyncio.sleep(interval)

        async with asyncio.TaskGroup() as group:
            group.create_task(queue_upkeep(), name="jobfence-queue-upkeep")
            group.create_task(
                housekeeping(
                    self.runtime.maintenance,
                    self.runtime.db,
                    jobs_db=self.runtime.transport.jobs_db,
                    min_age=self.runtime.redelivery_exposure,
                    fence_ttl=self.runtime.fence_ttl,
                    calls_db=lambda: ledger.opened if (ledger := self.runtime.ledger) else None,
                    flow_limits=self.flow.limits if self.flow is not None else None,
                ),
                name="jobfence-housekeeping",
            )
