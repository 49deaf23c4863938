"""Jobs as a handler sees them, and deliveries as a transport hands them over.

Job states in the database queue (enforced by CHECK constraints, drawn in docs/concepts.md)::

    enqueue ──► available ──claim──► running ──commit──► (deleted; the fence row remains)
                   ▲  (run_at ≤ now)    │
                   │                    ├─ failure, retries left ──► available (run_at ≥ now)
                   │                    ├─ failure, no retries / poison ──► dead letter (row moved)
                   └──── lease expired (worker lost) ◄──┘
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from ..errors import ConfigurationError, EnqueueError
from .codec import encode

T = TypeVar("T")

MAX_JOB_ID_LENGTH = 255
MAX_QUEUE_LENGTH = 200


@dataclass(frozen=True)
class AttemptRecord:
    """One failed attempt, as kept in a job's history and copied onto its dead letter."""

    attempt: int
    at: str  # ISO 8601, from the database clock
    category: str
    error: str
    retry_at: str | None = None
    #: the attempt's traceback: the last :data:`TRACE_LIMIT` bytes of it, frames only (no
    #: locals, no payload); None when the attempt raised nothing (a lost worker) or the
    #: transport had no room for it (see docs/job-control.md)
    trace: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttemptRecord:
        trace = data.get("trace")
        return cls(
            attempt=int(data.get("attempt", 0)),
            at=str(data.get("at", "")),
            category=str(data.get("category", "")),
            error=str(data.get("error", "")),
            retry_at=data.get("retry_at"),
            trace=str(trace) if trace else None,
        )

    def to_json(self) -> dict[str, Any]:
        """As stored: without ``trace`` when there is none."""
        data = asdict(self)
        if data["trace"] is None:
            del data["trace"]
        return data


def history_json(history: Iterable[AttemptRecord]) -> str:
    """A job's attempt history as stored (queue rows, dead letters, broker headers): the one
    writer; :func:`history_from` is the one reader."""
    return json.dumps([h.to_json() for h in history], separators=(",", ":"), ensure_ascii=False)


def history_from(value: Any) -> list[AttemptRecord]:
    """Read a stored history (JSON text or bytes, or a decoded ``jsonb`` list); anything
    unreadable is an empty history."""
    if not value:
        return []
    if isinstance(value, str | bytes | bytearray):
        try:
            value = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            return []
    if not isinstance(value, list):
        return []
    return [AttemptRecord.from_json(item) for item in value if isinstance(item, dict)]


@dataclass
class Delivery:
    """A message handed to the harness by a transport.

    ``attempt`` counts deliveries that reached a harness, this one included (1-based); a
    delivery lost with its worker counts too. ``token`` lets the transport recognise its own
    lease (a stale worker cannot ack a job someone else has since claimed).
    """

    queue: str
    job_id: str
    payload: bytes
    attempt: int
    correlation_id: str | None = None
    enqueued_at: datetime | None = None
    history: list[AttemptRecord] = field(default_factory=list)
    token: Any = None  # transport-specific (lease token, delivery tag, stream id…)
    ref: Any = None  # transport-specific row/message reference
    #: the broker stopped delivering this message by a rule of its own (Pub/Sub's
    #: max_delivery_attempts) and says why: the harness dead-letters it without running it
    given_up: str | None = None
    #: the W3C trace context the job travels with (:func:`trace_context_of`), else None
    trace_context: str | None = None
    #: its flow-control key, when its transport knows it (the database queue's limited claim)
    flow_key: str | None = None


class CallLedger(Protocol):
    """What records a job's calls to systems outside the database (:meth:`Job.call`; the
    implementation is :class:`jobfence.calls.ledger.JobCalls`, bound by the harness)."""

    async def call(
        self,
        job: Job[Any],
        step: str,
        send: Callable[[str], Awaitable[Any]],
        *,
        reconcile: Callable[[str], Awaitable[Any]] | None,
        repeatable: bool,
        key: str | None,
        retry: Any,
        refresh: Callable[[], Awaitable[None]] | None,
    ) -> Any: ...


