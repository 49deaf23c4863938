"""Job control for people (issue 14): the jobs of the database queue that are waiting,
running or scheduled for retry — list, show, cancel, retry now — and pausing queues.

One copy of each operation; the CLI (``jobfence jobs …``, ``jobfence queues …``), the ops API
(``/v1/jobs``, ``/v1/queues``) and the console page are doors onto these functions.

A job of the database queue is, as people see it::

    waiting  ──claim──► running ──fails, retries left──► retrying ──due──► (claimed again)
       │                                                    │
       └──────────────cancel (with a reason)───────────────┴──► dead letter, discarded
                                                                 (error_code CANCELLED)

**Cancel** never makes a job disappear silently: in one transaction the queue row goes and a
dead letter takes its place, already decided — status ``discarded``, category
``NON_RETRYABLE_ERROR``, error code ``CANCELLED``, ``reviewed_by`` the actor and
``review_reason`` the reason — with an audit row (``job.cancel``). It raises no alert. A
running job cannot be cancelled (its handler is working on it): cancel and retry-now answer
at once with a :class:`ReviewConflict` naming the worker, never waiting for the handler.

**Pause** writes a row of ``core.queue_pauses`` in the queue's database; every worker's
claim skips paused queues from the next claim on, whatever process it runs in; the gauge
``jobfence_queue_paused{queue}`` (the ops API's ``/metrics``, and workers' gauge refresh)
shows it. Jobs keep arriving in a paused queue; running jobs finish. Brokers cannot be
paused this way (see docs/job-control.md).

Every action appends an audit row in the transaction that makes it. Job rows live in the
queue's database (``jobs_db``: the transport's job-control view,
:meth:`jobfence.transports.Transport.job_control`; the app's own database unless given);
letters and the audit log in the app's database.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from ..core.holds import hold, unhold
from ..core.jobs import AttemptRecord, check_queue, history_from, history_json
from ..core.limits import MAX_KEY_LENGTH
from ..db import Database, Tx, to_datetime
from ..errors import InvalidRequest, NotFound, ReviewConflict
from .deadletters import Actor, record
from .letters import payload_view
from .validation import (
    MAX_PAGE,
    check_texts,
    checked_choice,
    checked_id,
    checked_limit,
    checked_reason,
    checked_window,
    like_pattern,
)

JOB_STATES = ("waiting", "running", "retrying")

__all__ = [
    "JOB_STATES",
    "MAX_PAGE",
    "CancelResult",
    "JobFilter",
    "JobPage",
    "JobSummary",
    "JobView",
    "QueueInfo",
    "cancel_job",
    "list_jobs",
    "list_queues",
    "pause_queue",
    "resume_queue",
    "retry_now",
    "show_job",
    "unserved_among",
    "unserved_jobs",
]


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: every given criterion must match. ``error`` is a case-insensitive
    substring of the last failed attempt's error; ``since``/``until`` bound ``enqueued_at``
    (until excluded)."""

    queue: str | None = None
    state: str | None = None
    job_id: str | None = None
    correlation_id: str | None = None
    error: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def check(self) -> JobFilter:
        """Validate; raise :class:`InvalidRequest` saying what is wrong."""
        state = checked_choice(self.state, JOB_STATES, "job state")
        check_texts(
            {
                "queue": self.queue,
                "job_id": self.job_id,
                "correlation_id": self.correlation_id,
                "error": self.error,
            }
        )
        since, until = checked_window(self.since, self.until)
        return replace(self, state=state, since=since, until=until)

    def params(self, db: Database, partner: str | None) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "state": self.state,
            "job_id": self.job_id,
            "correlation_id": self.correlation_id,
            "error": like_pattern(self.error) if self.error is not None else None,
            "since": db.at(self.since),
            "until": db.at(self.until),
            "partner": partner,
        }


@dataclass(frozen=True)
class JobSummary:
    """A job as lists show it (no payload, no history)."""

    id: int  # the queue row's id: what the actions take
    queue: str
    job_id: str
    correlation_id: str | None
    state: str  # waiting | running | retrying
    attempts: int
    run_at: datetime  # when it is due (retrying: the next attempt)
    enqueued_at: datetime
    worker_id: str | None  # running: the worker holding it
    lease_expires_at: datetime | None  # running: until when its lease runs
    last_error: str | None
    last_category: str | None
    partner: str | None
    payload_size: int
    priority: int = 0  # 0 to 9, higher runs first

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("run_at", "enqueued_at", "lease_expires_at"):
            value = data[key]
            data[key] = value.isoformat() if value is not None else None
        return data


