"""Exceptions and the error taxonomy (SPEC R4).

The tree::

    JobfenceError                      root of everything jobfence raises
    ├── ConfigurationError             bad settings, bad URLs, bad policies (refused up front)
    │   └── MissingExtra               an optional dependency is not installed (also ImportError)
    ├── DatabaseUnavailable            the database cannot be reached (retryable for jobs)
    │   └── DatabaseLocked             SQLite: another connection held the write lock too long
    ├── EnqueueError                   a job that cannot be enqueued (bad job_id, unknown queue…)
    ├── SchemaError                    the database is missing or behind its migrations
    ├── ReviewConflict                 a dead-letter action lost a race or hit the wrong state
    ├── NotFound                       no such dead letter, replay, event… (or out of scope)
    ├── InvalidRequest                 an operator request that cannot be carried out as given
    ├── TokenError                     an ops token that cannot be created as asked
    ├── UniqueViolation                a row with that key exists (translated from the driver)
    ├── PoisonPayload                  a payload that fails decoding or its schema (never retried)
    └── HandlerError                   raised by handlers to say how a failure must be treated
        ├── ValidationError            VALIDATION_ERROR    no retry
        ├── BusinessError              BUSINESS_ERROR      no retry
        ├── TemporaryError             TEMPORARY_ERROR     retry up to the policy's maximum
        ├── IntegrationError           INTEGRATION_ERROR   no retry
        ├── AuthenticationError        AUTHENTICATION_ERROR one retry (for a token refresh)
        ├── AuthorizationError         AUTHORIZATION_ERROR no retry
        ├── TechnicalError             TECHNICAL_ERROR     limited retry
        │   └── TransactionBoundaryError  the handler ended or aborted jobfence's transaction
        └── NonRetryableError          NON_RETRYABLE_ERROR straight to dead letters

    Retry                              control flow: "try again after this delay", no error log
    BackOff                            control flow: "hold this job's whole key for a while" (429)

Anything else a handler raises is classified by :func:`classify`: serialization failures,
deadlocks, lost connections and timeouts are TEMPORARY_ERROR; everything unknown is
TECHNICAL_ERROR. No exception ever crashes the worker. Driver exceptions are recognised by
classifiers that the database drivers register (:func:`register_classifier`, in
:mod:`jobfence.db.translate`), so this module knows no driver.
"""

from __future__ import annotations

import asyncio
import enum
import importlib
import logging
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


class RetryMode(enum.Enum):
    """How a category is retried."""

    NEVER = "never"
    POLICY = "policy"  # up to the policy's max_retries
    LIMITED = "limited"  # up to the policy's limited_retries
    TOKEN_REFRESH = "token_refresh"  # exactly one retry, to let a handler refresh credentials


@dataclass(frozen=True)
class CategoryInfo:
    retry: RetryMode
    final_state: str
    http_status: tuple[int, ...]
    log_level: int
    alert: bool


class Category(enum.StrEnum):
    """The error taxonomy of SPEC R4 (seed 004 §10.4)."""

    VALIDATION_ERROR = "VALIDATION_ERROR"
    BUSINESS_ERROR = "BUSINESS_ERROR"
    TEMPORARY_ERROR = "TEMPORARY_ERROR"
    INTEGRATION_ERROR = "INTEGRATION_ERROR"
    AUTHENTICATION_ERROR = "AUTHENTICATION_ERROR"
    AUTHORIZATION_ERROR = "AUTHORIZATION_ERROR"
    TECHNICAL_ERROR = "TECHNICAL_ERROR"
    NON_RETRYABLE_ERROR = "NON_RETRYABLE_ERROR"

    @property
    def info(self) -> CategoryInfo:
        return TAXONOMY[self]


TAXONOMY: dict[Category, CategoryInfo] = {
    Category.VALIDATION_ERROR: CategoryInfo(
        RetryMode.NEVER, "VALIDATION_FAILED", (422,), logging.WARNING, alert=False
    ),
    Category.BUSINESS_ERROR: CategoryInfo(
        RetryMode.NEVER, "REJECTED", (422, 409), logging.WARNING, alert=False
    ),
    Category.TEMPORARY_ERROR: CategoryInfo(
        RetryMode.POLICY, "FAILED", (502, 504), logging.ERROR, alert=True
    ),
    Category.INTEGRATION_ERROR: CategoryInfo(
        RetryMode.NEVER, "FAILED", (422,), logging.ERROR, alert=True
    ),
    Category.AUTHENTICATION_ERROR: CategoryInfo(
        RetryMode.TOKEN_REFRESH, "FAILED", (401,), logging.ERROR, alert=True
    ),
    Category.AUTHORIZATION_ERROR: CategoryInfo(
        RetryMode.NEVER, "FAILED", (403,), logging.ERROR, alert=True
    ),
    Category.TECHNICAL_ERROR: CategoryInfo(
        RetryMode.LIMITED, "FAILED", (500,), logging.ERROR, alert=True
    ),
    Category.NON_RETRYABLE_ERROR: CategoryInfo(
        RetryMode.NEVER, "FAILED", (422, 500), logging.CRITICAL, alert=True
    ),
}


