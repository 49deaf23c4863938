"""What the broker adapters share: URL options, message metadata, attempt history.

A broker message carries, next to its payload, the job's identity and its past: the
attempts used before this copy was published (``attempts``) and the history of those
attempts. An adapter adds the broker's own redelivery count to ``attempts`` (SPEC R1: a
delivery lost with its worker counts), and the attempts that left no record — deliveries
lost with a killed worker — are written into the history as such.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..core.jobs import (
    TRACEPARENT,
    TRACESTATE,
    AttemptRecord,
    Delivery,
    OutgoingJob,
    history_from,
    history_json,
    trace_context_of,
    trace_headers,
)
from ..errors import Category, ConfigurationError, tail

#: Header / field names carried by every broker message.
JOB_ID = "jobfence-job-id"
CORRELATION_ID = "jobfence-correlation-id"
ENQUEUED_AT = "jobfence-enqueued-at"
ATTEMPTS = "jobfence-attempts"
HISTORY = "jobfence-history"
DELAY = "jobfence-delay"

LOST = "delivery lost: the worker holding it stopped without an answer (killed or lost)"


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """The same shape as the database's timestamps in histories: ``…T…Z``, microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(value: str | bytes | None) -> datetime | None:
    if not value:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def retry_record(
    delivery: Delivery,
    delay: timedelta,
    category: Category,
    error: str,
    trace: str | None = None,
) -> AttemptRecord:
    """The history entry of a failed attempt that will be retried after ``delay``.

    Brokers have no database clock: the time is the worker's (UTC).
    """
    now = utcnow()
    return AttemptRecord(
        attempt=delivery.attempt,
        at=iso(now),
        category=category.value,
        error=error,
        retry_at=iso(now + delay),
        trace=trace,
    )


#: the category of a deferral in a job's history (not an error: no attempt was consumed); the
#: database queue writes the same (its ``defer`` query)
DEFERRED = "DEFERRED"


def deferred_history(delivery: Delivery, delay: timedelta, note: str | None) -> list[AttemptRecord]:
    """The history a deferred copy of ``delivery`` carries: its own, plus, with a ``note``,
    the deferral (attempt: the attempts consumed so far, as the database queue records it)."""
    if note is None:
        return delivery.history
    now = utcnow()
    record = AttemptRecord(
        attempt=max(delivery.attempt - 1, 0),
        at=iso(now),
        category=DEFERRED,
        error=note,
        retry_at=iso(now + delay),
    )
    return [*delivery.history, record]


#: The bytes of tracebacks a broker message carries in its history (RabbitMQ's headers must
#: fit one frame, 128 KiB by default; NATS counts headers into max_payload). The newest
#: attempts keep theirs; the dead letter keeps the last attempt's in full either way.
BROKER_TRACE_BUDGET = 32 * 1024


def fit_traces(
    history: list[AttemptRecord], budget: int = BROKER_TRACE_BUDGET
) -> list[AttemptRecord]:
    """``history`` with its tracebacks within ``budget`` UTF-8 bytes: newest first, each cut
    to its last bytes when the rest of the budget is smaller; older ones dropped."""
    left = budget
    fitted: list[AttemptRecord] = []
    for record in reversed(history):
        trace = record.trace
        if trace is not None:
            if left < 512:
                trace = None
            elif len(trace.encode("utf-8")) > left:
                trace = tail(trace, left)
            left -= len(trace.encode("utf-8")) if trace else 0
            record = replace(record, trace=trace)
        fitted.append(record)
    fitted.reverse()
    return fitted


def with_lost_attempts(history: list[AttemptRecord], attempt: int) -> list[AttemptRecord]:
    """``history`` plus one entry for every earlier attempt that left none (a lost delivery)."""
    recorded = {h.attempt for h in history}
    missing = [n for n in range(1, attempt) if n not in recorded]
    if not missing:
        return history
    at = iso(utcnow())
    lost = [
        AttemptRecord(attempt=n, at=at, category=Category.TECHNICAL_ERROR.value, error=LOST)
        for n in missing
    ]
    return sorted([*history, *lost], key=lambda h: h.attempt)


