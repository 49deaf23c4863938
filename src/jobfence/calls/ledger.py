"""The call ledger: a handler's call to a system outside the database as a recorded step of
its job (SPEC E1–E3; docs/calls.md).

::

    result = await job.call("erp.create", send, reconcile=lookup, repeatable=False)

One row per (consumer, job_id, step) in the ledger (:mod:`jobfence.calls.store`), written in
short transactions of its own, never in the job's::

    (no row) ──intent──► pending ──answer──► succeeded             → its summary, for good
                            │   ──4xx / 401 / not sent──► failed   → a later delivery calls
                            │                                        again (nothing happened)
                            └──timeout, reset, 5xx, the process died──► in_doubt
    in_doubt ─ reconcile(key) found ──► succeeded
             ─ reconcile not found, or repeatable ──► pending (same key, attempts + 1)
             ─ reconcile failing ──► in_doubt; the job is retried per its policy
             ─ neither ──► the job is parked: dead letter NON_RETRYABLE_ERROR, UNKNOWN_OUTCOME
    in_doubt / pending ─ operator settles ──► applied (→ its reference / outcome, no call)
                                          └─► not_applied (→ called again, same key)

- **The key** is the same on every redelivery, retry and operator replay of the job:
  :func:`default_key` of (job_id, step), or the handler's ``key=``; once a step is recorded,
  its recorded key is used whatever the handler passes (the key the downstream has seen).
- **The intent** (``pending``) is committed before every request leaves; **the outcome**
  after it. A delivery that finds ``succeeded`` (or ``applied``) returns the recorded
  summary without calling: what ``send`` returned, as JSON (≤ 8 KB) — a handler gets the
  same value the first time (it is read back through JSON then too).
- A ``pending`` row found by a delivery is a call whose process died between intent and
  outcome (two deliveries of one job never run at once: the second waits on the first's
  fence), so it is in doubt.
- **In doubt** is resolved before anything else: ``reconcile`` first (found: recorded and
  returned; not found: called again with the same key; failing: retried after the backoff,
  then the job is retried per its policy); else ``repeatable=True`` calls again with the same
  key; else the job is **parked**. Within one delivery the in-process retry of seed 004 §10.3
  (:class:`CallRetry`: 3 attempts, 2 s × 2 up to 30 s) covers sends and reconciles of the
  step.
- **Parked** jobs are dead letters of category NON_RETRYABLE_ERROR with ``error_code``
  ``UNKNOWN_OUTCOME`` (:class:`~jobfence.calls.outcomes.UnknownOutcome`) naming the step,
  the key and the last error. A category of its own was weighed and left out: the dead
  letters' category is a CHECK constraint, which SQLite can only change by rebuilding the
  table (its triggers, indexes and the replays that point at it), and every door lists the
  taxonomy; the error code says it (and the error starts ``UnknownOutcome:``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..config import DatabaseURL
from ..core.jobs import Job, partner_of
from ..db import Database, Row
from ..errors import ConfigurationError, JobfenceError, NonRetryableError, describe
from ..observers import Observer
from ..tracing import Tracing
from .outcomes import (
    CallInDoubt,
    CallNotSent,
    CallRejected,
    CallUnauthorized,
    Sent,
    UnknownOutcome,
    reading,
)
from .store import open_ledger

log = logging.getLogger("jobfence.calls")

MAX_STEP = 200
MAX_KEY = 255
#: the most a recorded outcome may take, as JSON (UTF-8 bytes)
MAX_OUTCOME = 8192
MAX_REFERENCE = 500

Send = Callable[[str], Awaitable[Any]]
Reconcile = Callable[[str], Awaitable[Any]]


@dataclass(frozen=True)
class CallRetry:
    """The in-process retry of one recorded step (seed 004 §10.3): up to ``attempts`` sends
    (or reconciles) in one delivery, ``initial`` seconds apart, times ``multiplier`` each
    time, at most ``maximum``."""

    attempts: int = 3
    initial: float = 2.0
    multiplier: float = 2.0
    maximum: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigurationError(f"CallRetry attempts must be ≥ 1, got {self.attempts!r}")
        if self.initial < 0 or self.multiplier < 1 or self.maximum < self.initial:
            raise ConfigurationError(
                "CallRetry needs initial ≥ 0, multiplier ≥ 1 and maximum ≥ initial, got "
                f"initial={self.initial}, multiplier={self.multiplier}, maximum={self.maximum}"
            )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after in-process attempt ``attempt`` (1-based) failed."""
        return float(min(self.initial * self.multiplier ** (attempt - 1), self.maximum))


DEFAULT_CALL_RETRY = CallRetry()