class JobfenceError(Exception):
    """Root of every exception jobfence raises."""


class ConfigurationError(JobfenceError):
    """Settings that jobfence refuses to run with; the message says what to fix."""


class MissingExtra(ConfigurationError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the
    extra to install (``pip install 'jobfence[ops]'``). An :class:`ImportError` too, so that
    importing a module that needs an extra fails as imports do."""


@contextmanager
def extra_needed(extra: str, feature: str) -> Iterator[None]:
    """Turn an :class:`ImportError` raised inside into :class:`MissingExtra`, in one line:
    ``{feature} needs jobfence[{extra}]: pip install 'jobfence[{extra}]' (…)``."""
    try:
        yield
    except MissingExtra:
        raise
    except ImportError as exc:
        raise MissingExtra(
            f"{feature} needs jobfence[{extra}]: pip install 'jobfence[{extra}]' ({exc})"
        ) from None


def require_extra(extra: str, feature: str, *modules: str) -> None:
    """:class:`MissingExtra` unless every module of ``modules`` imports (see
    :func:`extra_needed`); a command calls it before it starts anything."""
    with extra_needed(extra, feature):
        for module in modules:
            importlib.import_module(module)


class DatabaseUnavailable(JobfenceError):
    """The database could not be reached; the message names it (without its password)."""


class DatabaseLocked(DatabaseUnavailable):
    """SQLite: the write lock (one per file) was not released within the lock timeout — on
    SQLite a running job's transaction holds it until its handler returns. Nothing was
    changed; the message says so and what to do."""

    code = "DB_LOCKED"


class EnqueueError(JobfenceError):
    """A job that cannot be enqueued as given."""


class SchemaError(JobfenceError):
    """The database schema is missing or not at the version this code needs."""


class ReviewConflict(JobfenceError):
    """A review action on a dead letter that is not (or no longer) in a state that allows it."""


class NotFound(JobfenceError):
    """No such dead letter, replay or event — or it is outside the caller's partner scope."""


class JobControlUnavailable(NotFound):
    """Job control (list, show, retry, cancel jobs; pause and resume queues) asked of a
    transport that keeps its jobs in a broker, not in a database table. Raised only by
    :meth:`jobfence.transports.Transport.job_control`, with one message for every door."""


class InvalidRequest(JobfenceError):
    """A request that cannot be carried out as given (a blank reason, a bad filter…)."""


class TokenError(JobfenceError):
    """A token that cannot be created as asked (bad role, name, partner or expiry)."""


class UniqueViolation(JobfenceError):
    """A row with that key already exists (a driver's unique violation, translated)."""


class PoisonPayload(JobfenceError):
    """The payload cannot be decoded or does not match the consumer's schema."""


class HandlerError(JobfenceError):
    """Raise from a handler to choose how the failure is treated.

    ``code`` is an optional short machine-readable error code kept on the dead letter.
    """

    category: Category = Category.TECHNICAL_ERROR

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ValidationError(HandlerError):
    category = Category.VALIDATION_ERROR


class BusinessError(HandlerError):
    category = Category.BUSINESS_ERROR


class TemporaryError(HandlerError):
    category = Category.TEMPORARY_ERROR


class IntegrationError(HandlerError):
    category = Category.INTEGRATION_ERROR


class AuthenticationError(HandlerError):
    category = Category.AUTHENTICATION_ERROR


class AuthorizationError(HandlerError):
    category = Category.AUTHORIZATION_ERROR


class TechnicalError(HandlerError):
    category = Category.TECHNICAL_ERROR


class NonRetryableError(HandlerError):
    category = Category.NON_RETRYABLE_ERROR


class TransactionBoundaryError(TechnicalError):
    """The transaction jobfence lent a handler cannot be committed with the job's fence: the
    handler ended, replaced or aborted it (SPEC H5). The job's work and fence roll back
    together; the job is retried as a TECHNICAL_ERROR and then dead-lettered, with ``code``
    ``TX_ABORTED``, ``TX_ENDED``, ``TX_CONTROL_REFUSED`` or ``TX_SESSION_CHANGED``."""


class Retry(Exception):
    """Raise from a handler to retry later without logging an error.

    The attempt still counts against the retry policy; when ``delay`` is omitted the
    policy's backoff is used.
    """

    def __init__(self, delay: timedelta | float | None = None, reason: str = "retry requested"):
        super().__init__(reason)
        if isinstance(delay, int | float):
            delay = timedelta(seconds=delay)
        if delay is not None and delay < timedelta(0):
            raise ValueError("Retry(delay=...) must not be negative")
        self.delay = delay
        self.reason = reason


#: the longest back-off a handler may ask for
MAX_BACKOFF = timedelta(days=1)


class BackOff(Exception):
    """Raise from a handler when the other side said "wait" (an HTTP 429 and its
    Retry-After): the whole key of the job (its consumer's ``Limit`` key) is held for
    ``seconds`` on every worker, and this job goes back to wait for it without consuming
    an attempt; its history records the back-off. Control flow, not an error: no retry
    policy, no dead letter (docs/flow-control.md)."""

    def __init__(self, seconds: timedelta | float, reason: str = "backing off") -> None:
        super().__init__(reason)
        if isinstance(seconds, bool) or not isinstance(seconds, timedelta | int | float):
            raise ValueError(
                f"BackOff(seconds=...) must be a number or a timedelta, got "
                f"{type(seconds).__name__}"
            )
        delay = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        if not timedelta(0) < delay <= MAX_BACKOFF:
            raise ValueError(f"BackOff(seconds=...) must be above 0 and at most {MAX_BACKOFF}")
        self.delay = delay
        self.reason = str(reason)[:500]

    @classmethod
    def from_retry_after(
        cls, value: str | None, *, default: float = 30.0, reason: str = "HTTP 429"
    ) -> BackOff:
        """A back-off from an HTTP ``Retry-After`` value (seconds, or an HTTP date);
        ``default`` seconds when it is missing or unreadable."""
        seconds = default
        text = (value or "").strip()
        if text.isdigit():
            seconds = float(text)
        elif text:
            from email.utils import parsedate_to_datetime

            try:
                when = parsedate_to_datetime(text)
                seconds = (when - datetime.now(when.tzinfo or UTC)).total_seconds()
            except (TypeError, ValueError):
                pass
        seconds = min(max(seconds, 0.001), MAX_BACKOFF.total_seconds())
        return cls(seconds, reason=reason)


Classifier = Callable[[BaseException], "Category | None"]
_classifiers: list[Classifier] = []


def register_classifier(classifier: Classifier) -> None:
    """Let a driver say which of its exceptions are which category (None: not mine)."""
    if classifier not in _classifiers:
        _classifiers.append(classifier)


def classify(exc: BaseException) -> Category:
    """Map any exception onto the taxonomy. Never raises."""
    if isinstance(exc, HandlerError):
        return exc.category
    if isinstance(exc, Retry):
        return Category.TEMPORARY_ERROR
    if isinstance(exc, DatabaseUnavailable):
        return Category.TEMPORARY_ERROR
    for classifier in _classifiers:
        category = classifier(exc)
        if category is not None:
            return category
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | ConnectionError):
        return Category.TEMPORARY_ERROR
    return Category.TECHNICAL_ERROR


