"""Prometheus metrics (SPEC K1), fed by an :class:`~jobfence.observers.Observer`, the
background duties and :mod:`jobfence.runtime.health`. docs/metrics.md lists every series (a test
checks that it and this registry agree).

The metric objects live in prometheus-client's default registry, once per process, so every
App in a process reports into the same series.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from .core.jobs import Delivery, Job
from .errors import Category
from .observers import Observer

PROCESSED = Counter("jobfence_jobs_processed", "Jobs whose work committed.", ["queue", "consumer"])
DUPLICATES = Counter(
    "jobfence_duplicates_skipped",
    "Deliveries skipped because their job_id was already fenced.",
    ["queue", "consumer"],
)
RETRIES = Counter(
    "jobfence_retries", "Failed attempts scheduled for a retry.", ["queue", "consumer", "category"]
)
DEAD_LETTERS = Counter(
    "jobfence_dead_letters",
    "Jobs sent to dead letters.",
    ["queue", "consumer", "category"],
)
LOST = Counter(
    "jobfence_leases_lost", "Deliveries abandoned because another worker took the lease.", ["queue"]
)
HANDLER_SECONDS = Histogram(
    "jobfence_handler_duration_seconds",
    "Handler run time of jobs that committed.",
    ["queue"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

# The call ledger (jobfence.calls): recorded calls to systems outside the database
CALLS = Counter(
    "jobfence_calls",
    "Recorded calls (job.call) by step and how each ended for its delivery (succeeded, "
    "recorded, reconciled, settled_applied, rejected, unauthorized, not_sent, in_doubt, "
    "parked, unrecordable).",
    ["queue", "consumer", "step", "outcome"],
)
RECONCILES = Counter(
    "jobfence_call_reconciles",
    "Lookups of calls in doubt (reconcile) by result: found, not_found, error.",
    ["queue", "consumer", "step", "result"],
)
CALLS_OPEN = Gauge(
    "jobfence_calls_open",
    "Calls whose outcome is not known yet, by state (in_doubt; pending: being sent, or its "
    "process died).",
    ["state"],
)
CALLS_OLDEST_OPEN = Gauge(
    "jobfence_calls_oldest_open_age_seconds",
    "Age of the oldest call whose outcome is not known yet, by state.",
    ["state"],
)

# Gauges read from the database (refreshed by workers' maintenance and by the ops API's
# /metrics; see jobfence.review.stats.refresh_gauges).
PENDING_REVIEW = Gauge(
    "jobfence_dead_letters_pending_review",
    "Dead letters waiting for a person to replay or discard them.",
    ["queue", "category"],
)
QUEUE_DEPTH = Gauge(
    "jobfence_queue_depth", "Jobs in the database queue, by state.", ["queue", "state"]
)
ALERTS_UNDELIVERED = Gauge(
    "jobfence_alert_deliveries_pending",
    "Alert deliveries not yet accepted by their sink (due later or being retried).",
)
QUEUE_OLDEST_DUE = Gauge(
    "jobfence_queue_oldest_due_job_age_seconds",
    "How long the oldest due job of the database queue has waited since it fell due.",
    ["queue"],
)
QUEUE_PAUSED = Gauge(
    "jobfence_queue_paused",
    "1 for each queue an operator paused (ops API or console).",
    ["queue"],
)
OUTBOX_BACKLOG = Gauge(
    "jobfence_outbox_backlog",
    "Unpublished outbox events, by queue and state (PENDING, PUBLISH_FAILED_RETRY).",
    ["queue", "state"],
)
OUTBOX_OLDEST_PENDING = Gauge(
    "jobfence_outbox_oldest_pending_age_seconds",
    "Age of the oldest PENDING (not yet published) outbox event, by queue.",
    ["queue"],
)
FENCES = Gauge(
    "jobfence_fences",
    "Rows in the fence table (PostgreSQL: the planner's estimate; SQLite: exact).",
)
FENCE_BYTES = Gauge(
    "jobfence_fence_table_bytes", "Size of the fence table with its indexes (PostgreSQL only)."
)
GAUGES_REFRESHED = Gauge(
    "jobfence_gauges_refreshed_timestamp_seconds",
    "Unix time the database gauges of this process were last read.",
)

# Background duties (fence cleanup, alert delivery)
FENCES_DELETED = Counter("jobfence_fences_deleted", "Expired fence rows deleted by cleanup.")
CLEANUP_SUCCEEDED = Gauge(
    "jobfence_fence_cleanup_last_success_timestamp_seconds",
    "Unix time this process last finished a fence cleanup run with nothing left to delete.",
)
CLEANUP_FAILURES = Counter(
    "jobfence_fence_cleanup_failures", "Fence cleanup runs that failed with an error."
)
ALERTS_DELIVERED = Counter(
    "jobfence_alert_deliveries", "Alerts a sink accepted (sink: betterstack, webhook).", ["sink"]
)
ALERT_FAILURES = Counter(
    "jobfence_alert_delivery_failures",
    "Failed attempts to deliver an alert to a sink (each is retried).",
    ["sink"],
)

# The processes themselves (jobfence.runtime.health)
HEARTBEAT = Gauge(
    "jobfence_heartbeat_timestamp_seconds",
    "Unix time of the last tick of the process's event loop (every second while it runs).",
    ["component"],
)
READY = Gauge(
    "jobfence_ready", "1 while the process's /readyz answers ready, else 0.", ["component"]
)
WORKERS = Gauge("jobfence_workers", "Workers running in this process.")
RELAYS = Gauge("jobfence_relays", "Outbox relays running in this process.")
WORKER_SLOTS = Gauge(
    "jobfence_worker_slots", "Jobs this process's workers may run at once (--concurrency)."
)
WORKER_INFLIGHT = Gauge(
    "jobfence_worker_inflight_jobs", "Jobs this process's workers are running now."
)

# Flow control (issue 26 §5; docs/flow-control.md "Seeing it"). A key label names one of the
# 10 busiest keys of its queue (jobfence.runtime.flow_view.METRIC_KEYS, by jobs running then
# waiting) or "(other)" for the rest: at most 11 key values per queue and reason, however many
# partners there are.
FLOW_SLOTS_IN_USE = Gauge(
    "jobfence_flow_slots_in_use",
    "Concurrency slots taken per key of a queue with a Limit: jobs running with a live lease "
    'and broker deliveries\' slots (the 10 busiest keys, the rest as key="(other)").',
    ["queue", "key"],
)
FLOW_DEFERRED_JOBS = Gauge(
    "jobfence_flow_deferred_jobs",
    "Jobs waiting on a key that may not start more now, by reason: hold (paused or backing "
    "off), concurrency (its slots are taken), rate (its window is full); database queue.",
    ["queue", "reason", "key"],
)
FLOW_KEYS_HELD = Gauge(
    "jobfence_flow_keys_held",
    "Keys held now per queue, by kind: pause (an operator) or backoff (a handler's BackOff).",
    ["queue", "kind"],
)
FLOW_DEFERRALS = Counter(
    "jobfence_flow_deferrals",
    "Deliveries flow control put back without running them (no attempt used), by reason "
    "(concurrency, rate, backoff, pause, unavailable) and key (the first 10 keys of a queue "
    'this process saw, the rest as key="(other)").',
    ["queue", "reason", "key"],
)
#: keys per queue the deferral counter names in one process (first seen), the rest "(other)"
FLOW_COUNTER_KEYS = 10


class MetricsObserver(Observer):
    def __init__(self, consumers: dict[str, str]) -> None:
        self._consumers = consumers  # queue -> consumer name
        self._processed: dict[str, tuple[Any, Any]] = {}
        self._deferral_keys: dict[str, set[str]] = {}  # queue -> the keys it names

    def _consumer(self, queue: str) -> str:
        return self._consumers.get(queue, "?")

    def job_processed(self, job: Job[Any], duration: float) -> None:
        # the per-job path: label lookups are cached per queue
        children = self._processed.get(job.queue)
        if children is None:
            children = (
                PROCESSED.labels(job.queue, self._consumer(job.queue)),
                HANDLER_SECONDS.labels(job.queue),
            )
            self._processed[job.queue] = children
        children[0].inc()
        children[1].observe(duration)

    def job_duplicate(self, delivery: Delivery, consumer: str) -> None:
        DUPLICATES.labels(delivery.queue, consumer).inc()

    def job_retry(
        self, delivery: Delivery, consumer: str, category: Category, delay: timedelta, error: str
    ) -> None:
        RETRIES.labels(delivery.queue, consumer, category.value).inc()

    def job_dead(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        dead_letter_id: int | None,
        *,
        created: bool = True,
    ) -> None:
        if created:  # a repeat delivery that met its recorded letter is not a new one
            DEAD_LETTERS.labels(delivery.queue, consumer, category.value).inc()

    def job_lost(self, delivery: Delivery, consumer: str) -> None:
        LOST.labels(delivery.queue).inc()

    def job_deferred(
        self, delivery: Delivery, consumer: str, reason: str, key: str, delay: timedelta
    ) -> None:
        named = self._deferral_keys.setdefault(delivery.queue, set())
        if key not in named and len(named) < FLOW_COUNTER_KEYS:
            named.add(key)
        FLOW_DEFERRALS.labels(delivery.queue, reason, key if key in named else "(other)").inc()

    def call_finished(self, job: Job[Any], consumer: str, step: str, outcome: str) -> None:
        CALLS.labels(job.queue, consumer, step, outcome).inc()

    def call_reconciled(self, job: Job[Any], consumer: str, step: str, result: str) -> None:
        RECONCILES.labels(job.queue, consumer, step, result).inc()