def default_key(job_id: str, step: str) -> str:
    """The idempotency key of ``step`` of job ``job_id``: ``jf-`` and 32 hex digits of
    SHA-256 over both (one key per pair, ASCII and short enough for any header or ERP
    field, whatever the job_id holds) — the same on every delivery and replay of the job."""
    digest = hashlib.sha256(f"{job_id}\x00{step}".encode()).hexdigest()
    return f"jf-{digest[:32]}"


def check_step(step: object) -> str:
    if not isinstance(step, str) or not step.strip():
        raise ConfigurationError("job.call: the step must be a non-empty string, e.g. 'erp.create'")
    if len(step) > MAX_STEP or "\x00" in step:
        raise ConfigurationError(
            f"job.call: the step {step[:40]!r}… must be at most {MAX_STEP} characters, no NUL"
        )
    return step


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY or "\x00" in key:
        raise ConfigurationError(
            f"job.call: key must be a string of 1 to {MAX_KEY} characters without NUL, got "
            f"{key!r:.60}"
        )
    return key


@dataclass
class _Row:
    id: int
    key: str
    state: str
    attempts: int
    outcome: Any
    reference: str | None
    last_error: str | None


def _row(raw: Row, dialect: str) -> _Row:
    outcome = raw["outcome"]
    if dialect == "sqlite" and outcome is not None:
        outcome = json.loads(outcome)
    return _Row(
        id=int(raw["id"]),
        key=str(raw["idem_key"]),
        state=str(raw["state"]),
        attempts=int(raw["attempts"]),
        outcome=outcome,
        reference=raw["reference"],
        last_error=raw["last_error"],
    )


def summary(value: Any) -> tuple[str, str | None]:
    """``value`` as recorded (compact JSON, at most :data:`MAX_OUTCOME` bytes) and its
    ``"reference"`` when it is an object that has one; ValueError saying what is wrong."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the answer is not JSON ({exc})") from None
    if "\\u0000" in text:
        raise ValueError("the answer holds a NUL character")
    size = len(text.encode("utf-8"))
    if size > MAX_OUTCOME:
        raise ValueError(f"the answer is {size} bytes as JSON; at most {MAX_OUTCOME} are kept")
    reference = value.get("reference") if isinstance(value, dict) else None
    if isinstance(reference, int | str) and not isinstance(reference, bool):
        return text, str(reference)[:MAX_REFERENCE]
    return text, None


class Ledger:
    """The call ledger of one app: opened on the first call (a worker whose handlers never
    call opens nothing), closed with the app."""

    def __init__(self, url: DatabaseURL, observers: Observer, tracing: Tracing | None) -> None:
        self.url = url
        self.observers = observers
        self.tracing = tracing
        #: consumers seen making calls: their jobs get transactions of their own (a call
        #: would hold a group commit's shared transaction open for a network round trip)
        self.callers: set[str] = set()
        self._db: Database | None = None
        self._lock = asyncio.Lock()
        self._bound: dict[str, JobCalls] = {}
        #: (consumer, job_id, step) of the calls running in this process
        self.running: set[tuple[str, str, str]] = set()

    async def database(self) -> Database:
        if self._db is None:
            async with self._lock:
                if self._db is None:
                    self._db = await open_ledger(self.url)
        return self._db

    @property
    def opened(self) -> Database | None:
        return self._db

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    def bound(self, consumer: str) -> JobCalls:
        """The :class:`~jobfence.jobs.CallLedger` the harness gives ``consumer``'s jobs."""
        calls = self._bound.get(consumer)
        if calls is None:
            calls = self._bound[consumer] = JobCalls(self, consumer)
        return calls


