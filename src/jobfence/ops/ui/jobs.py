"""Jobs and queues (:mod:`jobfence.review.jobctl`): jobs waiting, running and retrying (filters,
keyset pages), one job with its attempts and tracebacks, cancel and retry-now; queues with
their counts, pause and resume; and bulk discard of dead letters
(:mod:`jobfence.review.discards`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response

from ...app import App
from ...errors import InvalidRequest
from ...review import discards, jobctl
from ...runtime.flow_view import QueueFlow, limits_of, queue_flows
from ..deps import MAX_ID, jobfence_app
from .letters import form_time, letter_filter, read_form
from .render import link, page, payload_view, plural, redirect
from .session import Refused, User, actor_of, flash, operator, signed_in

router = APIRouter()
SIGNED_IN: Any = Depends(signed_in)
OPERATOR: Any = Depends(operator)
JOB: Any = Path(ge=1, le=MAX_ID)
QUEUE: Any = Path(min_length=1, max_length=200)
PAGE = 50
FILTERS = ("queue", "state", "job_id", "correlation_id", "error", "since", "until")


def served(jf: App) -> set[str] | None:
    """The queues the app's consumers take (None: this server knows no consumers)."""
    return set(jf.consumers) or None


@router.get("/ui/jobs")
async def list_jobs(request: Request, user: User = SIGNED_IN) -> Response:
    jf = jobfence_app(request)
    q = request.query_params
    kept = {k: (q.get(k) or "").strip() for k in FILTERS}
    after = q.get("after")
    error = None
    items: list[jobctl.JobSummary] = []
    cursor = None
    try:
        flt = jobctl.JobFilter(
            queue=kept["queue"] or None,
            state=kept["state"] or None,
            job_id=kept["job_id"] or None,
            correlation_id=kept["correlation_id"] or None,
            error=kept["error"] or None,
            since=form_time("since", kept["since"]),
            until=form_time("until", kept["until"]),
        )
        found = await jobctl.list_jobs(
            jf.transport.job_control(),
            flt,
            actor=actor_of(user.principal),
            limit=PAGE,
            after=int(after) if after and after.isdigit() else None,
        )
        items, cursor = found.items, found.next_cursor
    except InvalidRequest as exc:
        error = str(exc)
    return page(
        request,
        "jobs.html",
        user,
        status=422 if error else 200,
        error=error,
        jobs=items,
        now=datetime.now(UTC),  # a waiting job due later shows as delayed
        filters=kept,
        states=jobctl.JOB_STATES,
        next_url=link("/ui/jobs", **kept, after=cursor) if cursor else None,
        first_url=link("/ui/jobs", **kept) if after else None,
    )


@router.get("/ui/jobs/{job}")
async def show_job(request: Request, job: int = JOB, user: User = SIGNED_IN) -> Response:
    return await _job_page(request, job, user)


async def _job_page(
    request: Request, job: int, user: User, *, error: str | None = None
) -> Response:
    """One job's page; with ``error`` (a refused action), 422 with the message above it."""
    jf = jobfence_app(request)
    view = await jobctl.show_job(jf.transport.job_control(), job, actor=actor_of(user.principal))
    return page(
        request,
        "job.html",
        user,
        status=422 if error else 200,
        error=error,
        view=view,
        job=view.job,
        now=datetime.now(UTC),
        payload=payload_view(view.payload),
    )


@router.post("/ui/jobs/{job}/cancel")
async def cancel_job(request: Request, job: int = JOB, user: User = OPERATOR) -> Response:
    jf = jobfence_app(request)
    form = await read_form(request)
    try:
        done = await jobctl.cancel_job(
            jf.db,
            job,
            actor=actor_of(user.principal),
            reason=form.get("reason", ""),
            consumers={q: c.name for q, c in jf.consumers.items()},
            jobs_db=jf.transport.job_control(),
        )
    except InvalidRequest as exc:  # the job's page again, with why
        return await _job_page(request, job, user, error=str(exc))
    await flash(
        request,
        user,
        "ok",
        f"Job {done.job.job_id} cancelled: kept as dead letter {done.dead_letter_id}",
    )
    return redirect(f"/ui/dead-letters/{done.dead_letter_id}")


@router.post("/ui/jobs/{job}/retry-now")
async def retry_now(request: Request, job: int = JOB, user: User = OPERATOR) -> Response:
    jf = jobfence_app(request)
    form = await read_form(request)
    await jobctl.retry_now(
        jf.db,
        job,
        actor=actor_of(user.principal),
        reason=form.get("reason") or None,
        jobs_db=jf.transport.job_control(),
    )
    await flash(request, user, "ok", f"Job {job} is due now")
    return redirect(f"/ui/jobs/{job}")


# -- queues ----------------------------------------------------------------------------------


