"""Structured logs (SPEC K2): every job event carries job_id and correlation_id, and, with
the ``otel`` extra, the ``trace_id`` and ``span_id`` of the span it happened in
(:class:`jobfence.tracing.TraceIds`, docs/tracing.md).

The library logs through stdlib ``logging`` with the fields in ``extra``, so it fits any
application's logging. The CLI renders them with structlog, as JSON lines or for a console.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from typing import Any

import structlog

from .core.jobs import Delivery, Job
from .errors import Category, RetryMode
from .observers import Observer
from .tracing import AVAILABLE as TRACING_AVAILABLE
from .tracing import TraceIds

log = logging.getLogger("jobfence.worker")


def _fields(delivery: Delivery | Job[Any], consumer: str | None = None) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "queue": delivery.queue,
        "job_id": delivery.job_id,
        "correlation_id": delivery.correlation_id,
        "attempt": delivery.attempt,
    }
    if consumer is not None:
        fields["consumer"] = consumer
    return fields


def _trace(trace: str | None) -> dict[str, str]:
    """The ``traceback`` field of an unexpected failure's log record (none for an error the
    handler raised on purpose: its category and message say it all)."""
    return {"traceback": trace} if trace else {}


class LogObserver(Observer):
    """Log levels follow the taxonomy (SPEC R4); duplicates and successes are DEBUG."""

    def job_processed(self, job: Job[Any], duration: float) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("job processed", extra={**_fields(job), "duration_s": round(duration, 6)})

    def job_duplicate(self, delivery: Delivery, consumer: str) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("duplicate skipped", extra=_fields(delivery, consumer))

    def job_retry(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        delay: timedelta,
        error: str,
        *,
        trace: str | None = None,
    ) -> None:
        level = category.info.log_level
        if error.startswith("Retry"):
            level = logging.INFO  # a requested retry is control flow, not an error
        log.log(
            level,
            "job failed; retry scheduled",
            extra={
                **_fields(delivery, consumer),
                "category": category.value,
                "retry_in_s": round(delay.total_seconds(), 3),
                "error": error,
                **_trace(trace),
            },
        )

    def job_dead(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        dead_letter_id: int | None,
        *,
        created: bool = True,
        trace: str | None = None,
    ) -> None:
        if not created or dead_letter_id is None:
            # the same job delivered again found its letter already recorded (the store's
            # write is idempotent and returns no new id): not a second dead letter
            log.info(
                "dead letter already recorded",
                extra={
                    **_fields(delivery, consumer),
                    "category": category.value,
                    "dead_letter_id": dead_letter_id,
                },
            )
            return
        level = category.info.log_level
        if category.info.retry is not RetryMode.NEVER:
            level = max(level, logging.ERROR)
        log.log(
            level,
            "job dead-lettered",
            extra={
                **_fields(delivery, consumer),
                "category": category.value,
                "dead_letter_id": dead_letter_id,
                "error": error,
                **_trace(trace),
            },
        )

    def job_lost(self, delivery: Delivery, consumer: str) -> None:
        log.warning("lease lost to another worker; skipping", extra=_fields(delivery, consumer))


#: Client libraries whose own log records are shown in jobfence's format, one line each
#: (nats-py logs some errors with a traceback; its connection events come through the NATS
#: transport's callbacks, see :class:`jobfence.transports.nats.ClientEvents`).
FOREIGN_LOGGERS = ("nats",)


class OneLine(logging.Filter):
    """Reduce a record's traceback to the exception's name and message (one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args = None
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        return True


def configure(level: str = "INFO", fmt: str = "console") -> None:
    """Render stdlib log records (with their extra fields) through structlog."""
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    if TRACING_AVAILABLE:
        handler.addFilter(TraceIds())
    root = logging.getLogger("jobfence")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    foreign = logging.StreamHandler(sys.stderr)
    foreign.setFormatter(formatter)
    foreign.addFilter(OneLine())
    if TRACING_AVAILABLE:
        foreign.addFilter(TraceIds())
    for name in FOREIGN_LOGGERS:
        library = logging.getLogger(name)
        library.handlers[:] = [foreign]
        library.setLevel(level.upper())
        library.propagate = False


def adopt_loggers(*names: str, level: str = "INFO") -> None:
    """Show other libraries' records (uvicorn's under ``ops serve``) in jobfence's format and
    level; call after :func:`configure`."""
    handlers = list(logging.getLogger("jobfence").handlers)
    for name in names:
        library = logging.getLogger(name)
        library.handlers[:] = handlers
        library.setLevel(level.upper())
        library.propagate = False


def dump_tasks(logger: logging.Logger = log) -> None:
    """Log every task of the running event loop with where it waits (what ``kill -USR1``
    of a worker or relay does): the answer to "what is it stuck on?" without a debugger.
    Threads blocked outside the loop show with ``PYTHONFAULTHANDLER=1`` and SIGABRT."""
    import asyncio
    import io

    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    for task in tasks:
        stack = io.StringIO()
        task.print_stack(limit=12, file=stack)
        logger.warning(
            f"task {task.get_name()}",
            extra={"task": task.get_name(), "stack": stack.getvalue().strip()},
        )
    logger.warning(f"{len(tasks)} task(s) dumped", extra={"tasks": len(tasks)})