class _Step:
    """One ``job.call`` in progress."""

    def __init__(
        self,
        calls: JobCalls,
        db: Database,
        job: Job[Any],
        step: str,
        send: Send,
        reconcile: Reconcile | None,
        repeatable: bool,
        retry: CallRetry,
        refresh: Callable[[], Awaitable[None]] | None,
    ) -> None:
        self.ledger = calls.ledger
        self.consumer = calls.consumer
        self.db = db
        self.job = job
        self.step = step
        self.send = send
        self.reconcile = reconcile
        self.repeatable = repeatable
        self.retry = retry
        self.refresh = refresh
        self.attempt = 1  # in-process attempts of this delivery (sends and reconciles)
        self.refreshed = False
        #: how the step ended for this delivery (see ``Observer.call_finished``)
        self.outcome = "error"

    # -- the ledger's statements ------------------------------------------------------------

    async def _one(self, name: str, params: dict[str, Any]) -> _Row | None:
        rows = await self.db.run(name, params)
        return _row(rows[0], self.db.dialect) if rows else None

    async def begin(self, key: str) -> tuple[_Row, bool]:
        """The step's row: a new intent (True), or the row an earlier delivery left."""
        params = {
            "consumer": self.consumer,
            "queue": self.job.queue,
            "job_id": self.job.job_id,
            "step": self.step,
            "key": key,
            "partner": partner_of(self.job.raw),
        }
        row = await self._one("calls_intent", params)
        if row is not None:
            return row, True
        row = await self._one("calls_get", params)
        if row is None:  # pragma: no cover - a row cannot vanish between the two statements
            raise JobfenceError(f"the ledger lost the row of step {self.step!r}")
        return row, False

    async def again(self, row: _Row) -> _Row | None:
        """The intent of another send with the same key (None: the row changed meanwhile)."""
        return await self._one("calls_resend", {"id": row.id, "from_state": row.state})

    async def reread(self) -> _Row:
        params = {"consumer": self.consumer, "job_id": self.job.job_id, "step": self.step}
        row = await self._one("calls_get", params)
        assert row is not None
        return row

    async def record(
        self, row: _Row, state: str, outcome: str | None, reference: str | None, error: str | None
    ) -> None:
        """A definitive outcome, retried in-process while the database cannot take it (the
        answer lives only in memory until then)."""
        params = {
            "id": row.id,
            "state": state,
            "outcome": outcome,
            "reference": reference,
            "error": error,
        }
        for tries in range(1, 4):
            try:
                await self.db.run("calls_record", params)
                row.state = state
                return
            except Exception:
                if tries == 3:
                    raise
                log.warning("could not record a call's outcome; trying again", exc_info=True)
                await asyncio.sleep(0.2 * tries)

    async def doubt(self, row: _Row, error: str) -> None:
        await self.db.run("calls_doubt", {"id": row.id, "error": error})
        row.state, row.last_error = "in_doubt", error

    # -- the step ---------------------------------------------------------------------------

    async def run(self, key: str) -> Any:
        row, fresh = await self.begin(key)
        if not fresh and row.state == "pending":
            # the process that sent it died before its outcome was recorded
            await self.doubt(
                row, row.last_error or "the process making the call stopped before its answer"
            )
            row = await self.reread()
        while True:
            if row.state == "succeeded":
                self.finished("recorded")
                return row.outcome
            if row.state == "applied":
                self.finished("settled_applied")
                return row.outcome if row.outcome is not None else {"reference": row.reference}
            if row.state == "in_doubt":
                resolved = await self.resolve(row)
                if resolved is not None:
                    return resolved[0]
            if row.state != "pending":
                again = await self.again(row)
                if again is None:  # settled by an operator meanwhile: read what they decided
                    row = await self.reread()
                    continue
                row = again
            result = await self.attempt_send(row)
            if result is not None:
                return result[0]

    async def resolve(self, row: _Row) -> tuple[Any] | None:
        """An in-doubt call: reconcile it (a 1-tuple: found), or None: send again with the
        same key; raises to park the job or to retry it later."""
        if self.reconcile is None:
            if self.repeatable:
                return None
            self.finished("parked")
            raise UnknownOutcome(
                f"the outcome of call {self.step!r} (key {row.key}) is unknown: "
                f"{row.last_error or 'no answer'}; it is neither reconciled nor repeatable, so "
                "jobfence will not call it again on a guess. Check downstream, settle the "
                "call (applied with its reference, or not applied) and replay the job",
                step=self.step,
                key=row.key,
            )
        while True:
            try:
                found = await self.reconcile(row.key)
            except Exception as exc:
                error = f"reconcile failed: {describe(exc, 1000)}"
                self.reconciled("error")
                await self.db.run("calls_note", {"id": row.id, "error": error})
                if self.attempt >= self.retry.attempts:
                    self.finished("in_doubt")
                    raise CallInDoubt(
                        f"call {self.step!r} (key {row.key}) is in doubt and its {error}; the "
                        "job is retried and resolves it first",
                        code="RECONCILE_FAILED",
                    ) from exc
                await self.pause()
                continue
            if found is None:
                self.reconciled("not_found")
                return None
            self.reconciled("found")
            value = await self.answered(row, found, via="reconciled")
            return (value,)

    async def attempt_send(self, row: _Row) -> tuple[Any] | None:
        """Send once (the intent is committed); a 1-tuple with the answer, None to go round
        again (the row's new state says how), or raises."""
        try:
            value = await self.send(row.key)
        except Exception as exc:
            await self.failed(row, exc)
            return None
        return (await self.answered(row, value, via="sent"),)

    async def answered(self, row: _Row, value: Any, *, via: str) -> Any:
        try:
            text, reference = summary(value)
        except ValueError as exc:
            # the request took effect: recorded as such, and the handler's author must fix
            # what send (or reconcile) returns
            await self.record(row, "succeeded", None, None, f"answer not recorded: {exc}")
            self.finished("unrecordable")
            raise NonRetryableError(
                f"call {self.step!r} succeeded but its answer cannot be recorded: {exc}; "
                "return a small JSON value (e.g. {'reference': …}) from send and reconcile",
                code="CALL_ANSWER_UNRECORDABLE",
            ) from None
        await self.record(row, "succeeded", text, reference, None)
        self.finished("succeeded" if via == "sent" else "reconciled")
        return json.loads(text)

    async def failed(self, row: _Row, exc: Exception) -> None:
        """What a failed send means (:func:`~jobfence.calls.outcomes.reading`)."""
        read = reading(exc)
        error = describe(exc, 1000)
        if read is Sent.IN_DOUBT:
            await self.doubt(row, error)
            if self.reconcile is None and not self.repeatable:
                return  # run() parks it
            if self.attempt >= self.retry.attempts:
                self.finished("in_doubt")
                raise _as(exc, CallInDoubt, f"call {self.step!r} (key {row.key}) is in doubt")
            await self.pause()
            return
        await self.record(row, "failed", None, None, error)
        if read is Sent.REJECTED:
            self.finished("rejected")
            raise _as(exc, CallRejected, f"call {self.step!r} was rejected")
        if read is Sent.UNAUTHORIZED:
            if self.refresh is not None and not self.refreshed:
                self.refreshed = True
                await self.refresh()
                return
            self.finished("unauthorized")
            raise _as(exc, CallUnauthorized, f"call {self.step!r} was refused (401)")
        if self.attempt >= self.retry.attempts:
            self.finished("not_sent")
            raise _as(exc, CallNotSent, f"call {self.step!r} could not be sent")
        await self.pause()

    async def pause(self) -> None:
        await asyncio.sleep(self.retry.delay(self.attempt))
        self.attempt += 1

    # -- observation ------------------------------------------------------------------------

    def finished(self, outcome: str) -> None:
        self.outcome = outcome
        self.ledger.observers.call_finished(self.job, self.consumer, self.step, outcome)

    def reconciled(self, result: str) -> None:
        self.ledger.observers.call_reconciled(self.job, self.consumer, self.step, result)


