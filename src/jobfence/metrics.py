"""Prometheus metrics (SPEC K1), fed by an :class:`~jobfence.observers.Observer`.

The metric objects live in prometheus-client's default registry, once per process, so every
App in a process reports into the same series.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from .errors import Category
from .jobs import Delivery, Job
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

# Gauges read from the database (refreshed by workers' maintenance and by the ops API's
# /metrics; see jobfence.stats.refresh_gauges).
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
QUEUE_PAUSED = Gauge(
    "jobfence_queue_paused",
    "1 for each queue paused by an operator (workers claim nothing from it until resumed).",
    ["queue"],
)


class MetricsObserver(Observer):
    def __init__(self, consumers: dict[str, str]) -> None:
        self._consumers = consumers  # queue -> consumer name
        self._processed: dict[str, tuple[Any, Any]] = {}

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


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Expose ``/metrics`` on ``host:port`` in a background thread."""
    start_http_server(port, addr=host)
