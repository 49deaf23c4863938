"""``jobfence relay`` and ``jobfence outbox list|show|redrive|cleanup`` (SPEC O1–O3).

Thin over :mod:`jobfence.outbox`: the ops API routes call the same functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from .. import outbox
from ..errors import ReviewConflict
from ..outbox.relay import Relay
from .common import (
    ENV_APP,
    POSITIVE,
    actor_option,
    confirm,
    console,
    database_option,
    database_url_option,
    emit_json,
    err_console,
    json_option,
    limit_option,
    log_options,
    main_group,
    make_app,
    metrics_options,
    run,
    serve_probes,
    transport_option,
)


@main_group.command()
@click.argument("app_spec", metavar="[APP]", required=False, envvar=ENV_APP)
@database_url_option
@transport_option
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    envvar="JOBFENCE_RELAY_BATCH_SIZE",
    show_envvar=True,
    default=None,
    help="Events published per round (default: 1000 where one statement queues them into "
    "the same PostgreSQL database's job table, else 100).",
)
@click.option(
    "--poll-interval",
    type=POSITIVE,
    envvar="JOBFENCE_RELAY_POLL_INTERVAL",
    show_envvar=True,
    default=None,
    help="Polling fallback (default 5s on PostgreSQL, which also wakes on NOTIFY; 0.2s SQLite).",
)
@click.option(
    "--retention",
    type=POSITIVE,
    envvar="JOBFENCE_RELAY_RETENTION",
    show_envvar=True,
    default="7d",
    show_default=True,
    help="Published events older than this are deleted.",
)
@click.option(
    "--with-worker",
    is_flag=True,
    envvar="JOBFENCE_RELAY_WITH_WORKER",
    show_envvar=True,
    help="Also run APP's worker in this process (the relay embedded in a worker).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 1000),
    envvar="JOBFENCE_CONCURRENCY",
    show_envvar=True,
    default=10,
    show_default=True,
    help="With --with-worker: jobs the worker processes at once.",
)
@metrics_options
@log_options
def relay(
    app_spec: str | None,
    database_url: str | None,
    transport: str | None,
    batch_size: int | None,
    poll_interval: timedelta | None,
    retention: timedelta,
    with_worker: bool,
    concurrency: int,
    metrics_port: int | None,
    metrics_host: str,
    liveness_timeout: timedelta,
    log_level: str,
    log_format: str,
) -> None:
    """Publish outbox events to their queues until SIGTERM.

    APP (module:attribute) is optional: without it the relay publishes to --transport (or the
    database queue). Run several relays at once if you like; they share the work.
    """
    from .. import logs
    from ..app import App

    logs.configure(log_level, log_format)
    if with_worker and not app_spec:
        raise click.UsageError("--with-worker needs APP (module:attribute) to know the consumers")
    app: App = make_app(database_url, transport, app_spec=app_spec, create=True, long_running=True)
    the_relay = Relay(
        app,
        batch_size=batch_size,
        poll_interval=poll_interval.total_seconds() if poll_interval else None,
        retention=retention,
    )
    serve_probes(metrics_port, metrics_host, liveness_timeout)

    async def go() -> None:
        try:
            if not with_worker:
                await the_relay.run(install_signal_handlers=True)
                return
            worker = app.worker(concurrency=concurrency)
            task = the_relay.start()
            try:
                await worker.run(install_signal_handlers=True)
            finally:
                # a forced stop of the worker (a second signal) stops the relay now too
                await the_relay.stop(force=worker.forced)
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            await app.close()

    run(go())


@main_group.group("outbox")
def outbox_group() -> None:
    """Read the outbox and re-drive events that could not be published."""


def _open(database_url: str | None) -> Any:
    return make_app(database_url)


@outbox_group.command("list")
@database_option
@click.option(
    "--state",
    type=click.Choice([*outbox.STATES, "all"]),
    default="all",
    show_default=True,
    help="Only events in this state.",
)
@click.option("--queue", help="Only this queue.")
@limit_option()
@json_option
def list_events(
    database_url: str | None, state: str, queue: str | None, limit: int, as_json: bool
) -> None:
    """List outbox events, newest first, with counts per state."""
    app = _open(database_url)

    async def go() -> tuple[dict[str, int], list[outbox.EventSummary]]:
        async with app:
            found = await outbox.list_events(
                app.db, state=None if state == "all" else state, queue=queue, limit=limit
            )
            return await outbox.counts(app.db), found

    totals, events = run(go())
    if as_json:
        for event in events:
            click.echo(json.dumps(event.to_json(), ensure_ascii=False))
        return
    console.print(
        "outbox — "
        + ", ".join(f"{name}: {count}" for name, count in totals.items())
        + f" — {app.url.display}"
    )
    if not events:
        return
    table = Table()
    for column in ("event_id", "queue", "key", "state", "attempts", "created", "last error"):
        table.add_column(column, overflow="fold")
    for event in events:
        table.add_row(
            event.event_id,
            event.queue,
            event.ordering_key or "",
            event.state,
            str(event.attempts),
            event.created_at.strftime("%Y-%m-%d %H:%M:%S") if event.created_at else "",
            (event.last_error or "")[:100],
        )
    console.print(table)


@outbox_group.command("show")
@click.argument("event_id")
@database_option
@json_option
def show_event(event_id: str, database_url: str | None, as_json: bool) -> None:
    """Show one event with the history of its attempts and re-drives (as JSON; --json: on
    one line)."""
    app = _open(database_url)

    async def go() -> outbox.EventSummary | None:
        async with app:
            return await outbox.get_event(app.db, event_id)

    event = run(go())
    if event is None:
        raise click.ClickException(f"no outbox event {event_id!r} in {app.url.display}")
    click.echo(json.dumps(event.to_json(), ensure_ascii=False, indent=None if as_json else 2))


def _preview_table(preview: outbox.RedrivePreview, out: Console = console) -> None:
    """The preview of a bulk re-drive (on stderr with --json: stdout is for the JSON)."""
    where = f" in queue {preview.queue}" if preview.queue else ""
    out.print(f"outbox re-drive: {preview.total} PUBLISH_FAILED_RETRY event(s){where}")
    if not preview.total:
        return
    table = Table()
    table.add_column("queue", overflow="fold")
    table.add_column("events", justify="right")
    for queue, events in preview.queues.items():
        table.add_row(queue, str(events))
    out.print(table)
    if preview.sample:
        sample = Table(title=f"sample ({len(preview.sample)} of {preview.total}, newest first)")
        for column in ("event_id", "queue", "attempts", "last error"):
            sample.add_column(column, overflow="fold")
        for event in preview.sample:
            sample.add_row(
                event.event_id, event.queue, str(event.attempts), (event.last_error or "")[:100]
            )
        out.print(sample)


@outbox_group.command("redrive")
@click.argument("event_ids", nargs=-1)
@database_option
@click.option(
    "--all",
    "all_failed",
    is_flag=True,
    help="Every PUBLISH_FAILED_RETRY event: shows how many and asks first.",
)
@click.option("--queue", help="With --all: only this queue.")
@click.option("--yes", "-y", is_flag=True, help="With --all: do not ask for confirmation.")
@click.option("--expect", type=click.IntRange(0), help="With --all --yes: refuse unless N.")
@click.option("--reason", required=True, help="Why (kept in each event's history).")
@actor_option
@json_option
def redrive(
    event_ids: tuple[str, ...],
    database_url: str | None,
    all_failed: bool,
    queue: str | None,
    yes: bool,
    expect: int | None,
    reason: str,
    actor: str,
    as_json: bool,
) -> None:
    """Put PUBLISH_FAILED_RETRY events back to PENDING with fresh attempts.

    Name the events, or pass --all (optionally with --queue): it shows how many failed events
    there are (per queue, with a sample) and asks before it re-drives exactly that many
    (--yes skips the question; --expect N pins the count). Events in any other state are
    left alone, so repeating a re-drive does nothing twice.
    """
    if bool(event_ids) == all_failed:
        raise click.UsageError("name the events to re-drive, or pass --all (not both)")
    if queue and not all_failed:
        raise click.UsageError("--queue goes with --all")
    if (yes or expect is not None) and not all_failed:
        raise click.UsageError("--yes and --expect go with --all")
    if not reason.strip():
        raise click.UsageError("--reason must say why")
    app = _open(database_url)
    who = actor

    async def go() -> list[str] | None:
        async with app:
            if not all_failed:
                return await outbox.redrive(
                    app.db, actor=who, reason=reason, event_ids=list(event_ids), via="cli"
                )
            preview = await outbox.preview_redrive(app.db, queue=queue)
            _preview_table(preview, err_console if as_json else console)
            if preview.total == 0:
                return None
            if expect is not None and expect != preview.total:
                raise ReviewConflict(
                    f"{preview.total} events are PUBLISH_FAILED_RETRY"
                    + (f" in queue {queue!r}" if queue else "")
                    + f", not the {expect} expected; preview again (without --yes) to see them"
                )
            question = f"Re-drive these {preview.total} events?"
            if not yes:
                await confirm(question, declined="nothing was re-driven")
            return await outbox.redrive(
                app.db,
                actor=who,
                reason=reason,
                all_failed=True,
                queue=queue,
                expected_total=preview.total,
                via="cli",
            )

    done = run(go())
    missing = sorted(set(event_ids) - set(done or ()))
    if as_json:
        emit_json({"redriven": done or [], "not_redriven": missing})
        return
    if done is None:
        console.print("nothing to re-drive: no event is PUBLISH_FAILED_RETRY")
        return
    for event_id in done:
        click.echo(event_id)
    console.print(f"re-drove {len(done)} event(s)", style="bold")
    if missing:
        console.print(
            f"not re-driven (unknown, or not PUBLISH_FAILED_RETRY): {', '.join(missing)}",
            style="yellow",
        )


@outbox_group.command("cleanup")
@database_option
@click.option(
    "--retention",
    type=POSITIVE,
    default="7d",
    show_default=True,
    help="Delete published events older than this.",
)
@json_option
def cleanup(database_url: str | None, retention: timedelta, as_json: bool) -> None:
    """Delete published events older than the retention (relays also do this every minute)."""
    app = _open(database_url)

    async def go() -> int:
        async with app:
            return await outbox.cleanup(app.db, retention)

    deleted = run(go())
    if as_json:
        emit_json({"deleted": deleted, "retention_s": retention.total_seconds()})
    else:
        console.print(f"deleted {deleted} published event(s) older than {retention}")