@dataclass(frozen=True)
class Job(Generic[T]):
    """What a handler receives: the validated payload and the job's identity."""

    queue: str
    job_id: str
    payload: T
    raw: bytes
    attempt: int
    correlation_id: str | None
    enqueued_at: datetime | None
    history: tuple[AttemptRecord, ...] = ()
    #: the call ledger of the worker that runs the job (None for a job made by hand)
    ledger: CallLedger | None = field(default=None, repr=False, compare=False)

    @property
    def is_retry(self) -> bool:
        return self.attempt > 1

    async def call(
        self,
        step: str,
        send: Callable[[str], Awaitable[Any]],
        *,
        reconcile: Callable[[str], Awaitable[Any]] | None = None,
        repeatable: bool = False,
        key: str | None = None,
        retry: Any = None,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> Any:
        """Call a system outside the database as a recorded step of this job (SPEC E1–E3).

        ``send(key)`` makes the request, passing ``key`` downstream as its idempotency key,
        and returns a small JSON value (its ``"reference"``, if it is an object that has
        one, is the downstream's reference). The intent is committed before ``send`` runs
        and the outcome after; a later delivery of the job that finds the outcome gets it
        back without calling. ``reconcile(key)`` looks the request up downstream (None: not
        there) when its outcome is unknown; ``repeatable=True`` says the downstream honours
        the key, so calling again is safe. ``key`` overrides the derived key; ``retry`` (a
        :class:`jobfence.calls.CallRetry`) the in-process attempts; ``refresh`` renews
        credentials after a 401. See docs/calls.md and :mod:`jobfence.calls.ledger`.
        """
        if self.ledger is None:
            raise ConfigurationError(
                "job.call needs a job run by a jobfence worker (this Job was made by hand: "
                "give it the app's ledger, or call the system directly)"
            )
        return await self.ledger.call(
            self,
            step,
            send,
            reconcile=reconcile,
            repeatable=repeatable,
            key=key,
            retry=retry,
            refresh=refresh,
        )


#: Top-level field of a JSON-object payload that names the partner (tenant) a job belongs to.
PARTNER_FIELD = "partner_id"
_PARTNER_SCAN_LIMIT = 1024 * 1024
_PARTNER_KEY = PARTNER_FIELD.encode()


def partner_of(payload: bytes) -> str | None:
    """The partner of a job: ``payload["partner_id"]`` when the payload is a JSON object whose
    ``partner_id`` is a non-blank string of at most 200 characters; otherwise None. Payloads
    over 1 MiB, invalid JSON or absurd nesting are simply "no partner". Read at enqueue (the
    queue row's partner) and when a job is dead-lettered: a payload that cannot name the key
    (neither the key's bytes nor a ``\\u`` escape in it) is not parsed."""
    if len(payload) > _PARTNER_SCAN_LIMIT or (
        _PARTNER_KEY not in payload and b"\\u" not in payload
    ):
        return None
    if payload.lstrip()[:1] != b"{":
        return None
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    value = data.get(PARTNER_FIELD) if isinstance(data, dict) else None
    if not isinstance(value, str) or not value.strip() or len(value) > 200 or "\x00" in value:
        return None
    try:
        value.encode("utf-8")  # a lone surrogate is no name
    except UnicodeEncodeError:
        return None
    return value


#: The W3C trace-context headers a job carries on a broker (docs/tracing.md).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: The longest stored trace context (the columns' CHECK): a traceparent is 55 characters and
#: W3C asks a tracestate to be kept to 512.
MAX_TRACE_CONTEXT = 1024


def trace_context_of(traceparent: object, tracestate: object = None) -> str | None:
    """A job's stored trace context from its W3C headers (str or bytes): ``traceparent``,
    then a space and ``tracestate`` when there is one. None when there is no usable
    traceparent; a context that would be too long keeps only its traceparent. The content is
    checked by the propagator that reads it (a malformed one starts a new trace)."""
    parent = _header_text(traceparent)
    if not parent or " " in parent or len(parent) > 128:
        return None
    state = _header_text(tracestate)
    if state and len(parent) + 1 + len(state) <= MAX_TRACE_CONTEXT:
        return f"{parent} {state}"
    return parent


def trace_headers(trace_context: str | None) -> dict[str, str]:
    """The W3C headers of a stored trace context (none for None)."""
    if not trace_context:
        return {}
    parent, _, state = trace_context.partition(" ")
    return {TRACEPARENT: parent, TRACESTATE: state} if state else {TRACEPARENT: parent}


def _header_text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or not value.isascii() or not value.isprintable():
        return None
    return value


def check_job_id(job_id: object) -> str:
    """Return a valid job_id or raise ValueError saying what is wrong."""
    if not isinstance(job_id, str):
        raise ValueError(f"job_id must be a string, got {type(job_id).__name__}")
    if not job_id:
        raise ValueError("job_id must not be empty")
    if len(job_id) > MAX_JOB_ID_LENGTH:
        raise ValueError(f"job_id is {len(job_id)} characters; the maximum is {MAX_JOB_ID_LENGTH}")
    if "\x00" in job_id:
        raise ValueError("job_id must not contain NUL characters")
    return job_id


def check_queue(queue: object) -> str:
    if not isinstance(queue, str) or not queue.strip():
        raise ValueError("queue must be a non-empty string")
    if len(queue) > MAX_QUEUE_LENGTH:
        raise ValueError(f"queue name is longer than {MAX_QUEUE_LENGTH} characters")
    if "\x00" in queue:
        raise ValueError("queue must not contain NUL characters")
    return queue


def _unencodable(exc: UnicodeEncodeError) -> str:
    """What ``exc`` choked on: a byte that was not decodable, or a lone surrogate."""
    char = ord(exc.object[exc.start])
    if 0xDC80 <= char <= 0xDCFF:  # how Python keeps an undecodable byte (surrogateescape)
        return (
            f"the undecodable byte 0x{char - 0xDC00:02x} at position {exc.start} (read from a "
            "command line or file that is not UTF-8?)"
        )
    return f"a lone surrogate U+{char:04X} at position {exc.start}"


def check_utf8(name: str, value: str) -> str:
    """``value`` if it can be sent as UTF-8 (ids and queue names travel as UTF-8 text in
    every store and broker); else ValueError naming the field and the character."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} {value!a} is not valid UTF-8: {_unencodable(exc)}; ids and queue names "
            "travel as UTF-8 text, use valid characters"
        ) from None
    return value


@dataclass(frozen=True)
class OutgoingJob:
    """A job on its way into a queue."""

    queue: str
    job_id: str
    payload: bytes
    correlation_id: str | None = None
    delay: float = 0.0  # seconds
    #: the W3C trace context it travels with (:func:`jobfence.core.jobs.trace_context_of`)
    trace_context: str | None = None
    #: its flow-control key (the consumer's Limit), when the enqueuing app knows it; else the
    #: worker's keying pass writes it (jobfence.runtime.flow)
    flow_key: str | None = None

    def params(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "job_id": self.job_id,
            "payload": self.payload,
            "correlation_id": self.correlation_id,
            "delay": float(self.delay),
            "partner": partner_of(self.payload),
            "trace_context": self.trace_context,
            "flow_key": self.flow_key,
        }


def outgoing_job(
    queue: str,
    payload: Any,
    *,
    job_id: str | None = None,
    correlation_id: str | None = None,
    delay: timedelta | float | None = None,
) -> OutgoingJob:
    """Validate and encode one job (``App.job``, what every enqueue and outbox write does
    before it writes); :class:`~jobfence.errors.EnqueueError` says what is wrong."""
    try:
        check_utf8("queue", check_queue(queue))
        job_id = check_job_id(job_id) if job_id is not None else uuid.uuid4().hex
        check_utf8("job_id", job_id)
        if correlation_id is not None:
            if not isinstance(correlation_id, str) or "\x00" in correlation_id:
                raise ValueError("correlation_id must be a string without NUL characters")
            if len(correlation_id) > 255:
                raise ValueError("correlation_id is longer than 255 characters")
            check_utf8("correlation_id", correlation_id)
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay or 0)
        if seconds < 0:
            raise ValueError("delay must not be negative")
        data = encode(payload)
    except ValueError as exc:
        raise EnqueueError(str(exc)) from None
    return OutgoingJob(queue, job_id, data, correlation_id, seconds)