@dataclass(frozen=True)
class JobView:
    """One job: its summary, payload and every failed attempt (with tracebacks)."""

    job: JobSummary
    payload: bytes
    history: list[AttemptRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.job.to_json(),
            "payload": payload_view(self.payload),
            "history": [h.to_json() for h in self.history],
        }


@dataclass(frozen=True)
class JobPage:
    """One page of jobs; pass ``next_cursor`` back as ``after`` (None: the last page)."""

    items: list[JobSummary]
    next_cursor: int | None


@dataclass(frozen=True)
class CancelResult:
    job: JobSummary
    dead_letter_id: int


@dataclass(frozen=True)
class QueueInfo:
    """A queue as operators see it: its jobs by state, letters pending review, pause."""

    queue: str
    waiting: int = 0
    running: int = 0
    retrying: int = 0
    dead_letters: int = 0  # pending review
    paused: bool = False
    paused_by: str | None = None
    paused_at: datetime | None = None
    pause_reason: str | None = None
    served: bool | None = None  # by a consumer of the app (None: not asked)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["paused_at"] = self.paused_at.isoformat() if self.paused_at else None
        return data


def _summary(row: Mapping[str, Any]) -> JobSummary:
    run_at, enqueued_at = to_datetime(row["run_at"]), to_datetime(row["enqueued_at"])
    assert run_at is not None
    assert enqueued_at is not None
    state = "running" if row["state"] == "running" else "retrying" if row["failed"] else "waiting"
    return JobSummary(
        id=int(row["id"]),
        queue=row["queue"],
        job_id=row["job_id"],
        correlation_id=row["correlation_id"],
        state=state,
        attempts=int(row["attempts"]),
        run_at=run_at,
        enqueued_at=enqueued_at,
        worker_id=row["worker_id"],
        lease_expires_at=to_datetime(row["lease_expires_at"]),
        last_error=row["last_error"],
        last_category=row["last_category"],
        partner=row["partner"],
        payload_size=int(row["payload_size"]),
        priority=int(row["priority"]),
    )


# -- find and understand ---------------------------------------------------------------------


async def list_jobs(
    db: Database,
    flt: JobFilter,
    *,
    actor: Actor,
    limit: int = 50,
    after: int | None = None,
    jobs_db: Database | None = None,
) -> JobPage:
    """Jobs matching ``flt`` within the actor's scope, oldest first, without payloads.

    A keyset page on the primary key: deep pages cost what the first does."""
    flt = flt.check()
    qdb = _jobs(db, jobs_db)
    params = {
        **flt.params(qdb, actor.partner),
        "after": checked_id(after, "after (the cursor)", low=0),
        "limit": checked_limit(limit),
    }
    rows = await qdb.run("jobs_list", params)
    items = [_summary(r) for r in rows]
    return JobPage(items, items[-1].id if len(items) == limit else None)


async def show_job(
    db: Database, job: int, *, actor: Actor, jobs_db: Database | None = None
) -> JobView:
    """One job (by its queue row id) with its payload and attempt history."""
    checked_id(job, "the job id")
    rows = await _jobs(db, jobs_db).run("job_get", {"id": job})
    if not rows or not actor.sees(rows[0]["partner"]):
        raise NotFound(_gone(job))
    row = rows[0]
    return JobView(_summary(row), bytes(row["payload"]), history_from(row["history"]))


# -- act -------------------------------------------------------------------------------------


def _jobs(db: Database, jobs_db: Database | None) -> Database:
    """The database holding the jobs: ``jobs_db`` when given, else the app's own ``db``."""
    return db if jobs_db is None else jobs_db


def _gone(job: int) -> str:
    return (
        f"no job {job} in the queue (finished, dead-lettered, or never there: look it up by "
        "its job_id to know which)"
    )


def _running(job: int, worker: str | None) -> ReviewConflict:
    return ReviewConflict(
        f"job {job} is running on worker {worker}; a running job cannot be cancelled or "
        "retried: wait until its attempt ends (it is then done, retrying or a dead letter), "
        "or pause its queue to stop further claims"
    )


async def _not_running(jobs_db: Database, job: int, actor: Actor) -> None:
    """Refuse a running job before taking any lock: its attempt's transaction holds the row
    (PostgreSQL) or the database's write lock (SQLite) for as long as its handler works."""
    checked_id(job, "the job id")
    rows = await jobs_db.run("job_get", {"id": job})
    if rows and actor.sees(rows[0]["partner"]) and rows[0]["state"] == "running":
        raise _running(job, rows[0]["worker_id"])


