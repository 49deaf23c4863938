"""``jobfence schedules`` (the periodic jobs, their next and last runs) and ``jobfence
scheduler`` (the scheduler of an app's periodic jobs, alone)."""

from __future__ import annotations

from datetime import timedelta

import click
from rich.table import Table

from ..core.periodic import UNDECLARED_AFTER
from ..errors import ConfigurationError
from ..review.schedules import Schedule, list_schedules, prune_schedules
from ..runtime.scheduler import run_alone
from .common import (
    ENV_APP,
    Duration,
    console,
    database_option,
    database_url_option,
    emit_json,
    json_option,
    log_options,
    main_group,
    make_app,
    opened_app,
    run,
    show_time,
    transport_option,
)


@main_group.group("schedules", invoke_without_command=True)
@database_option
@json_option
@click.pass_context
def schedules(ctx: click.Context, database_url: str | None, as_json: bool) -> None:
    """The periodic jobs: name, cron, time zone, queue, the next run, and the last run with
    what became of it (with --app, also those no scheduler has stored yet). A schedule no
    running scheduler declares any more shows as "not declared since"; `schedules prune`
    removes such rows."""
    if ctx.invoked_subcommand is not None:
        return

    async def go() -> list[Schedule]:
        async with opened_app(database_url) as app:
            named = click.get_current_context().meta.get("jobfence.app")
            return await list_schedules(app.db, app.periodic_jobs if named else None)

    found = run(go())
    if as_json:
        for s in found:
            emit_json(s.as_dict())
        return
    if not found:
        console.print(
            "no periodic jobs (define them with app.periodic(...); docs/periodic-jobs.md)"
        )
        return
    table = Table(title="schedules (times in UTC)")
    for column in ("name", "cron", "tz", "queue", "missed", "next run", "last run", "outcome"):
        table.add_column(column, overflow="fold")
    for s in found:
        outcome = (s.last_outcome or "never").replace("_", " ")
        if s.dead_letter_id is not None and s.last_outcome == "dead_letter":
            outcome += f" #{s.dead_letter_id}"
        name = s.name if s.defined is not False else f"{s.name} (not in the app)"
        if s.undeclared:
            name += f" (not declared since {show_time(s.declared_at)})"
        table.add_row(
            name,
            s.cron,
            s.tz,
            s.queue,
            s.missed,
            show_time(s.next_run),
            show_time(s.last_slot if s.last_job_id else None),
            outcome,
        )
    console.print(table)


@schedules.command("prune")
@database_option
@click.option(
    "--older-than",
    type=Duration(minimum=UNDECLARED_AFTER),
    default="7d",
    show_default=True,
    help="Remove the rows of schedules no running scheduler declared for this long.",
)
@json_option
def prune(database_url: str | None, older_than: timedelta, as_json: bool) -> None:
    """Remove the rows of schedules no running scheduler declared for --older-than (a
    schedule removed from the code, or of an app no longer run). A schedule declared again
    afterwards starts afresh, from then."""

    parent = click.get_current_context().parent
    # `jobfence schedules --database-url X prune` means X as much as `schedules prune --…` does
    url = database_url or (parent.params.get("database_url") if parent else None)
    as_json = as_json or bool(parent and parent.params.get("as_json"))

    async def go() -> list[str]:
        async with opened_app(url) as app:
            return await prune_schedules(app.db, older_than)

    removed = run(go())
    if as_json:
        emit_json({"removed": removed})
        return
    if not removed:
        console.print("no schedule rows to remove")
        return
    console.print(f"removed {len(removed)} schedule row(s): {', '.join(removed)}")


@main_group.command("scheduler")
@click.argument("app_spec", metavar="APP", envvar=ENV_APP)
@database_url_option
@transport_option
@log_options
def scheduler(
    app_spec: str,
    database_url: str | None,
    transport: str | None,
    log_format: str,
    log_level: str,
) -> None:
    """Run the scheduler of APP's periodic jobs alone (no worker) until SIGTERM. Any number
    of schedulers (and workers, which run one each) make one run per tick."""
    from .. import logs

    logs.configure(log_level, log_format)
    app = make_app(database_url, transport, app_spec=app_spec, create=True, long_running=True)
    if not app.periodic_jobs:
        raise ConfigurationError(
            f"{app_spec} defines no periodic jobs: define them with app.periodic(...)"
        )

    async def go() -> None:
        try:
            await run_alone(app, install_signal_handlers=True)
        finally:
            await app.close()

    run(go())