def _as(exc: Exception, kind: type[Exception], what: str) -> Exception:
    """``exc`` itself when it is already ``kind``; else a ``kind`` that says ``what`` and
    why, chained to it."""
    if isinstance(exc, kind):
        return exc
    made = kind(f"{what}: {describe(exc, 1000)}")
    made.__cause__ = exc
    return made


class JobCalls:
    """The ledger as one consumer's jobs see it (:meth:`jobfence.jobs.Job.call`)."""

    def __init__(self, ledger: Ledger, consumer: str) -> None:
        self.ledger = ledger
        self.consumer = consumer

    async def call(
        self,
        job: Job[Any],
        step: str,
        send: Send,
        *,
        reconcile: Reconcile | None,
        repeatable: bool,
        key: str | None,
        retry: Any,
        refresh: Callable[[], Awaitable[None]] | None,
    ) -> Any:
        step = check_step(step)
        key = check_key(key) if key is not None else default_key(job.job_id, step)
        if retry is not None and not isinstance(retry, CallRetry):
            raise ConfigurationError(f"job.call: retry must be a CallRetry, got {retry!r:.60}")
        self.ledger.callers.add(self.consumer)
        db = await self.ledger.database()
        running = _Step(
            self,
            db,
            job,
            step,
            send,
            reconcile,
            repeatable,
            retry or DEFAULT_CALL_RETRY,
            refresh,
        )
        mine = (self.consumer, job.job_id, step)
        if mine in self.ledger.running:
            # its row is pending while it runs: a second caller would take it for a call
            # whose process died
            raise ConfigurationError(
                f"job.call: step {step!r} of job {job.job_id!r} is already being called; give "
                "each call of a job a step name of its own"
            )
        self.ledger.running.add(mine)
        try:
            tracing = self.ledger.tracing
            if tracing is None:
                return await running.run(key)
            began = time.perf_counter()
            with tracing.call(step, key, self.consumer) as span:
                try:
                    return await running.run(key)
                finally:
                    tracing.call_outcome(span, running.outcome, time.perf_counter() - began)
        finally:
            self.ledger.running.discard(mine)
