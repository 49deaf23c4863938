"""``/v1/jobs``, ``/v1/queues`` and ``/v1/discards``: job control (:mod:`jobfence.review.jobctl`) —
jobs waiting, running and scheduled for retry, cancel and retry-now, queues with their counts,
pause and resume — and bulk discard of dead letters (:mod:`jobfence.review.discards`).

The same service functions as ``jobfence jobs …``/``jobfence queues …`` and the console's
pages; every action is audited in its own transaction. Jobs and pauses live in the queue's
database: with a broker transport these routes answer 404 saying so (docs/job-control.md
says what each broker can show).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from ...app import App
from ...review import deadletters as service
from ...review import discards, jobctl, jobfind
from ...review.validation import MAX_REASON
from .. import models
from ..auth import Principal
from ..deps import APP, CONFLICT, FORBIDDEN, MAX_ID, MISSING, OPERATOR, VIEWER, actor_of

router = APIRouter()
JOB: Any = Path(ge=1, le=MAX_ID, description="A job's queue row id (`id` in the lists).")
QUEUE: Any = Path(min_length=1, max_length=200, description="A queue name.")


class JobSummary(BaseModel):
    """A job as lists show it (no payload, no history)."""

    id: int = Field(description="The queue row's id: what the actions take.")
    queue: str
    job_id: str
    correlation_id: str | None
    state: Literal["waiting", "running", "retrying"]
    attempts: int
    run_at: datetime = Field(description="When it is due (retrying: the next attempt).")
    enqueued_at: datetime
    worker_id: str | None = Field(description="Running: the worker holding it.")
    lease_expires_at: datetime | None = Field(description="Running: until when it is leased.")
    last_error: str | None
    last_category: str | None
    partner: str | None
    payload_size: int
    priority: int = Field(description="0 to 9, higher runs first (0: the default).")

    @classmethod
    def of(cls, job: jobctl.JobSummary) -> JobSummary:
        return cls(**job.__dict__)


class JobPage(BaseModel):
    items: list[JobSummary]
    next_cursor: int | None = Field(description="Pass as `after` for the next page; null: end.")


class JobDetail(JobSummary):
    """One job with its payload and every failed attempt (with tracebacks)."""

    payload: models.Payload
    history: list[models.Attempt] = Field(description="Every failed attempt, oldest first.")


class CancelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(max_length=MAX_REASON, description="Why (required).")


class ReasonBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=MAX_REASON, description="Why (optional).")


class Cancelled(BaseModel):
    job: JobSummary = Field(description="The job as it was when cancelled.")
    dead_letter_id: int = Field(
        description="The discarded dead letter (error code CANCELLED) that keeps it."
    )


class Queue(BaseModel):
    queue: str
    waiting: int
    running: int
    retrying: int
    dead_letters: int = Field(description="Dead letters pending review.")
    paused: bool
    paused_by: str | None
    paused_at: datetime | None
    pause_reason: str | None
    served: bool | None = Field(
        description="Whether a consumer of the app serves it; null: this server knows none."
    )


class QueueList(BaseModel):
    queues: list[Queue]
    unserved_jobs: int = Field(
        description="Jobs waiting or retrying in queues no consumer of the app serves."
    )


class DiscardPreviewBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filter: models.LetterFilter = Field(default_factory=models.LetterFilter)
    all_pending: bool = Field(default=False, description="Take every pending letter in scope.")


class DiscardBody(DiscardPreviewBody):
    reason: str = Field(max_length=MAX_REASON, description="Why (required).")
    upto_id: int = Field(ge=1, le=MAX_ID, description="The preview's upto_id.")
    expect: int = Field(ge=0, le=MAX_ID, description="The preview's total: the confirmation.")


class DiscardPreview(BaseModel):
    """What a bulk discard would take now; nothing is changed."""

    total: int
    upto_id: int | None = Field(description="Confirm with it: letters written later are left.")
    filter: dict[str, Any]
    breakdown: list[dict[str, Any]] = Field(description="queue, category, letters")
    sample: list[dict[str, Any]]


class Discarded(BaseModel):
    discarded: int
    ids: list[int]


def _letters(flt: models.LetterFilter) -> service.Filter:
    ids = tuple(flt.ids) if flt.ids is not None else None
    return service.Filter(**flt.model_dump(exclude={"ids"}), ids=ids)


@router.get("/v1/jobs", response_model=JobPage, tags=["jobs"])
async def list_jobs(
    who: Principal = VIEWER,
    queue: str | None = None,
    state: str | None = Query(None, description="waiting, running, retrying, or all (default)"),
    job_id: str | None = None,
    correlation_id: str | None = None,
    error: str | None = Query(None, description="Substring of the last attempt's error."),
    since: datetime | None = Query(None, description="enqueued_at ≥ since"),
    until: datetime | None = Query(None, description="enqueued_at < until"),
    limit: int = Query(50, ge=1, le=jobctl.MAX_PAGE),
    after: int | None = Query(None, ge=0, le=MAX_ID, description="The previous next_cursor."),
    jf: App = APP,
) -> Any:
    """Jobs in the queue, oldest first (keyset pages), without payloads."""
    flt = jobctl.JobFilter(
        queue=queue,
        state=state,
        job_id=job_id,
        correlation_id=correlation_id,
        error=error,
        since=since,
        until=until,
    )
    found = await jobctl.list_jobs(
        jf.transport.job_control(), flt, actor=actor_of(who), limit=limit, after=after
    )
    return {"items": [JobSummary.of(j) for j in found.items], "next_cursor": found.next_cursor}


@router.get(
    "/v1/jobs/by-job-id/{job_id}", response_model=JobDetail, responses=MISSING, tags=["jobs"]
)
async def find_job(
    job_id: str = Path(min_length=1, max_length=255, description="The job's job_id."),
    queue: str | None = Query(None, description="Its queue, when several queues hold it."),
    who: Principal = VIEWER,
    jf: App = APP,
) -> Any:
    """One job by its job_id, as `GET /v1/jobs/{id}`; 404 says what became of a job no longer
    queued (finished: its fence's consumer and time; or its dead letter); 422 lists several
    queued jobs with the job_id."""
    job = await jobfind.find_job(
        jf.db,
        job_id,
        actor=actor_of(who),
        queue=queue,
        consumers={q: c.name for q, c in jf.consumers.items()},
        jobs_db=jf.transport.job_control(),
    )
    return await show_job(job, who, jf)


@router.get("/v1/jobs/{job}", response_model=JobDetail, responses=MISSING, tags=["jobs"])
async def show_job(job: int = JOB, who: Principal = VIEWER, jf: App = APP) -> Any:
    """One job: payload (UTF-8 text, or base64) and every failed attempt with its traceback."""
    view = await jobctl.show_job(jf.transport.job_control(), job, actor=actor_of(who))
    shown = view.to_json()["payload"]
    return JobDetail(
        **JobSummary.of(view.job).model_dump(),
        payload=models.Payload(
            encoding=shown["encoding"],
            data=shown["data"] or "",
            size=len(view.payload),
            truncated=False,
        ),
        history=[models.Attempt(**h.__dict__) for h in view.history],
    )


@router.post(
    "/v1/jobs/{job}/cancel",
    response_model=Cancelled,
    responses={**FORBIDDEN, **MISSING, **CONFLICT},
    tags=["jobs"],
)
async def cancel_job(
    body: CancelBody, job: int = JOB, who: Principal = OPERATOR, jf: App = APP
) -> Any:
    """Cancel a waiting or retrying job: it leaves the queue and is kept as a discarded dead
    letter (error code CANCELLED) with the reason, audited. A running job is 409 at once."""
    done = await jobctl.cancel_job(
        jf.db,
        job,
        actor=actor_of(who),
        reason=body.reason,
        consumers={q: c.name for q, c in jf.consumers.items()},
        jobs_db=jf.transport.job_control(),
    )
    return Cancelled(job=JobSummary.of(done.job), dead_letter_id=done.dead_letter_id)


@router.post(
    "/v1/jobs/{job}/retry-now",
    response_model=JobSummary,
    responses={**FORBIDDEN, **MISSING, **CONFLICT},
    tags=["jobs"],
)
async def retry_now(
    body: ReasonBody | None = None, job: int = JOB, who: Principal = OPERATOR, jf: App = APP
) -> Any:
    """Make a job scheduled for later (a retry, a delayed job) due now. 409 when it is due
    already or running."""
    done = await jobctl.retry_now(
        jf.db,
        job,
        actor=actor_of(who),
        reason=body.reason if body else None,
        jobs_db=jf.transport.job_control(),
    )
    return JobSummary.of(done)


@router.get("/v1/queues", response_model=QueueList, tags=["queues"])
async def list_queues(who: Principal = VIEWER, jf: App = APP) -> Any:
    """Every queue with jobs, dead letters pending review, a pause or a consumer: counts
    within the token's scope, pauses, and whether the app serves it."""
    actor, qdb = actor_of(who), jf.transport.job_control()
    known = set(jf.consumers) or None
    found = await jobctl.list_queues(jf.db, actor=actor, served=known, jobs_db=qdb)
    return {"queues": [q.to_json() for q in found], "unserved_jobs": jobctl.unserved_among(found)}


@router.post(
    "/v1/queues/{queue:path}/{action}",
    response_model=Queue,
    responses={**FORBIDDEN, **CONFLICT},
    tags=["queues"],
)
async def pause_or_resume(
    action: Literal["pause", "resume"],
    body: ReasonBody | None = None,
    queue: str = QUEUE,
    who: Principal = OPERATOR,
    jf: App = APP,
) -> Any:
    """Pause a queue (every worker stops claiming from it, whatever process it runs in;
    running jobs finish, new jobs still arrive) or resume it. Audited; 409 when it is paused
    already (pause) or not paused (resume)."""
    act = jobctl.pause_queue if action == "pause" else jobctl.resume_queue
    info = await act(
        jf.db,
        queue,
        actor=actor_of(who),
        reason=body.reason if body else None,
        jobs_db=jf.transport.job_control(),
    )
    return info.to_json()


@router.post(
    "/v1/discards", response_model=DiscardPreview, responses=FORBIDDEN, tags=["dead letters"]
)
async def preview_discard(
    body: DiscardPreviewBody, who: Principal = OPERATOR, jf: App = APP
) -> Any:
    """Dry run of a bulk discard: how many pending letters the filter matches, per queue and
    category, and a sample. Nothing changes; confirm with POST /v1/discards/run."""
    found = await discards.preview_discard(
        jf.db, _letters(body.filter), actor=actor_of(who), all_pending=body.all_pending
    )
    return found.to_json()


@router.post(
    "/v1/discards/run",
    response_model=Discarded,
    responses={**FORBIDDEN, **CONFLICT},
    tags=["dead letters"],
)
async def run_discard(body: DiscardBody, who: Principal = OPERATOR, jf: App = APP) -> Any:
    """Discard the previewed letters (still pending, ids up to upto_id) with a reason, in one
    transaction, each audited. Refused (422, nothing discarded) when more than `expect`
    letters would be."""
    done = await discards.discard_matching(
        jf.db,
        _letters(body.filter),
        actor=actor_of(who),
        reason=body.reason,
        upto_id=body.upto_id,
        expect=body.expect,
        all_pending=body.all_pending,
    )
    return {"discarded": done.discarded, "ids": done.ids}
