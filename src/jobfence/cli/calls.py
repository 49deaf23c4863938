"""``jobfence calls list|show|settle``: the recorded calls of jobs — above all the ones in
doubt — and an operator's settlement of one; the CLI twins of ``/v1/calls`` and the console's
calls page, thin over :mod:`jobfence.calls.review`.

A settlement is audited as ``--actor`` and replays the job's parked dead letter to the queue
(``--transport`` when it is not the database queue), so the job goes on.
"""

from __future__ import annotations

from datetime import timedelta

import click
from rich.table import Table

from ..calls import review
from ..review.deadletters import Actor
from .common import (
    Duration,
    actor_option,
    console,
    database_option,
    default_actor,
    emit_json,
    json_option,
    limit_option,
    main_group,
    opened_app,
    run,
    show_time,
    transport_option,
)


@main_group.group("calls")
def calls_group() -> None:
    """Recorded calls of jobs to other systems: list the ones in doubt, show, settle one."""


@calls_group.command("list")
@database_option
@click.option(
    "--state",
    type=click.Choice([*review.CALL_STATES, review.ALL_STATES]),
    default="in_doubt",
    show_default=True,
    help="Only calls in this state (all: any).",
)
@click.option("--queue", help="Only calls of jobs of this queue.")
@click.option("--consumer", help="Only calls of this consumer.")
@click.option("--step", help="Only this step (e.g. erp.create).")
@click.option("--job-id", help="Only the calls of this job.")
@click.option(
    "--older-than", type=Duration(), help="Only calls whose intent is at least this old (10m)."
)
@click.option("--after", type=click.IntRange(0), help="The previous page's next cursor.")
@limit_option()
@json_option
def list_calls(
    database_url: str | None,
    state: str,
    queue: str | None,
    consumer: str | None,
    step: str | None,
    job_id: str | None,
    older_than: timedelta | None,
    after: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """Recorded calls, oldest first (by default the in-doubt ones): job, step, the key sent
    downstream, age and last error."""
    flt = review.CallFilter(
        state=state,
        queue=queue,
        consumer=consumer,
        step=step,
        job_id=job_id,
        older_than=older_than,
    )

    async def go() -> review.CallPage:
        async with opened_app(database_url) as app:
            calls = await review.ledger_db(app.ledger, app.db)
            return await review.list_calls(
                calls, flt, actor=Actor(default_actor(), "cli"), limit=limit, after=after
            )

    found = run(go())
    if as_json:
        for call in found.items:
            emit_json(call.to_json())
        return
    table = Table(title=f"calls ({state})")
    for column in ("id", "job_id", "queue", "step", "key", "state", "age", "last error"):
        table.add_column(column, overflow="fold")
    for call in found.items:
        table.add_row(
            str(call.id),
            call.job_id,
            call.queue,
            call.step,
            call.key,
            call.state,
            review.age_text(call.age_seconds),
            call.last_error or "",
        )
    console.print(table)
    if found.next_cursor is not None:
        console.print(f"more: --after {found.next_cursor}")


@calls_group.command("show")
@click.argument("call_id", type=click.IntRange(1))
@database_option
@json_option
def show_call(call_id: int, database_url: str | None, as_json: bool) -> None:
    """One call: its job, step, key, state, recorded outcome, settlement, parked letter."""

    async def go() -> review.CallView:
        async with opened_app(database_url) as app:
            calls = await review.ledger_db(app.ledger, app.db)
            return await review.show_call(
                app.db, calls, call_id, actor=Actor(default_actor(), "cli")
            )

    view = run(go())
    if as_json:
        emit_json(view.to_json())
        return
    c = view.call
    table = Table(title=f"call {c.id}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    settled = (
        f"{c.state} by {c.settled_by} at {show_time(c.settled_at)} UTC: {c.settled_reason}"
        if c.settled_at
        else "-"
    )
    for name, value in (
        ("job_id", c.job_id),
        ("queue / consumer", f"{c.queue} / {c.consumer}"),
        ("step", c.step),
        ("key", c.key),
        ("state", c.state),
        ("attempts", str(c.attempts)),
        ("intent at", f"{show_time(c.created_at)} UTC ({review.age_text(c.age_seconds)} ago)"),
        ("updated at", f"{show_time(c.updated_at)} UTC"),
        ("last error", c.last_error or "-"),
        ("reference", c.reference or "-"),
        ("settled", settled),
        ("partner", c.partner or "-"),
        ("parked as", f"dead letter {view.dead_letter_id}" if view.dead_letter_id else "-"),
    ):
        table.add_row(name, value)
    console.print(table)
    if view.outcome is not None:
        console.print("[bold]recorded outcome[/bold]:")
        console.print_json(data=view.outcome)
    if c.state == "in_doubt":
        console.print(
            f"settle it: jobfence calls settle {c.id} applied --reference REF --reason WHY "
            f"| jobfence calls settle {c.id} not_applied --reason WHY"
        )


@calls_group.command("settle")
@click.argument("call_id", type=click.IntRange(1))
@click.argument("outcome", type=click.Choice(review.SETTLEMENTS))
@click.option("--reference", help="applied: the downstream's reference (e.g. the order number).")
@click.option("--reason", required=True, help="What you checked downstream (required, audited).")
@database_option
@transport_option
@actor_option
@json_option
def settle_call(
    call_id: int,
    outcome: str,
    reference: str | None,
    reason: str,
    database_url: str | None,
    transport: str | None,
    actor: str,
    as_json: bool,
) -> None:
    """Settle an in-doubt call: ``applied`` (the downstream has the effect: give its
    --reference; the job goes on as if the call had answered) or ``not_applied`` (the job
    calls again, with the same key). The job's parked dead letter is replayed."""

    async def go() -> review.SettleResult:
        async with opened_app(database_url, transport) as app:
            return await review.settle_call(
                app.db,
                await review.ledger_db(app.ledger, app.db),
                app.transport,
                call_id,
                actor=Actor(actor, "cli"),
                outcome=outcome,
                reason=reason,
                reference=reference,
            )

    result = run(go())
    if as_json:
        emit_json(result.to_json())
        return
    ref = f" (reference {result.call.reference})" if result.call.reference else ""
    console.print(f"call {call_id}: settled as {result.call.state}{ref}")
    if result.replay is None:
        console.print(
            f"job {result.call.job_id} is not parked: it finds the settlement when it runs"
        )
    else:
        console.print(
            f"job {result.call.job_id}: dead letter {result.replay.dead_letter_id} replayed "
            f"({result.replay.outcome})"
        )