@router.get("/ui/queues")
async def queues(request: Request, user: User = SIGNED_IN) -> Response:
    jf = jobfence_app(request)
    actor = actor_of(user.principal)
    qdb = jf.transport.job_control()
    known = served(jf)
    found = await jobctl.list_queues(jf.db, actor=actor, served=known, jobs_db=qdb)
    unserved = jobctl.unserved_among(found)  # the jobs are counted once
    flows = await _flows(jf, actor.partner)
    return page(request, "queues.html", user, queues=found, unserved=unserved, flows=flows)


async def _flows(jf: App, partner: str | None) -> list[QueueFlow]:
    """The limited queues of the app, how full each key is and what waits; a partner-scoped
    user sees its own key only."""
    flows = await queue_flows(jf.transport.jobs_db or jf.db, limits_of(jf.consumers))
    if partner is None:
        return flows
    return [
        QueueFlow(
            f.queue,
            f.limit,
            [k for k in f.keys if k.key == partner],
            0,
            [h for h in f.holds if h.key == partner],
        )
        for f in flows
    ]


@router.post("/ui/flow/{action}-key")
async def pause_or_resume_key(request: Request, action: str, user: User = OPERATOR) -> Response:
    """Pause or resume one key of a limited queue (the form names the queue and the key)."""
    jf = jobfence_app(request)
    form = await read_form(request)
    act = {"pause": jobctl.pause_key, "resume": jobctl.resume_key}.get(action)
    if act is None:
        raise Refused(404, f"no key action {action!r}")
    queue, key = form.get("queue") or "", form.get("key")
    if not queue or key is None:
        raise InvalidRequest("a key action names the queue and the key")
    await act(
        jf.db,
        queue,
        key,
        actor=actor_of(user.principal),
        reason=form.get("reason") or None,
        jobs_db=jf.transport.jobs_db,
    )
    await flash(request, user, "ok", f"Key {key or '(whole queue)'} of queue {queue} {action}d")
    return redirect("/ui/queues")


@router.post("/ui/queues/{queue:path}/{action}")
async def pause_or_resume(
    request: Request, action: str, queue: str = QUEUE, user: User = OPERATOR
) -> Response:
    jf = jobfence_app(request)
    form = await read_form(request)
    act = {"pause": jobctl.pause_queue, "resume": jobctl.resume_queue}.get(action)
    if act is None:
        raise Refused(404, f"no queue action {action!r}")
    await act(
        jf.db,
        queue,
        actor=actor_of(user.principal),
        reason=form.get("reason") or None,
        jobs_db=jf.transport.job_control(),
    )
    await flash(request, user, "ok", f"Queue {queue} {action}d")
    return redirect("/ui/queues")


# -- bulk discard -----------------------------------------------------------------------------


@router.post("/ui/discards")
async def preview_discard(request: Request, user: User = OPERATOR) -> Response:
    """Preview discarding the selected letters, or every pending letter the list's filter
    matches: the count, per queue and category, and a sample; nothing is changed."""
    return await _discard_preview(request, user)


async def _discard_preview(request: Request, user: User, error: str | None = None) -> Response:
    form = await request.form()
    values = {k: v for k, v in form.items() if isinstance(v, str)}
    ids = [v for v in form.getlist("ids") if isinstance(v, str)]
    whole = values.get("scope") == "filter" or (error is not None and not ids)
    if not whole and not ids:
        raise InvalidRequest("select letters to discard, or discard everything the filter matches")
    flt = letter_filter({**values, "status": ""}, ids=None if whole else ids)
    found = await discards.preview_discard(
        jobfence_app(request).db, flt, actor=actor_of(user.principal), all_pending=flt.is_empty
    )
    skip = ("csrf", "scope", "reason", "ids", "upto_id", "expect")
    hidden = {k: v for k, v in values.items() if k not in skip and v}
    return page(
        request,
        "discard.html",
        user,
        status=422 if error else 200,
        error=error,
        preview=found,
        hidden=hidden,
        ids=[] if whole else ids,
    )


@router.post("/ui/discards/run")
async def run_discard(request: Request, user: User = OPERATOR) -> Response:
    """Discard what the preview showed, with a reason (refused without one: the preview is
    shown again, nothing changed)."""
    form = await request.form()
    values = {k: v for k, v in form.items() if isinstance(v, str)}
    ids = [v for v in form.getlist("ids") if isinstance(v, str)]
    try:
        upto, expect = int(values.get("upto_id", "")), int(values.get("expect", ""))
    except ValueError:
        raise Refused(422, "confirm the count the preview showed") from None
    flt = letter_filter({**values, "status": ""}, ids=ids or None)
    try:
        done = await discards.discard_matching(
            jobfence_app(request).db,
            flt,
            actor=actor_of(user.principal),
            reason=values.get("reason", ""),
            upto_id=upto,
            expect=expect,
            all_pending=flt.is_empty,
        )
    except InvalidRequest as exc:
        return await _discard_preview(request, user, error=str(exc))
    await flash(request, user, "ok", f"{plural(done.discarded, 'dead letter')} discarded")
    return redirect("/ui/dead-letters?status=discarded")
