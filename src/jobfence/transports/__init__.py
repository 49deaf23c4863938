"""The queue port: what the harness needs from any queue, database-backed or broker.

A transport hands over :class:`~jobfence.core.jobs.Delivery` objects and is told, after the work
transaction has committed (or failed), what happened to each. Semantics live in the harness;
an adapter only moves messages.

``shares_database`` is True for a queue that lives in the same database as the fence
(:meth:`Transport.commits_with` that database): then the acknowledgement is a statement
inside the work transaction (:func:`jobfence.core.fence.work`) and :meth:`ack` is used only
for dead letters' twins; :meth:`Transport.publish_tx` writes jobs in the caller's
transaction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import timedelta

from ..core.jobs import DEFAULT_PRIORITY, Delivery, OutgoingJob
from ..core.limits import Limit
from ..db import Database, Tx
from ..errors import (
    Category,
    ConfigurationError,
    EnqueueError,
    JobControlUnavailable,
    extra_needed,
)

MiB = 1024 * 1024

#: What every door (CLI, ops API, console) says when job control meets a broker.
NO_JOB_CONTROL = (
    "this transport keeps its jobs in a broker, not in a database: jobs and queue pauses are "
    "for the database queue (docs/job-control.md says what each broker can show)"
)


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def check_payload_sizes(
    jobs: Sequence[OutgoingJob], limit: int | None, transport: str, why: str
) -> None:
    """Raise :class:`EnqueueError` for the first job whose payload is over ``limit`` bytes,
    naming its size, the limit and where the limit comes from (``why``)."""
    if limit is None:
        return
    for job in jobs:
        size = len(job.payload)
        if size > limit:
            job_id = job.job_id if len(job.job_id) <= 60 else job.job_id[:57] + "..."
            raise EnqueueError(
                f"payload of job {job_id!r} is {size} bytes ({_size(size)}); the {transport} "
                f"transport takes at most {limit} bytes ({_size(limit)}: {why}). Keep large "
                "data elsewhere (object storage, a table) and enqueue a reference to it"
            )


def check_no_priorities(jobs: Sequence[OutgoingJob], transport: str, why: str) -> None:
    """Raise :class:`EnqueueError` for the first job with a priority other than the default:
    a transport that would deliver it in plain order refuses it rather than ignore it."""
    for job in jobs:
        if job.priority != DEFAULT_PRIORITY:
            raise EnqueueError(
                f"job {job.job_id[:60]!r} has priority {job.priority}, but the {transport} "
                f"transport cannot deliver by priority ({why}); enqueue it without a priority, "
                'or use a transport that has them (docs/flow-control.md "Priorities")'
            )


class Transport(ABC):
    """The queue port (SPEC Q1)."""

    #: Human name for logs and docs ("postgresql", "sqlite", "rabbitmq", …).
    name: str = "transport"
    #: Acks can join the work transaction (the queue is a table in the fence's database).
    shares_database: bool = False
    #: The database holding the queue's table (the database queue), else None (a broker).
    queue_db: Database | None = None
    #: Whether jobs of a higher priority are delivered first (``enqueue(priority=)``); a
    #: transport without refuses any priority but the default (:meth:`check_payloads`).
    priorities: bool = False
    #: Why :attr:`priorities` is False, and what to do (shown in the refusal).
    no_priorities_reason: str = "this broker has no message priorities"

    @property
    def max_payload(self) -> int | None:
        """The largest payload in bytes this transport takes (None: it states no limit).

        Brokers know theirs once open (it comes from the server)."""
        return None

    @property
    def max_payload_reason(self) -> str:
        """Where :attr:`max_payload` comes from, for people (shown in the error)."""
        return "this transport's limit"

    @property
    def jobs_db(self) -> Database | None:
        """The job-control view: the database whose ``jobs`` table holds this queue's jobs
        (and its queue pauses), or None when a broker keeps them itself."""
        return self.queue_db

    def job_control(self) -> Database:
        """:attr:`jobs_db` for listing, showing, retrying and cancelling jobs and pausing
        queues; :class:`~jobfence.errors.JobControlUnavailable` (one message for every door)
        when a broker keeps the jobs."""
        if self.queue_db is None:
            raise JobControlUnavailable(NO_JOB_CONTROL)
        return self.queue_db

    def check_payloads(self, jobs: Sequence[OutgoingJob]) -> None:
        """:class:`EnqueueError` if a job's payload is over :attr:`max_payload`, or it has a
        priority this transport cannot keep (called before anything of ``jobs`` is sent, so a
        refused batch enqueues nothing)."""
        check_payload_sizes(jobs, self.max_payload, self.name, self.max_payload_reason)
        if not self.priorities:
            check_no_priorities(jobs, self.name, self.no_priorities_reason)

    async def open(self) -> None:
        """Connect. Called once before use."""

    async def close(self) -> None:
        """Disconnect; pending deliveries come back to the queue by the broker's own rules."""

    @abstractmethod
    async def publish(self, jobs: Sequence[OutgoingJob]) -> None:
        """Put jobs on their queues (durably, before returning)."""

    async def publish_tx(self, tx: Tx, jobs: Sequence[OutgoingJob]) -> bool:
        """Put ``jobs`` on their queues as part of ``tx``, the caller's transaction. True:
        they were written in ``tx`` and commit or roll back with it (:meth:`commits_with`
        its database). False: they were published now, before ``tx`` commits (a broker, or a
        queue in another database) — if ``tx`` then rolls back they stay published, and the
        next attempt publishes them again: a duplicate delivery, which the fence absorbs."""
        await self.publish(jobs)
        return False

    def commits_with(self, db: Database) -> bool:
        """Whether :meth:`publish_tx` on a transaction of ``db`` writes the jobs in it (the
        queue is a table of ``db``): a caller may then batch more, and need not publish
        before its own commit."""
        return False

    @abstractmethod
    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        """Up to ``limit`` deliveries; wait at most ``timeout`` seconds when none is ready."""

    @abstractmethod
    async def ack(self, delivery: Delivery) -> None:
        """The delivery is done (its effect committed, or it was dead-lettered)."""

    @abstractmethod
    async def retry(
        self,
        delivery: Delivery,
        delay: timedelta,
        category: Category,
        error: str,
        *,
        trace: str | None = None,
    ) -> None:
        """Deliver again after ``delay``, keeping the attempt count and adding this attempt
        (its category, error and traceback ``trace``) to the history."""

    @abstractmethod
    async def release(self, delivery: Delivery, *, attempted: bool) -> None:
        """Give a delivery back now (graceful shutdown); ``attempted=False`` refunds it."""

    @abstractmethod
    async def defer(self, delivery: Delivery, delay: timedelta, *, note: str | None = None) -> None:
        """Put ``delivery`` back on its queue, to be delivered again after ``delay`` (never
        before), without consuming an attempt (flow control: its key is full, held or
        paused) — :meth:`release` with ``attempted=False``, later. ``note``: the history
        records the deferral (category ``DEFERRED``, the note as its error, when it is due);
        None: the history is untouched. At least once: a worker killed while deferring
        leaves the job on its queue (the old delivery comes back after its lease, or both
        copies come back and the fence absorbs the second)."""

    async def dead_lettered(
        self, delivery: Delivery, *, consumer: str, category: Category, code: str | None
    ) -> None:
        """The harness has written ``delivery``'s dead letter and is about to ack it.

        A broker with a dead-letter topic of its own mirrors the letter there (Pub/Sub
        publishes it to the queue's DLQ topic); by default nothing happens. An exception
        leaves the delivery unacked: it comes back, and the dead letter's write is idempotent.
        """

    async def requeue_tx(
        self,
        tx: Tx,
        delivery: Delivery,
        delay: timedelta,
        category: Category,
        error: str,
        *,
        trace: str | None = None,
    ) -> None:
        """:meth:`retry` inside the work transaction ``tx``, for a delivery already acked in
        it (group commit). Only a queue in the fence's database can (:attr:`queue_db`)."""
        raise ConfigurationError(f"the {self.name} transport cannot retry inside a transaction")

    async def defer_tx(self, tx: Tx, delivery: Delivery, delay: timedelta, note: str) -> None:
        """:meth:`defer` inside the work transaction ``tx`` for a delivery already acked in
        it (group commit). Only a queue in the fence's database can."""
        raise ConfigurationError(f"the {self.name} transport cannot defer inside a transaction")

    def use_limits(self, limits: Mapping[str, Limit]) -> None:
        """The consumers' flow limits (queue → Limit), set by the worker before it fetches:
        the database queue enforces them in its claim; a broker ignores them (the harness
        admits its deliveries through jobfence.runtime.flow)."""

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        """Renew the leases of deliveries still being worked on (heartbeat)."""

    async def maintenance(self) -> None:
        """Periodic housekeeping (e.g. return jobs whose lease expired)."""

    def wake(self) -> None:
        """Stop a waiting :meth:`fetch` early (work was enqueued in this process, or we stop)."""


