"""OpenTelemetry traces (issue 17 §1; docs/tracing.md): one trace from the HTTP POST to the
handler's effect.

Needs the ``otel`` extra (the OpenTelemetry **API** only); the application installs and
configures the SDK and its exporter. Without the extra this module still imports,
:data:`AVAILABLE` is False, :func:`get` returns None and nothing anywhere does tracing work:
the app, the harness and the doors hold ``None`` and take their untraced path. With the API
and no SDK the spans are the API's no-op spans (an incoming trace context is still passed on).

What travels with a job is its W3C trace context (``traceparent`` and ``tracestate``), always
in W3C form whatever global propagator the application set: a column of the queue, outbox
and dead-letter tables, message headers or attributes on a broker
(:func:`jobfence.core.jobs.trace_context_of` is the stored form).

Spans (names follow the messaging conventions, ``{operation} {destination}``):

====================  ========  =========================================================
``send {queue}``      PRODUCER  ``App.enqueue*``: the jobs carry this span's context
``create {queue}``    PRODUCER  ``outbox.write``: the event (and later its job) carries it
``publish {queue}``   PRODUCER  the relay publishing an event (child of its ``create``)
``process {queue}``   CONSUMER  one delivery through the harness, child of the job's context
``retry {queue}``     INTERNAL  a retry scheduled (child of ``process``)
``dead_letter {q}``   INTERNAL  a dead letter written (child of ``process``)
``replay {queue}``    PRODUCER  a dead-letter replay: links to the letters' original traces
``idempotency …``     SERVER /  the HTTP idempotency middleware (``jobfence.http``)
                      INTERNAL
====================  ========  =========================================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .core.jobs import Delivery, Job, trace_context_of, trace_headers
from .errors import Category
from .observers import Observer

if TYPE_CHECKING:
    from .core.jobs import OutgoingJob

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import (
        INVALID_SPAN,
        Link,
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanKind,
        Status,
        StatusCode,
    )
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
except ImportError:  # the ``otel`` extra is not installed
    AVAILABLE = False

log = logging.getLogger("jobfence.tracing")

#: the instrumentation scope's name (``otel.scope.name`` on every span)
SCOPE = "jobfence"

#: ``messaging.system`` per transport name where OpenTelemetry has a well-known value
_SYSTEMS = {"pubsub": "gcp_pubsub"}

#: span attributes (OpenTelemetry messaging conventions, then jobfence's own)
SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
BATCH_COUNT = "messaging.batch.message_count"
CONVERSATION_ID = "messaging.message.conversation_id"
JOB_ID = "jobfence.job_id"
CORRELATION_ID = "jobfence.correlation_id"
OUTCOME = "jobfence.outcome"
ERROR_CATEGORY = "jobfence.error.category"
ATTEMPT = "jobfence.attempt"
CONSUMER = "jobfence.consumer"
IDEMPOTENCY_OUTCOME = "jobfence.idempotency.outcome"
CALL_STEP = "jobfence.call.step"
CALL_KEY = "jobfence.call.key"
CALL_OUTCOME = "jobfence.call.outcome"


def system_of(transport_name: str) -> str:
    """``messaging.system`` for a transport (``postgresql``, ``rabbitmq``, ``gcp_pubsub``…)."""
    return _SYSTEMS.get(transport_name, transport_name)


def _job_attributes(job_id: str, correlation_id: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {MESSAGE_ID: job_id, JOB_ID: job_id}
    if correlation_id:
        attributes[CORRELATION_ID] = correlation_id
        attributes[CONVERSATION_ID] = correlation_id
    return attributes


class Tracing(Observer):
    """Spans and trace-context propagation for one process (:func:`get`).

    As an :class:`~jobfence.observers.Observer` it turns retries and dead letters into
    spans under the delivery's ``process`` span."""

    def __init__(self) -> None:
        self.tracer = otel_trace.get_tracer(SCOPE)
        self.propagator = TraceContextTextMapPropagator()
        self._live = False

    @property
    def live(self) -> bool:
        """An SDK records spans (a tracer provider other than the API's no-op one is set;
        once set it stays). Until then the per-job paths make no spans: they only pass the
        trace context on, which is all the API's no-op spans would do."""
        if not self._live:
            provider = otel_trace.get_tracer_provider()
            self._live = not isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)
        return self._live

    # -- the stored form -------------------------------------------------------------------

    def current(self) -> str | None:
        """The current context as a job carries it (None when there is no valid span)."""
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier)
        return trace_context_of(carrier.get("traceparent"), carrier.get("tracestate"))

    def context_of(self, trace_context: str | None) -> Any:
        """The OpenTelemetry context a job's stored trace context names (an empty context,
        i.e. a new trace, for None or a malformed one)."""
        if not trace_context:
            return _EMPTY
        return self.propagator.extract(trace_headers(trace_context), context=_EMPTY)

    def span_context_of(self, trace_context: str | None) -> Any:
        return otel_trace.get_current_span(self.context_of(trace_context)).get_span_context()

    # -- producers -------------------------------------------------------------------------

    @contextmanager
    def send(self, jobs: Sequence[OutgoingJob], transport: str) -> Iterator[Sequence[OutgoingJob]]:
        """A ``send`` span around enqueueing ``jobs``; yields them carrying its context."""
        if not self.live:
            passed_on = self.current()  # a context the caller runs in (a traced job's)
            yield [replace(job, trace_context=passed_on) for job in jobs] if passed_on else jobs
            return
        queues = {job.queue for job in jobs}
        queue = next(iter(queues)) if len(queues) == 1 else "(several)"
        attributes: dict[str, Any] = {
            SYSTEM: system_of(transport),
            OPERATION_TYPE: "send",
            OPERATION_NAME: "enqueue",
        }
        if len(queues) == 1:
            attributes[DESTINATION] = queue
        if len(jobs) == 1:
            attributes.update(_job_attributes(jobs[0].job_id, jobs[0].correlation_id))
        else:
            attributes[BATCH_COUNT] = len(jobs)
        with self.tracer.start_as_current_span(
            f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            context = self.current()
            yield [replace(job, trace_context=context) for job in jobs] if context else list(jobs)

    @contextmanager
    def create(
        self, queue: str, event_id: str, correlation_id: str | None, system: str
    ) -> Iterator[str | None]:
        """A ``create`` span around writing an outbox event; yields the context it stores."""
        if not self.live:
            yield self.current()
            return
        attributes = {
            SYSTEM: system_of(system),
            DESTINATION: queue,
            OPERATION_TYPE: "create",
            OPERATION_NAME: "outbox_write",
            **_job_attributes(event_id, correlation_id),
        }
        with self.tracer.start_as_current_span(
            f"create {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            yield self.current()

    def relay_spans(
        self, events: Sequence[Any], transport: str, start_time: int | None = None
    ) -> list[Any]:
        """Started ``publish`` spans, one per outbox event, each a child of the event's own
        ``create`` context (the job keeps that context: the consumer is its sibling)."""
        if not self.live:
            return []
        spans = []
        for event in events:
            attributes = {
                SYSTEM: system_of(transport),
                DESTINATION: event.queue,
                OPERATION_TYPE: "send",
                OPERATION_NAME: "relay_publish",
                "jobfence.outbox.attempt": int(event.attempts),
                **_job_attributes(event.event_id, event.correlation_id),
            }
            spans.append(
                self.tracer.start_span(
                    f"publish {event.queue}",
                    context=self.context_of(event.trace_context),
                    kind=SpanKind.PRODUCER,
                    attributes=attributes,
                    start_time=start_time,
                )
            )
        return spans

    @staticmethod
    def end_spans(spans: Sequence[Any], error: BaseException | None = None) -> None:
        for span in spans:
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.end()

    @contextmanager
    def replay(
        self, queue: str | None, originals: Sequence[str], count: int, transport: str
    ) -> Iterator[str | None]:
        """A ``replay`` span around republishing ``count`` dead letters, linked to their
        original traces (``originals``: their stored contexts); yields the context the
        replayed jobs carry."""
        links = []
        for original in originals:
            span_context = self.span_context_of(original)
            if span_context.is_valid:
                links.append(Link(span_context, {"jobfence.link": "replayed_from"}))
        attributes: dict[str, Any] = {
            SYSTEM: system_of(transport),
            OPERATION_TYPE: "send",
            OPERATION_NAME: "replay",
            BATCH_COUNT: count,
        }
        if queue is not None:
            attributes[DESTINATION] = queue
        with self.tracer.start_as_current_span(
            f"replay {queue or '(several)'}",
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=links,
        ):
            yield self.current()

    # -- consumers -------------------------------------------------------------------------

    @contextmanager
    def process(self, delivery: Delivery, transport: str, consumer: str | None) -> Iterator[Any]:
        """The ``process`` span of one delivery, a child of the context it travelled with;
        current while the harness works (so handler spans and logs join it). Without an
        SDK, only the job's context is made current (its enqueues pass it on)."""
        if not self.live:
            if not delivery.trace_context:
                yield INVALID_SPAN
                return
            context = self.context_of(delivery.trace_context)
            token = otel_context.attach(context)
            try:
                yield otel_trace.get_current_span(context)
            finally:
                otel_context.detach(token)
            return
        attributes = {
            SYSTEM: system_of(transport),
            DESTINATION: delivery.queue,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
            ATTEMPT: delivery.attempt,
            **_job_attributes(delivery.job_id, delivery.correlation_id),
        }
        if consumer is not None:
            attributes[CONSUMER] = consumer
        with self.tracer.start_as_current_span(
            f"process {delivery.queue}",
            context=self.context_of(delivery.trace_context),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @staticmethod
    def outcome(span: Any, outcome: str) -> None:
        span.set_attribute(OUTCOME, outcome)
        if outcome in ("retry", "dead", "failed_to_record"):
            span.set_status(Status(StatusCode.ERROR, outcome))

    def _child(self, delivery: Delivery) -> Any:
        """The parent of a span about ``delivery``: its ``process`` span when that is current
        (a delivery handled alone), else the context the job travelled with (group commit
        reports outcomes after its transaction)."""
        current = otel_trace.get_current_span()
        if current.get_span_context().is_valid:
            return None
        return self.context_of(delivery.trace_context)

    def job_retry(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        delay: timedelta,
        error: str,
    ) -> None:
        if not self.live:
            return
        otel_trace.get_current_span().set_attribute(ERROR_CATEGORY, category.value)
        attributes = {
            DESTINATION: delivery.queue,
            OPERATION_TYPE: "send",
            OPERATION_NAME: "retry",
            CONSUMER: consumer,
            ERROR_CATEGORY: category.value,
            ATTEMPT: delivery.attempt,
            "jobfence.retry.delay_s": delay.total_seconds(),
            "jobfence.error": error[:1000],
            **_job_attributes(delivery.job_id, delivery.correlation_id),
        }
        now = time.time_ns()
        span = self.tracer.start_span(
            f"retry {delivery.queue}",
            context=self._child(delivery),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=now,
        )
        span.end(end_time=now)

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
        if not self.live:
            return
        otel_trace.get_current_span().set_attribute(ERROR_CATEGORY, category.value)
        attributes: dict[str, Any] = {
            DESTINATION: delivery.queue,
            OPERATION_TYPE: "settle",
            OPERATION_NAME: "dead_letter",
            CONSUMER: consumer,
            ERROR_CATEGORY: category.value,
            ATTEMPT: delivery.attempt,
            "jobfence.dead_letter.created": created,
            "jobfence.error": error[:1000],
            **_job_attributes(delivery.job_id, delivery.correlation_id),
        }
        if dead_letter_id is not None:
            attributes["jobfence.dead_letter_id"] = dead_letter_id
        now = time.time_ns()
        span = self.tracer.start_span(
            f"dead_letter {delivery.queue}",
            context=self._child(delivery),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=now,
        )
        span.end(end_time=now)

    def job_processed(self, job: Job[Any], duration: float) -> None:
        otel_trace.get_current_span().set_attribute("jobfence.handler.duration_s", duration)

    # -- the call ledger (jobfence.calls) ---------------------------------------------------

    @contextmanager
    def call(self, step: str, key: str, consumer: str) -> Iterator[Any]:
        """The span of one recorded call (``job.call``), a child of the delivery's
        ``process`` span, with the step and its idempotency key as attributes."""
        if not self.live:
            yield INVALID_SPAN
            return
        with self.tracer.start_as_current_span(
            f"call {step}",
            kind=SpanKind.CLIENT,
            attributes={CALL_STEP: step, CALL_KEY: key, CONSUMER: consumer},
        ) as span:
            yield span

    @staticmethod
    def call_outcome(span: Any, outcome: str, duration: float) -> None:
        """How the call ended for this delivery (see ``Observer.call_finished``)."""
        span.set_attribute(CALL_OUTCOME, outcome)
        span.set_attribute("jobfence.call.duration_s", duration)

    # -- the HTTP door ---------------------------------------------------------------------

    @contextmanager
    def idempotency(self, method: str, path: str, headers: Mapping[str, str]) -> Iterator[Any]:
        """The idempotency middleware's span: a child of the current span (an ASGI
        instrumentation's server span), else of the request's own ``traceparent``."""
        current = otel_trace.get_current_span().get_span_context().is_valid
        context = None if current else self.propagator.extract(dict(headers))
        with self.tracer.start_as_current_span(
            f"idempotency {method}",
            context=context,
            kind=SpanKind.INTERNAL if current else SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        ) as span:
            yield span

    @staticmethod
    def idempotency_outcome(outcome: str) -> None:
        """``replayed``, ``in_flight``, ``mismatch``, ``executed``… on the current span."""
        span = otel_trace.get_current_span()
        span.set_attribute(IDEMPOTENCY_OUTCOME, outcome)
        for flag in ("replayed", "in_flight", "mismatch"):
            span.set_attribute(f"jobfence.idempotency.{flag}", outcome == flag)


class TraceIds(logging.Filter):
    """Add ``trace_id`` and ``span_id`` (hex) to log records made inside a valid span
    (:func:`jobfence.logs.configure` installs it; add it to your own handlers likewise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        span_context = otel_trace.get_current_span().get_span_context()
        if span_context.is_valid:
            record.trace_id = format(span_context.trace_id, "032x")
            record.span_id = format(span_context.span_id, "016x")
        return True


_TRACING: Tracing | None = Tracing() if AVAILABLE else None
#: no parent: a span started in it begins a new trace (contexts are immutable)
_EMPTY: Any = otel_context.Context() if AVAILABLE else None


def get() -> Tracing | None:
    """This process's :class:`Tracing`, or None without the ``otel`` extra."""
    return _TRACING
