"""What a worker does in the background besides its jobs: fence cleanup (SPEC T2), alert
delivery (SPEC D4) and the database gauges (SPEC K1). The duties take plain values (the
databases, the settings, the youngest fence age that may go), not an App."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from ..alerts import AlertDispatcher, AlertSink, sinks_from_env
from ..core.limits import Limit
from ..db import Database
from ..errors import ConfigurationError
from ..review.stats import refresh_gauges
from .cleanup import DEFAULT_BATCH, DEFAULT_INTERVAL, cleanup_loop
from .flow_view import refresh_flow_gauges
from .partitions import days_loop

log = logging.getLogger("jobfence.maintenance")


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


async def _gauges_loop(
    db: Database,
    jobs_db: Database | None,
    interval: timedelta,
    calls_db: Callable[[], Database | None],
    flow_limits: Mapping[str, Limit] | None = None,
) -> None:
    """Every worker reads the gauges (docs/metrics.md: why not one reader per database), and
    the flow gauges of the queues it serves with a Limit."""
    while True:
        try:
            await refresh_gauges(db, jobs_db, calls_db())
        except Exception as exc:
            log.error("refreshing the database gauges failed: %s", exc)
        if flow_limits:
            try:
                await refresh_flow_gauges(jobs_db or db, flow_limits)
            except Exception as exc:
                log.error("refreshing the flow gauges failed: %s", exc)
        await asyncio.sleep(interval.total_seconds())


async def housekeeping(
    settings: Maintenance,
    db: Database,
    *,
    jobs_db: Database | None,
    min_age: timedelta,
    fence_ttl: timedelta,
    calls_db: Callable[[], Database | None] = lambda: None,
    flow_limits: Mapping[str, Limit] | None = None,
) -> None:
    """A worker's background duties, until cancelled: on PostgreSQL the fence partitions of
    the days ahead (``fence_ttl`` says which), fence cleanup (never of a fence younger than
    ``min_age``), alert delivery and the database gauges (``jobs_db``: the database holding
    the jobs, the transport's job-control view, None: ``db``; ``calls_db``: the call ledger's
    database once it is open; ``flow_limits``: the Limits of the queues it serves, for the
    flow gauges), as ``settings`` say. Never raises."""
    async with asyncio.TaskGroup() as group:
        if db.dialect == "postgresql":
            group.create_task(
                days_loop(db, ttl=fence_ttl, interval=settings.cleanup_interval),
                name="jobfence-fence-days",
            )
        if settings.cleanup:
            group.create_task(
                cleanup_loop(
                    db,
                    min_age=min_age,
                    interval=settings.cleanup_interval,
                    batch=settings.cleanup_batch,
                ),
                name="jobfence-cleanup",
            )
        if settings.alerts:
            try:
                sinks = sinks_from_env() if settings.alert_sinks is None else settings.alert_sinks
                dispatcher = AlertDispatcher(
                    db,
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
        group.create_task(
            _gauges_loop(db, jobs_db, settings.gauges_interval, calls_db, flow_limits),
            name="jobfence-gauges",
        )
