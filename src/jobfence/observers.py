"""Lifecycle hooks. Metrics and logs hang off these, not off the worker loop (STYLE habit 8).

Every hook is a no-op by default; subclass :class:`Observer` and override what you need.
An observer that raises is logged and ignored: it can never change a job's outcome.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from .core.jobs import Delivery, Job
from .errors import Category

log = logging.getLogger("jobfence.observers")


class Observer:
    def job_started(self, job: Job[Any]) -> None:
        """The handler is about to run (its fence row is in place)."""

    def job_processed(self, job: Job[Any], duration: float) -> None:
        """The work committed; ``duration`` is the handler's run time in seconds."""

    def job_duplicate(self, delivery: Delivery, consumer: str) -> None:
        """The job_id was already fenced: acked and skipped, the handler did not run."""

    def job_retry(
        self, delivery: Delivery, consumer: str, category: Category, delay: timedelta, error: str
    ) -> None:
        """A failed attempt was scheduled for another try.

        An override that also takes the keyword argument ``trace: str | None = None`` gets
        the attempt's traceback when the failure was unexpected (not an error the handler
        raised on purpose; see :attr:`jobfence.runtime.harness.Failure.expected`), else None. The
        same holds for :meth:`job_dead`."""

    def job_dead(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        dead_letter_id: int | None,
    ) -> None:
        """The job went to dead letters.

        Writing a dead letter is idempotent (one pending letter per consumer and job_id),
        so the same job delivered again finds its letter already recorded. An override that
        also takes the keyword argument ``created: bool = True`` is told which: False for
        such a repeat, and then ``dead_letter_id`` is the existing letter's id (or None
        when the store did not say which). Overrides without it are called as before.
        """

    def job_lost(self, delivery: Delivery, consumer: str) -> None:
        """Our lease was taken over before the work started; another worker owns the job."""

    def job_deferred(
        self, delivery: Delivery, consumer: str, reason: str, key: str, delay: timedelta
    ) -> None:
        """Flow control put a broker delivery back on its queue for ``delay`` without running
        it and without counting an attempt. ``reason``: ``concurrency`` or ``rate`` (its
        key's limit is full), ``backoff`` (the key is held: a handler raised
        :class:`~jobfence.BackOff`, and then this delivery is the one that raised it),
        ``pause`` (an operator paused the key), ``unavailable`` (the flow state could not
        be read: the database is away). ``key``: the job's flow key (``""``: the whole
        queue)."""

    async def after_commit(self, job: Job[Any]) -> None:
        """The work transaction committed; the transport has not been acked yet."""

    def call_finished(self, job: Job[Any], consumer: str, step: str, outcome: str) -> None:
        """A recorded call (``job.call``) ended for this delivery: ``outcome`` is
        ``succeeded`` (sent and answered), ``recorded`` (an earlier delivery's answer, no
        call), ``reconciled`` (found downstream), ``settled_applied``, ``rejected``,
        ``unauthorized``, ``not_sent``, ``in_doubt`` (still unknown, the job is retried),
        ``parked`` (the job goes to dead letters) or ``unrecordable``."""

    def call_reconciled(self, job: Job[Any], consumer: str, step: str, result: str) -> None:
        """A call in doubt was looked up downstream: ``found``, ``not_found`` or ``error``."""


class Observers(Observer):
    """Fan a hook out to many observers, isolating their failures."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = list(observers)
        # per hook, the bound methods of the observers that override it: the per-job path
        # calls only those (with no override, a hook costs one empty loop)
        self._hooks: dict[str, list[Any]] = {
            hook: [
                getattr(o, hook)
                for o in self.observers
                if getattr(type(o), hook) is not getattr(Observer, hook)
            ]
            for hook in _HOOKS
        }
        # job_dead overrides written before ``created`` existed are called without it
        self._dead_takes_created = [_takes(method, "created") for method in self._hooks["job_dead"]]
        # and those written before ``trace`` existed without it
        self._dead_takes_trace = [_takes(method, "trace") for method in self._hooks["job_dead"]]
        self._retry_takes_trace = [_takes(method, "trace") for method in self._hooks["job_retry"]]

    def _each(self, hook: str, *args: Any) -> None:
        for method in self._hooks[hook]:
            try:
                method(*args)
            except Exception:
                log.exception("observer %s failed in %s", type(method.__self__).__name__, hook)

    def job_started(self, job: Job[Any]) -> None:
        self._each("job_started", job)

    def job_processed(self, job: Job[Any], duration: float) -> None:
        self._each("job_processed", job, duration)

    def job_duplicate(self, delivery: Delivery, consumer: str) -> None:
        self._each("job_duplicate", delivery, consumer)

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
        args = (delivery, consumer, category, delay, error)
        for method, takes_trace in zip(
            self._hooks["job_retry"], self._retry_takes_trace, strict=True
        ):
            try:
                if takes_trace:
                    method(*args, trace=trace)
                else:
                    method(*args)
            except Exception:
                log.exception("observer %s failed in job_retry", type(method.__self__).__name__)

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
        args = (delivery, consumer, category, error, dead_letter_id)
        for method, takes_created, takes_trace in zip(
            self._hooks["job_dead"], self._dead_takes_created, self._dead_takes_trace, strict=True
        ):
            extra: dict[str, Any] = {}
            if takes_created:
                extra["created"] = created
            if takes_trace:
                extra["trace"] = trace
            try:
                method(*args, **extra)
            except Exception:
                log.exception("observer %s failed in job_dead", type(method.__self__).__name__)

    def job_lost(self, delivery: Delivery, consumer: str) -> None:
        self._each("job_lost", delivery, consumer)

    def job_deferred(
        self, delivery: Delivery, consumer: str, reason: str, key: str, delay: timedelta
    ) -> None:
        self._each("job_deferred", delivery, consumer, reason, key, delay)

    def call_finished(self, job: Job[Any], consumer: str, step: str, outcome: str) -> None:
        self._each("call_finished", job, consumer, step, outcome)

    def call_reconciled(self, job: Job[Any], consumer: str, step: str, result: str) -> None:
        self._each("call_reconciled", job, consumer, step, result)

    @property
    def wants_after_commit(self) -> bool:
        return bool(self._hooks["after_commit"])

    async def after_commit(self, job: Job[Any]) -> None:
        for method in self._hooks["after_commit"]:
            try:
                await method(job)
            except Exception:
                log.exception("observer %s failed in after_commit", type(method.__self__).__name__)


def _takes(method: Any, name: str) -> bool:
    """Whether ``method`` accepts the keyword argument ``name``."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == name and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in parameters
    )


_HOOKS = (
    "job_started",
    "job_processed",
    "job_duplicate",
    "job_retry",
    "job_dead",
    "job_lost",
    "job_deferred",
    "after_commit",
    "call_finished",
    "call_reconciled",
)