async def _locked(tx: Tx, job: int, actor: Actor) -> Mapping[str, Any]:
    checked_id(job, "the job id")
    rows = await tx.q("job_lock", {"id": job})
    # PostgreSQL skips a row locked already: the transaction of an attempt running it
    seen = rows or await tx.q("job_get", {"id": job})
    if not seen or not actor.sees(seen[0]["partner"]):
        raise NotFound(_gone(job))
    if not rows or seen[0]["state"] == "running":
        raise _running(job, seen[0]["worker_id"])
    return rows[0]


async def _transactions(stack: AsyncExitStack, db: Database, jobs_db: Database) -> tuple[Tx, Tx]:
    """The queue's transaction and the letters' (one when the queue is in ``db``). The
    queue's is entered first and so commits last: if it fails, the job stays and what was
    recorded about it (a letter, an audit row) says so — nothing is lost silently."""
    qtx = await stack.enter_async_context(jobs_db.transaction())
    if jobs_db is db:
        return qtx, qtx
    return qtx, await stack.enter_async_context(db.transaction())


def _details(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"job": int(row["id"]), "job_id": row["job_id"], "queue": row["queue"]}


async def cancel_job(
    db: Database,
    job: int,
    *,
    actor: Actor,
    reason: str,
    consumers: Mapping[str, str] | None = None,
    jobs_db: Database | None = None,
) -> CancelResult:
    """Cancel a waiting or retrying job: it leaves the queue and becomes a discarded dead
    letter (error code ``CANCELLED``), audited, in one transaction. ``reason`` is required.
    ``consumers`` maps queues to consumer names (the letter's consumer; default the queue)."""
    why = checked_reason(reason, required=True)
    qdb = _jobs(db, jobs_db)
    await _not_running(qdb, job, actor)
    async with AsyncExitStack() as stack:
        qtx, tx = await _transactions(stack, db, qdb)
        row = await _locked(qtx, job, actor)
        summary = _summary(row)
        history = history_from(row["history"])
        created = await tx.q(
            "dl_insert_cancelled",
            {
                "queue": row["queue"],
                "consumer": (consumers or {}).get(row["queue"], row["queue"]),
                "job_id": row["job_id"],
                "correlation_id": row["correlation_id"],
                "payload": bytes(row["payload"]),
                "payload_size": int(row["payload_size"]),
                "attempts": int(row["attempts"]),
                "error": f"cancelled by {actor.name}: {why}",
                "history": history_json(history),
                "enqueued_at": row["enqueued_at"],
                "partner": row["partner"],
                "trace_context": row["trace_context"],
                "actor": actor.name,
                "reason": why,
            },
        )
        letter_id = int(created[0]["id"])
        await record(
            tx,
            actor,
            "job.cancel",
            dead_letter_id=letter_id,
            partner=row["partner"],
            reason=why,
            details=_details(row),
            old_state=summary.state,
            new_state="cancelled",
        )
        if not await qtx.q("job_delete", {"id": job}):  # pragma: no cover - locked above
            raise ReviewConflict(f"job {job} changed while it was being cancelled; try again")
    return CancelResult(summary, letter_id)


async def retry_now(
    db: Database,
    job: int,
    *,
    actor: Actor,
    reason: str | None = None,
    jobs_db: Database | None = None,
) -> JobSummary:
    """Make a job that is scheduled for later (a retry, or a delayed job) due now; audited.
    A job already due, or running, is a :class:`ReviewConflict`."""
    why = checked_reason(reason, required=False)
    qdb = _jobs(db, jobs_db)
    await _not_running(qdb, job, actor)
    async with AsyncExitStack() as stack:
        qtx, tx = await _transactions(stack, db, qdb)
        row = await _locked(qtx, job, actor)
        if not row["scheduled"]:
            raise ReviewConflict(f"job {job} is already due; a worker will claim it next")
        await qtx.q("job_run_now", {"id": job})
        await record(
            tx,
            actor,
            "job.retry_now",
            partner=row["partner"],
            reason=why,
            details={**_details(row), "was_due_at": str(to_datetime(row["run_at"]))},
            old_state=_summary(row).state,
            new_state="due",
        )
        if qdb.dialect == "postgresql":
            await qtx.q("notify_queues", {"queues": qdb.array([row["queue"]])})
        fresh = await qtx.q("job_get", {"id": job})
    return _summary(fresh[0])


# -- queues ----------------------------------------------------------------------------------