Coder = Callable[[BaseException], "str | None"]
_coders: list[Coder] = []


def register_coder(coder: Coder) -> None:
    """Let a driver or an ORM name the jobfence code of its exceptions (``DB_LOCKED``,
    ``TX_ABORTED``…; None: not mine), so that a dead letter never carries a library's
    internal code (SQLAlchemy's ``e3q8``)."""
    if coder not in _coders:
        _coders.append(coder)


def error_code(exc: BaseException) -> str | None:
    """A short code for the dead letter: the handler's own (a :class:`HandlerError`'s
    ``code``), else jobfence's code for a driver's or an ORM's error (translated at the edge,
    see :func:`register_coder`), else the exception's class name."""
    if isinstance(exc, HandlerError) and exc.code:
        return exc.code
    for coder in _coders:
        found = coder(exc)
        if found is not None:
            return found
    code = getattr(exc, "code", None)
    if not isinstance(exc, HandlerError) and isinstance(code, str) and code:
        return code
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        return f"SQLSTATE {sqlstate}"
    return type(exc).__name__


def describe(exc: BaseException, limit: int = 4000) -> str:
    """A one-line, storable description of an exception (no NUL bytes; bounded length)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return clean_text(text, limit)


#: The most of a failed attempt's traceback that is kept (its last bytes: the frames nearest
#: the error and the exception itself).
TRACE_LIMIT = 16 * 1024
_CUT = "…[{cut} bytes of traceback cut]\n"


def trace_of(exc: BaseException, limit: int = TRACE_LIMIT) -> str:
    """``exc``'s traceback as Python prints it (chained exceptions included), for the attempt
    history: frames and source lines only — never the frames' local variables — and at most
    the last ``limit`` UTF-8 bytes of it, storable (no NUL)."""
    text = "".join(traceback.format_exception(exc))
    return tail(clean_text(text, len(text) + 1), limit)


def tail(text: str, limit: int) -> str:
    """The last ``limit`` UTF-8 bytes of ``text`` (at a character boundary), saying how many
    bytes were cut."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    note = _CUT.format(cut=len(raw) - limit)
    keep = raw[len(raw) - max(limit - len(note.encode("utf-8")), 0) :]
    return note + keep.decode("utf-8", errors="ignore")


def clean_text(text: str, limit: int = 4000) -> str:
    """Make text storable in PostgreSQL ``text``/``jsonb`` (which refuse NUL) and bound it."""
    text = text.replace("\x00", "\\x00")
    # lone surrogates cannot be encoded as UTF-8 either
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        suffix = " …[truncated]"
        text = text[: limit - len(suffix)] + suffix
    return text
