"""``jobfence jobs list|show|cancel|retry-now``, ``jobfence queues
list|pause|resume|pause-key|resume-key`` and
``jobfence dead-letters discard-matching``: the CLI twins of the console's jobs and queues
pages and of ``/v1/jobs``, ``/v1/queues`` and ``/v1/discards``, thin over
:mod:`jobfence.review.jobctl` and :mod:`jobfence.review.discards`.

Jobs and pauses live in the queue's database (``--transport`` when it is not the app's
database); a broker keeps its jobs itself (docs/job-control.md). Every action is audited as
``--actor``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import click
from rich.table import Table

from ..app import App
from ..db import Database
from ..errors import InvalidRequest
from ..review import deadletters as service
from ..review import discards, jobctl, jobfind
from ..review.validation import checked_reason
from .common import (
    actor_option,
    confirm,
    console,
    database_option,
    dead_letters,
    default_actor,
    emit_json,
    json_option,
    letter_filter_options,
    limit_option,
    main_group,
    make_app,
    parse_moment,
    print_attempts,
    run,
    show_time,
    transport_option,
)


@main_group.group("jobs")
def jobs_group() -> None:
    """Jobs of the database queue: waiting, running, retrying — list, show, cancel, retry now."""


@main_group.group("queues")
def queues_group() -> None:
    """Queues: their jobs by state, dead letters pending review; pause and resume them."""


@contextlib.asynccontextmanager
async def _queue(
    database_url: str | None, transport: str | None
) -> AsyncIterator[tuple[App, Database]]:
    """The app and the database its queue lives in (a broker: a clear error)."""
    app = make_app(database_url, transport)
    async with app:
        qdb = app.transport.job_control()
        yield app, qdb


def _who(actor: str | None = None) -> service.Actor:
    return service.Actor(actor or default_actor(), "cli")


def job_ref(command: Callable[..., Any]) -> Callable[..., Any]:
    """JOB_ID (with ``--queue`` when several queues hold it) or ``--id N``, the row id."""
    command = click.option(
        "--id",
        "row_id",
        type=click.IntRange(1),
        help="The job's queue row id (`id` in `jobs list`) instead of its job_id.",
    )(command)
    command = click.option("--queue", help="The job's queue (when several hold the job_id).")(
        command
    )
    return click.argument("job_id", required=False)(command)


def _ref(job_id: str | None, row_id: int | None, queue: str | None) -> None:
    """Exactly one way to name the job, checked before connecting."""
    if (job_id is None) == (row_id is None):
        raise click.UsageError(
            "name the job by its job_id (JOB_ID, with --queue when several queues hold it) "
            "or by its row id (--id N, the id `jobs list` shows) — one of the two"
        )
    if row_id is not None and queue is not None:
        raise click.UsageError("--queue goes with a job_id; --id names one job already")


async def _row(
    app: App, qdb: Database, job_id: str | None, row_id: int | None, queue: str | None
) -> int:
    if row_id is not None:
        return row_id
    assert job_id is not None  # _ref checked it
    return await jobfind.find_job(
        app.db,
        job_id,
        actor=_who(),
        queue=queue,
        consumers={q: c.name for q, c in app.consumers.items()},
        jobs_db=qdb,
    )


@jobs_group.command("list")
@database_option
@transport_option
@click.option("--queue", help="Only jobs of this queue.")
@click.option(
    "--state", type=click.Choice([*jobctl.JOB_STATES, "all"]), help="Only jobs in this state."
)
@click.option("--job-id", help="Only jobs with this job_id.")
@click.option("--correlation-id", help="Only jobs with this correlation_id.")
@click.option("--error", "error_text", help="Last attempt's error contains this (any case).")
@click.option("--since", help="Enqueued at or after: ISO time, or a duration ago (2h).")
@click.option("--until", help="Enqueued before: ISO time, or a duration ago.")
@click.option("--after", type=click.IntRange(0), help="The previous page's next cursor.")
@limit_option()
@json_option
def list_jobs(
    database_url: str | None,
    transport: str | None,
    queue: str | None,
    state: str | None,
    job_id: str | None,
    correlation_id: str | None,
    error_text: str | None,
    since: str | None,
    until: str | None,
    after: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """Jobs in the queue, oldest first: state (running ones with their worker and lease,
    retrying ones with the next attempt's time and the last error)."""
    flt = jobctl.JobFilter(
        queue=queue,
        state=state,
        job_id=job_id,
        correlation_id=correlation_id,
        error=error_text,
        since=parse_moment(since, "--since"),
        until=parse_moment(until, "--until"),
    )

    async def go() -> jobctl.JobPage:
        async with _queue(database_url, transport) as (_, qdb):
            return await jobctl.list_jobs(qdb, flt, actor=_who(), limit=limit, after=after)

    found = run(go())
    if as_json:
        for job in found.items:
            emit_json(job.to_json())
        return
    table = Table(title="jobs")
    for column in ("id", "queue", "job_id", "state", "attempts", "due / lease", "last error"):
        table.add_column(column, overflow="fold")
    for job in found.items:
        when = (
            f"{job.worker_id} until {show_time(job.lease_expires_at)}"
            if job.state == "running"
            else show_time(job.run_at)
        )
        table.add_row(
            str(job.id),
            job.queue,
            job.job_id,
            job.state,
            str(job.attempts),
            when,
            job.last_error or "",
        )
    console.print(table)
    if found.next_cursor is not None:
        console.print(f"more: --after {found.next_cursor}")


@jobs_group.command("show")
@job_ref
@database_option
@transport_option
@json_option
def show_job(
    job_id: str | None,
    row_id: int | None,
    queue: str | None,
    database_url: str | None,
    transport: str | None,
    as_json: bool,
) -> None:
    """One job by its JOB_ID (or --id N): payload and every failed attempt's traceback. A job
    no longer queued says what became of it: finished (its fence) or a dead letter."""
    _ref(job_id, row_id, queue)

    async def go() -> jobctl.JobView:
        async with _queue(database_url, transport) as (app, qdb):
            job = await _row(app, qdb, job_id, row_id, queue)
            return await jobctl.show_job(qdb, job, actor=_who())

    view = run(go())
    if as_json:
        emit_json(view.to_json())
        return
    table = Table(title=f"job {view.job.job_id} (id {view.job.id})", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    j = view.job
    for name, value in (
        ("queue", j.queue),
        ("job_id", j.job_id),
        ("correlation_id", j.correlation_id or "-"),
        ("state", j.state),
        ("attempts", str(j.attempts)),
        ("due", f"{show_time(j.run_at)} UTC"),
        ("worker / lease", f"{j.worker_id} until {show_time(j.lease_expires_at)} UTC")
        if j.state == "running"
        else ("worker / lease", "-"),
        ("enqueued", f"{show_time(j.enqueued_at)} UTC"),
        ("partner", j.partner or "-"),
        ("priority", str(j.priority)),
    ):
        table.add_row(name, value)
    console.print(table)
    print_attempts(view.history)
    shown = view.to_json()["payload"]
    console.print(f"[bold]payload[/bold] ({shown['encoding']}, {len(view.payload)} bytes):")
    text = shown["data"] or ""
    if shown["encoding"] == "utf-8":
        with contextlib.suppress(ValueError):
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    console.print(text, markup=False, highlight=False)


@jobs_group.command("cancel")
@job_ref
@database_option
@transport_option
@click.option("--reason", required=True, help="Why (required; kept on the letter, audited).")
@actor_option
@json_option
def cancel(
    job_id: str | None,
    row_id: int | None,
    queue: str | None,
    database_url: str | None,
    transport: str | None,
    reason: str,
    actor: str,
    as_json: bool,
) -> None:
    """Cancel a waiting or retrying job: it leaves the queue and is kept as a discarded dead
    letter (error code CANCELLED) with the reason. A running job is refused at once."""
    checked_reason(reason, required=True)  # a blank reason is refused before connecting
    _ref(job_id, row_id, queue)

    async def go() -> jobctl.CancelResult:
        async with _queue(database_url, transport) as (app, qdb):
            return await jobctl.cancel_job(
                app.db,
                await _row(app, qdb, job_id, row_id, queue),
                actor=_who(actor),
                reason=reason,
                consumers={q: c.name for q, c in app.consumers.items()},
                jobs_db=qdb,
            )

    done = run(go())
    if as_json:
        emit_json({"job": done.job.to_json(), "dead_letter_id": done.dead_letter_id})
    else:
        console.print(
            f"job {done.job.job_id} (id {done.job.id}) cancelled: kept as dead letter "
            f"{done.dead_letter_id} (discarded)"
        )


@jobs_group.command("retry-now")
@job_ref
@database_option
@transport_option
@click.option("--reason", help="Why (optional; audited).")
@actor_option
@json_option
def retry_now(
    job_id: str | None,
    row_id: int | None,
    queue: str | None,
    database_url: str | None,
    transport: str | None,
    reason: str | None,
    actor: str,
    as_json: bool,
) -> None:
    """Make a job scheduled for later (a retry, or a delayed job) due now."""
    _ref(job_id, row_id, queue)

    async def go() -> jobctl.JobSummary:
        async with _queue(database_url, transport) as (app, qdb):
            job = await _row(app, qdb, job_id, row_id, queue)
            return await jobctl.retry_now(
                app.db, job, actor=_who(actor), reason=reason, jobs_db=qdb
            )

    done = run(go())
    if as_json:
        emit_json(done.to_json())
    else:
        console.print(f"job {done.job_id} (id {done.id}) is due now")


@queues_group.command("list")
@database_option
@transport_option
@json_option
def list_queues(database_url: str | None, transport: str | None, as_json: bool) -> None:
    """Every queue with jobs, letters pending review, a pause, or (with --app) a consumer."""

    async def go() -> tuple[list[jobctl.QueueInfo], int]:
        async with _queue(database_url, transport) as (app, qdb):
            known = set(app.consumers) or None
            found = await jobctl.list_queues(app.db, actor=_who(), served=known, jobs_db=qdb)
            return found, jobctl.unserved_among(found)

    found, unserved = run(go())
    if as_json:
        for info in found:
            emit_json(info.to_json())
        return
    table = Table(title="queues")
    for column in ("queue", "waiting", "running", "retrying", "dead letters", "paused", "served"):
        table.add_column(column, overflow="fold")
    for q in found:
        paused = f"by {q.paused_by}: {q.pause_reason or '-'}" if q.paused else ""
        served = "" if q.served is None else "yes" if q.served else "NO"
        table.add_row(
            q.queue,
            str(q.waiting),
            str(q.running),
            str(q.retrying),
            str(q.dead_letters),
            paused,
            served,
        )
    console.print(table)
    if unserved:
        console.print(f"{unserved} jobs wait in queues no consumer of this app serves")


def _pause_or_resume(action: str) -> click.Command:
    doc = (
        "Pause QUEUE: every worker, in every process, stops claiming from it (running jobs "
        "finish; new jobs still arrive)."
        if action == "pause"
        else "Resume a paused QUEUE: workers claim from it again at once."
    )

    @queues_group.command(action, help=doc)
    @click.argument("queue")
    @database_option
    @transport_option
    @click.option("--reason", help="Why (optional; audited).")
    @actor_option
    @json_option
    def command(
        queue: str,
        database_url: str | None,
        transport: str | None,
        reason: str | None,
        actor: str,
        as_json: bool,
    ) -> None:
        async def go() -> jobctl.QueueInfo:
            act = jobctl.pause_queue if action == "pause" else jobctl.resume_queue
            async with _queue(database_url, transport) as (app, qdb):
                return await act(app.db, queue, actor=_who(actor), reason=reason, jobs_db=qdb)

        info = run(go())
        if as_json:
            emit_json(info.to_json())
        else:
            console.print(f"queue {queue} {action}d ({info.waiting} waiting)")

    return command


pause = _pause_or_resume("pause")
resume = _pause_or_resume("resume")


def _pause_or_resume_key(action: str) -> click.Command:
    doc = (
        "Pause one KEY of QUEUE (a queue with a Limit; the key is e.g. a partner id): every "
        "worker stops claiming its jobs and brokers defer its deliveries, while the queue's "
        "other keys go on (running jobs finish)."
        if action == "pause"
        else "Resume a paused KEY of QUEUE: workers claim its jobs again at once."
    )

    @queues_group.command(f"{action}-key", help=doc)
    @click.argument("queue")
    @click.argument("key")
    @database_option
    @transport_option
    @click.option("--reason", help="Why (optional; audited).")
    @actor_option
    @json_option
    def command(
        queue: str,
        key: str,
        database_url: str | None,
        transport: str | None,
        reason: str | None,
        actor: str,
        as_json: bool,
    ) -> None:
        async def go() -> None:
            app = make_app(database_url, transport)
            async with app:
                # the key's hold lives with its jobs: the queue's database, or for a broker
                # the app's (where its flow state is)
                jobs_db = app.transport.jobs_db
                if action == "pause":
                    await jobctl.pause_key(
                        app.db, queue, key, actor=_who(actor), reason=reason, jobs_db=jobs_db
                    )
                else:
                    await jobctl.resume_key(
                        app.db, queue, key, actor=_who(actor), reason=reason, jobs_db=jobs_db
                    )

        run(go())
        if as_json:
            emit_json({"queue": queue, "key": key, "paused": action == "pause"})
        else:
            console.print(f"key {key} of queue {queue} {action}d")

    return command


pause_key = _pause_or_resume_key("pause")
resume_key = _pause_or_resume_key("resume")


@dead_letters.command("discard-matching")
@database_option
@letter_filter_options
@click.option("--all-pending", is_flag=True, help="Every pending letter (no filter).")
@click.option("--reason", required=True, help="Why they need no replay (required).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--expect", type=int, help="With --yes: refuse unless the preview has this many.")
@actor_option
@json_option
def discard_matching(
    database_url: str | None,
    letter_filter: service.Filter,
    all_pending: bool,
    reason: str,
    yes: bool,
    expect: int | None,
    actor: str,
    as_json: bool,
) -> None:
    """Bulk discard, the mirror of a bulk replay: shows what the filter matches (count,
    breakdown, sample), asks for confirmation, then discards those pending letters with the
    reason in one transaction, each audited. Letters written after the preview stay."""
    checked_reason(reason, required=True)
    if as_json and not yes:
        raise click.UsageError("--json runs unattended: add --yes (and --expect N)")
    flt = letter_filter
    who = _who(actor)

    async def go() -> discards.DiscardResult | None:
        app = make_app(database_url)
        async with app:
            found = await discards.preview_discard(app.db, flt, actor=who, all_pending=all_pending)
            if not as_json:
                _preview(found)
            if found.total == 0 or found.upto_id is None:
                return None
            if expect is not None and expect != found.total:
                raise InvalidRequest(f"{found.total} letters match, not the {expect} expected")
            if not yes:
                await confirm(
                    f"Discard these {found.total} dead letters?", declined="nothing was discarded"
                )
            return await discards.discard_matching(
                app.db,
                flt,
                actor=who,
                reason=reason,
                upto_id=found.upto_id,
                expect=found.total,
                all_pending=all_pending,
            )

    done = run(go())
    if as_json:
        emit_json({"discarded": done.discarded if done else 0, "ids": done.ids if done else []})
    elif done is None:
        console.print("nothing to discard: no pending letter matches")
    else:
        console.print(f"{done.discarded} dead letters discarded")


def _preview(found: discards.DiscardPreview) -> None:
    table = Table(title=f"{found.total} pending letters match")
    for column in ("queue", "category", "letters"):
        table.add_column(column)
    for row in found.breakdown:
        table.add_row(row["queue"], row["category"], str(row["letters"]))
    console.print(table)
    sample = Table(title="sample")
    for column in ("id", "queue", "job_id", "error"):
        sample.add_column(column, overflow="fold")
    for row in found.sample:
        sample.add_row(str(row["id"]), row["queue"], row["job_id"], row["last_error"])
    console.print(sample)