#: Broker URL schemes and the adapter class that serves each (module:Class), imported lazily
#: so that a broker's client library is needed only when that broker is used.
BROKERS: dict[str, tuple[str, str]] = {
    "amqp": ("jobfence.transports.rabbitmq:RabbitMQTransport", "rabbitmq"),
    "amqps": ("jobfence.transports.rabbitmq:RabbitMQTransport", "rabbitmq"),
    "nats": ("jobfence.transports.nats:NatsTransport", "nats"),
    "tls": ("jobfence.transports.nats:NatsTransport", "nats"),
    "redis": ("jobfence.transports.redis:RedisTransport", "redis"),
    "rediss": ("jobfence.transports.redis:RedisTransport", "redis"),
    "pubsub": ("jobfence.transports.pubsub:PubSubTransport", "pubsub"),
}


def url_scheme(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def is_broker_url(url: str) -> bool:
    return url_scheme(url) in BROKERS


def broker_from_url(url: str, *, lease: timedelta, worker_id: str) -> Transport:
    """The broker adapter for ``url`` (amqp://, nats://, redis://, pubsub://), not yet opened.

    Each adapter class provides ``from_url(url, *, lease, worker_id)``.
    """
    import importlib

    scheme = url_scheme(url)
    if scheme not in BROKERS:
        raise ConfigurationError(
            f"unsupported transport URL scheme {scheme!r}; use postgresql://, sqlite:///, "
            "amqp://, nats://, redis:// or pubsub://"
        )
    target, extra = BROKERS[scheme]
    module_name, _, class_name = target.partition(":")
    with extra_needed(extra, f"the {extra} transport"):
        module = importlib.import_module(module_name)
    cls = getattr(module, class_name)
    transport: Transport = cls.from_url(url, lease=lease, worker_id=worker_id)
    return transport