async def list_queues(
    db: Database,
    *,
    actor: Actor,
    served: Collection[str] | None = None,
    jobs_db: Database | None = None,
) -> list[QueueInfo]:
    """Every queue that has jobs, letters pending review, a pause, or a consumer in
    ``served`` (the app's queues): counts within the actor's scope.

    Queue names are partner-scoped when read: a partner-scoped actor sees only the queues
    where it has jobs or letters pending review (with their pause), never the names of
    queues only other partners use, nor the app's other queues. (Pausing and resuming stay
    unscoped: a queue is shared by every partner.)"""
    qdb = _jobs(db, jobs_db)
    found: dict[str, dict[str, Any]] = {}
    scoped = actor.partner is not None

    def entry(queue: str) -> dict[str, Any]:
        return found.setdefault(queue, {"queue": queue})

    def known(queue: str) -> dict[str, Any] | None:
        """The queue's entry; for a scoped actor only one its own rows created."""
        return found.get(queue) if scoped else entry(queue)

    for row in await qdb.run("jobs_queue_counts", {"partner": actor.partner}):
        entry(row["queue"]).update(
            waiting=int(row["waiting"] or 0),
            running=int(row["running"] or 0),
            retrying=int(row["retrying"] or 0),
        )
    for row in await db.run("dl_stats", {"partner": actor.partner}):
        if row["status"] == "pending_review":
            item = entry(row["queue"])
            item["dead_letters"] = item.get("dead_letters", 0) + int(row["letters"])
    for row in await qdb.run("queue_pauses"):
        pause = known(row["queue"])
        if pause is not None:
            pause.update(
                paused=True,
                paused_by=row["paused_by"],
                paused_at=to_datetime(row["paused_at"]),
                pause_reason=row["reason"],
            )
    for queue in served or ():
        known(queue)
    if served is not None:
        for item in found.values():
            item["served"] = item["queue"] in served
    return [QueueInfo(**found[q]) for q in sorted(found)]


async def unserved_jobs(
    db: Database,
    served: Collection[str],
    *,
    actor: Actor,
    jobs_db: Database | None = None,
) -> int:
    """Waiting and retrying jobs in queues that no consumer in ``served`` takes (the app's
    queues): they will wait until some app consumes them."""
    rows = await _jobs(db, jobs_db).run("jobs_queue_counts", {"partner": actor.partner})
    return sum(
        int(r["waiting"] or 0) + int(r["retrying"] or 0) for r in rows if r["queue"] not in served
    )


def unserved_among(queues: Collection[QueueInfo]) -> int:
    """Waiting and retrying jobs of the queues :func:`list_queues` (given ``served``) marked
    as served by no consumer: :func:`unserved_jobs` without counting the jobs again."""
    return sum(q.waiting + q.retrying for q in queues if q.served is False)


def _shared(actor: Actor, doing: str) -> None:
    if actor.partner is not None:
        raise InvalidRequest(
            f"a partner-scoped operator cannot {doing} a queue: queues are shared by every "
            "partner (use an unscoped operator token)"
        )


async def pause_queue(
    db: Database,
    queue: str,
    *,
    actor: Actor,
    reason: str | None = None,
    jobs_db: Database | None = None,
) -> QueueInfo:
    """Pause ``queue``: workers claim nothing from it until it is resumed (running jobs
    finish; new jobs still arrive). Audited (``queue.pause``)."""
    _shared(actor, "pause")
    _check_queue_name(queue)
    why = checked_reason(reason, required=False)
    qdb = _jobs(db, jobs_db)
    async with AsyncExitStack() as stack:
        qtx, tx = await _transactions(stack, db, qdb)
        done = await qtx.q("queue_pause", {"queue": queue, "actor": actor.name, "reason": why})
        if not done:
            rows = await qtx.q("paused_among", {"queues": qdb.array([queue])})
            by = rows[0]["paused_by"] if rows else "someone"
            raise ReviewConflict(f"queue {queue!r} is already paused (by {by})")
        await record(
            tx,
            actor,
            "queue.pause",
            reason=why,
            details={"queue": queue},
            old_state="active",
            new_state="paused",
        )
    return await _queue_info(db, qdb, queue)


async def resume_queue(
    db: Database,
    queue: str,
    *,
    actor: Actor,
    reason: str | None = None,
    jobs_db: Database | None = None,
) -> QueueInfo:
    """Resume a paused queue (workers claim from it again at once). Audited."""
    _shared(actor, "resume")
    _check_queue_name(queue)
    why = checked_reason(reason, required=False)
    qdb = _jobs(db, jobs_db)
    async with AsyncExitStack() as stack:
        qtx, tx = await _transactions(stack, db, qdb)
        done = await qtx.q("queue_resume", {"queue": queue})
        if not done:
            raise ReviewConflict(f"queue {queue!r} is not paused")
        await record(
            tx,
            actor,
            "queue.resume",
            reason=why,
            details={"queue": queue, "paused_by": done[0]["paused_by"]},
            old_state="paused",
            new_state="active",
        )
        if qdb.dialect == "postgresql":
            await qtx.q("notify_queues", {"queues": qdb.array([queue])})
    return await _queue_info(db, qdb, queue)