@dataclass(frozen=True)
class Meta:
    """A job's identity and past as carried by a broker message."""

    job_id: str
    correlation_id: str | None
    enqueued_at: datetime | None
    attempts: int
    history: list[AttemptRecord]
    #: the W3C trace context, as the ``traceparent`` and ``tracestate`` headers (the names
    #: OpenTelemetry's instrumentations of these brokers use too)
    trace_context: str | None = None

    @classmethod
    def new(cls, job: OutgoingJob) -> Meta:
        return cls(job.job_id, job.correlation_id, utcnow(), 0, [], job.trace_context)

    @classmethod
    def again(cls, delivery: Delivery, *, attempts: int, history: list[AttemptRecord]) -> Meta:
        """The metadata of a new copy of ``delivery`` (a retry or a hand-back)."""
        return cls(
            delivery.job_id,
            delivery.correlation_id,
            delivery.enqueued_at,
            attempts,
            history,
            delivery.trace_context,
        )

    def headers(self) -> dict[str, str]:
        headers = {JOB_ID: self.job_id, ATTEMPTS: str(self.attempts)}
        if self.correlation_id is not None:
            headers[CORRELATION_ID] = self.correlation_id
        if self.enqueued_at is not None:
            headers[ENQUEUED_AT] = iso(self.enqueued_at)
        if self.history:
            headers[HISTORY] = history_json(fit_traces(self.history))
        headers.update(trace_headers(self.trace_context))
        return headers

    @classmethod
    def read(cls, headers: dict[str, Any], fallback_job_id: str = "") -> Meta:
        def text(key: str) -> str | None:
            value = headers.get(key)
            if value is None:
                return None
            return value.decode() if isinstance(value, bytes) else str(value)

        try:
            attempts = int(text(ATTEMPTS) or 0)
        except ValueError:
            attempts = 0
        return cls(
            job_id=text(JOB_ID) or fallback_job_id,
            correlation_id=text(CORRELATION_ID),
            enqueued_at=parse_iso(text(ENQUEUED_AT)),
            attempts=max(attempts, 0),
            history=history_from(text(HISTORY)),
            trace_context=trace_context_of(headers.get(TRACEPARENT), headers.get(TRACESTATE)),
        )

    def delivery(self, queue: str, payload: bytes, attempt: int, token: Any, ref: Any) -> Delivery:
        return Delivery(
            queue=queue,
            job_id=self.job_id,
            payload=payload,
            attempt=attempt,
            correlation_id=self.correlation_id,
            enqueued_at=self.enqueued_at,
            history=with_lost_attempts(list(self.history), attempt),
            token=token,
            ref=ref,
            trace_context=self.trace_context,
        )


class Options:
    """``?name=value`` options of a broker URL, each read once with its type and bounds."""

    def __init__(self, url: str, broker: str) -> None:
        parts = urlsplit(url)
        self.broker = broker
        self._params = dict(parse_qsl(parts.query, keep_blank_values=True))
        self._parts = parts
        self._used: set[str] = set()

    def integer(self, name: str, default: int, *, minimum: int = 0) -> int:
        self._used.add(name)
        raw = self._params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigurationError(
                f"{self.broker} URL option {name}={raw!r} is not an integer"
            ) from None
        if value < minimum:
            raise ConfigurationError(f"{self.broker} URL option {name} must be >= {minimum}")
        return value

    def text(self, name: str, default: str) -> str:
        self._used.add(name)
        return self._params.get(name, default) or default

    def unused(self) -> list[str]:
        """The options given in the URL that no ``integer``/``text`` call read."""
        return sorted(k for k in self._params if k not in self._used)

    def remaining_url(self) -> str:
        """The URL without the options jobfence consumed (the rest go to the client)."""
        rest = {k: v for k, v in self._params.items() if k not in self._used}
        return urlunsplit(self._parts._replace(query=urlencode(rest)))