@dataclass(frozen=True)
class KeyPause:
    """A paused key of a limited queue (flow control, docs/flow-control.md)."""

    queue: str
    key: str
    paused_by: str
    reason: str


def _check_key_request(queue: str, key: object, actor: Actor, verb: str) -> None:
    """A pause or resume of ``key`` of ``queue``: a queue's name, a key a limit can have, and
    a partner-scoped operator only on its own partner's key."""
    _check_queue_name(queue)
    if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise InvalidRequest(
            f"a flow key is a string of at most {MAX_KEY_LENGTH} characters without NUL "
            '(the empty string "" is the key of a limit without one)'
        )
    if actor.partner is not None and actor.partner != key:
        raise InvalidRequest(
            f"a partner-scoped operator can {verb} only its own partner's key ({actor.partner!r})"
        )


async def pause_key(
    db: Database,
    queue: str,
    key: str,
    *,
    actor: Actor,
    reason: str | None = None,
    jobs_db: Database | None = None,
) -> KeyPause:
    """Pause one key of a queue with a Limit (e.g. one partner): workers claim none of its
    jobs, and brokers defer its deliveries, until it is resumed; other keys go on. Running
    jobs finish. Audited (``key.pause``). A partner-scoped operator pauses its own partner's
    key only."""
    _check_key_request(queue, key, actor, "pause")
    why = checked_reason(reason, required=False) or ""
    qdb = _jobs(db, jobs_db)
    async with AsyncExitStack() as stack:
        qtx, tx = await _transactions(stack, db, qdb)
        if await _key_paused(qtx, queue, key):
            raise ReviewConflict(f"key {key!r} of queue {queue!r} is already paused")
        await hold(
            qdb, queue, key, kind="pause", seconds=None, reason=why, held_by=actor.name, tx=qtx
        )
        await record(
            tx,
            actor,
            "key.pause",
            reason=why or None,
            details={"queue": queue, "key": key},
            old_state="active",
            new_state="paused",
        )
    return KeyPause(queue, key, actor.name, why)


async def resume_key(
    db: Database,
    queue: str,
    key: str,
    *,
    actor: Actor,
    reason: str | None = None,
    jobs_db: Database | None = None,
) -> None:
    """Resume a paused key (workers claim its jobs again at once). Audited (``key.resume``)."""
    _check_key_request(queue, key, actor, "resume")
    why = checked_reason(reason, required=False)
    qdb = _jobs(db, jobs_db)
    async with AsyncExitStack() as stack:
        qtx, tx = await _transactions(stack, db, qdb)
        if not await unhold(qdb, queue, key, kind="pause", tx=qtx):
            raise ReviewConflict(f"key {key!r} of queue {queue!r} is not paused")
        await record(
            tx,
            actor,
            "key.resume",
            reason=why,
            details={"queue": queue, "key": key},
            old_state="paused",
            new_state="active",
        )
        if qdb.dialect == "postgresql":
            await qtx.q("notify_queues", {"queues": qdb.array([queue])})


async def paused_keys(db: Database, queue: str) -> list[KeyPause]:
    """The paused keys of ``queue`` (``db``: where its jobs are, the job-control view)."""
    rows = await db.run("flow_status_holds", {"queue": queue})
    return [
        KeyPause(queue, row["key"], row["held_by"], row["reason"])
        for row in rows
        if row["kind"] == "pause"
    ]


async def _key_paused(tx: Tx, queue: str, key: str) -> bool:
    rows = await tx.q("flow_status_holds", {"queue": queue})
    return any(row["key"] == key and row["kind"] == "pause" for row in rows)


async def paused_among(db: Database, queues: Collection[str]) -> dict[str, dict[str, Any]]:
    """Which of ``queues`` are paused: queue → {paused_by, reason} (what workers watch)."""
    rows = await db.run("paused_among", {"queues": db.array(sorted(queues))})
    return {r["queue"]: {"paused_by": r["paused_by"], "reason": r["reason"]} for r in rows}


async def _queue_info(db: Database, jobs_db: Database, queue: str) -> QueueInfo:
    infos = await list_queues(db, actor=Actor("library"), jobs_db=jobs_db)
    return next((i for i in infos if i.queue == queue), QueueInfo(queue))


def _check_queue_name(queue: str) -> None:
    try:
        check_queue(queue)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
