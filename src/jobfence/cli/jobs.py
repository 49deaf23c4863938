"""``jobfence migrate``, ``jobfence worker`` and ``jobfence enqueue``."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any, cast

import click

from ..app import App
from ..config import DEFAULT_BATCH_SIZE, DEFAULT_BATCH_WINDOW, MAX_BATCH_SIZE, check_schema_name
from ..core.jobs import check_job_id, check_priority, check_queue
from ..errors import DatabaseUnavailable
from ..sql import DEFAULT_SCHEMA, Dialect
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
    metrics_options,
    queue_list,
    run,
    serve_probes,
    transport_option,
)


@main_group.command()
@database_option
@click.option(
    "--sql",
    "print_sql",
    is_flag=True,
    help="Print the migrations as one SQL script instead of applying them (for Alembic, "
    "Flyway, sqitch…); needs no database.",
)
@click.option(
    "--dialect",
    type=click.Choice(["postgresql", "sqlite"]),
    default=None,
    help="With --sql and no database: the SQL dialect to print (default: postgresql).",
)
@click.option(
    "--after",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="With --sql: only migrations after this schema version.",
)
@click.option(
    "--wait",
    type=Duration(minimum=timedelta(0)),
    default="0s",
    show_default=True,
    help="Wait up to this long for the database to accept connections (it is starting: a "
    "Kubernetes init container, a compose stack), then migrate; past it, fail.",
)
@json_option
def migrate(
    database_url: str | None,
    print_sql: bool,
    dialect: str | None,
    after: int,
    wait: timedelta,
    as_json: bool,
) -> None:
    """Create or upgrade jobfence's tables (idempotent), or print them as SQL (--sql)."""
    if print_sql:
        if wait:
            raise click.UsageError("--wait needs a database; --sql prints without one")
        click.echo(_migration_sql(database_url, dialect, after), nl=False)
        return
    if dialect is not None or after:
        raise click.UsageError("--dialect and --after go with --sql")
    app = make_app(database_url, create=True)
    applied = run(_migrate_when_reachable(app, wait))
    if as_json:
        emit_json({"database": app.url.display, "schema": app.url.schema, "applied": applied})
    elif applied:
        # one line however many (a deploy step's log is read by scripts): never wrapped
        versions = ", ".join(map(str, applied))
        console.print(f"applied migrations {versions} to {app.url.display}", soft_wrap=True)
    else:
        console.print(f"{app.url.display} is up to date", soft_wrap=True)


async def _migrate_when_reachable(app: App, wait: timedelta) -> list[int]:
    """``app.migrate()``, retried every 2 s while the database cannot be reached, for up to
    ``wait``; then the last DatabaseUnavailable stands (one line from main())."""
    import asyncio
    import time

    deadline = time.monotonic() + wait.total_seconds()
    told = False
    while True:
        try:
            return await app.migrate()
        except DatabaseUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if not told:
                click.echo(
                    f"waiting up to {wait.total_seconds():g} s for the database: {exc}", err=True
                )
                told = True
            await asyncio.sleep(min(2.0, left))


def _migration_sql(database_url: str | None, dialect: str | None, after: int) -> str:
    from ..config import env_schema
    from ..sql import migration_script

    ctx = click.get_current_context()
    if database_url or ctx.meta.get("jobfence.app"):
        url = make_app(database_url, create=True).url
        if dialect is not None and dialect != url.dialect:
            raise click.UsageError(f"--dialect {dialect} but the database is {url.dialect}")
        chosen: str = url.dialect
        schema = url.schema
    else:
        chosen = dialect or "postgresql"
        schema = ctx.meta.get("jobfence.schema") or env_schema()
        if chosen == "sqlite":
            schema = DEFAULT_SCHEMA
    return migration_script(cast(Dialect, chosen), check_schema_name(schema), after)


@main_group.command()
@click.argument("app_spec", metavar="APP", envvar=ENV_APP)
@database_url_option
@transport_option
@click.option(
    "--queues",
    "-q",
    envvar="JOBFENCE_QUEUES",
    show_envvar=True,
    help="Comma-separated queues to consume (default: all of APP's).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 1000),
    envvar="JOBFENCE_CONCURRENCY",
    show_envvar=True,
    default=10,
    show_default=True,
    help="Jobs processed at once.",
)
@metrics_options
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_BATCH_SIZE),
    envvar="JOBFENCE_BATCH_SIZE",
    show_envvar=True,
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Group commit: up to this many jobs per transaction, each in its own savepoint "
    "(PostgreSQL queue in the fence's database; consumers declared isolated=True excepted). "
    "1: one transaction per job.",
)
@click.option(
    "--batch-window",
    type=Duration(maximum=timedelta(seconds=60)),
    envvar="JOBFENCE_BATCH_WINDOW",
    show_envvar=True,
    default=f"{DEFAULT_BATCH_WINDOW * 1000:g}ms",
    show_default=True,
    help="Group commit without a backlog: ready jobs share a transaction while their handlers "
    "are expected to take no longer than this in a row (0: only under a backlog).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(0, 10_000),
    envvar="JOBFENCE_PREFETCH",
    show_envvar=True,
    default=None,
    help="Jobs claimed ahead of free slots (default: concurrency × batch size).",
)
@click.option(
    "--shutdown-grace",
    type=Duration(),
    envvar="JOBFENCE_SHUTDOWN_GRACE",
    show_envvar=True,
    default="30s",
    show_default=True,
    help="How long in-flight jobs get to finish after SIGTERM/SIGINT; a second signal cancels "
    "them at once (rolled back, redelivered).",
)
@click.option(
    "--summary-interval",
    type=Duration(),
    envvar="JOBFENCE_SUMMARY_INTERVAL",
    show_envvar=True,
    default="60s",
    show_default=True,
    help="Log an INFO summary (jobs/s, done, retries, dead letters, duplicates) this often "
    "(0: never).",
)
@click.option(
    "--scheduler/--no-scheduler",
    envvar="JOBFENCE_SCHEDULER",
    show_envvar=True,
    default=True,
    show_default=True,
    help="Also enqueue the ticks of APP's periodic jobs (any number of schedulers make one run "
    "per tick; docs/periodic-jobs.md).",
)
@log_options
def worker(
    app_spec: str,
    database_url: str | None,
    transport: str | None,
    queues: str | None,
    concurrency: int,
    metrics_port: int | None,
    metrics_host: str,
    liveness_timeout: timedelta,
    batch_size: int,
    batch_window: timedelta,
    prefetch: int | None,
    shutdown_grace: timedelta,
    summary_interval: timedelta,
    scheduler: bool,
    log_format: str,
    log_level: str,
) -> None:
    """Run a worker for APP (module:attribute, e.g. myapp:app) until SIGTERM."""
    from .. import logs

    logs.configure(log_level, log_format)
    app = make_app(database_url, transport, app_spec=app_spec, create=True, long_running=True)
    w = app.worker(
        queues=queue_list(queues),
        concurrency=concurrency,
        shutdown_grace=shutdown_grace.total_seconds(),
        prefetch=prefetch,
        batch_size=batch_size,
        batch_window=batch_window.total_seconds(),
        summary_interval=summary_interval.total_seconds(),
        scheduler=scheduler,
    )
    serve_probes(metrics_port, metrics_host, liveness_timeout)

    async def go() -> None:
        try:
            await w.run(install_signal_handlers=True)
        finally:
            await app.close()

    run(go())


@main_group.command()
@click.argument("queue")
@database_option
@transport_option
@click.option(
    "--payload",
    "-p",
    required=True,
    help="The job's payload as JSON, UTF-8 ('-' reads stdin); with --raw, any bytes.",
)
@click.option("--job-id", help="Idempotency key of the job (default: a new UUID).")
@click.option("--correlation-id", help="Carried through logs and dead letters.")
@click.option(
    "--delay",
    type=Duration(),
    default="0s",
    help="How long before it may run (30s, 5m, 2h; plain seconds).",
)
@click.option(
    "--priority",
    type=int,
    default=0,
    show_default=True,
    help="0 to 9, higher runs first (database queue; a broker without priorities refuses).",
)
@click.option(
    "--raw",
    is_flag=True,
    help="Enqueue the payload bytes as given, even if not JSON or not UTF-8.",
)
@json_option
def enqueue(
    queue: str,
    database_url: str | None,
    transport: str | None,
    payload: str,
    job_id: str | None,
    correlation_id: str | None,
    delay: timedelta,
    priority: int,
    raw: bool,
    as_json: bool,
) -> None:
    """Put one job on QUEUE (with --app, warns on stderr if none of its consumers serves
    QUEUE)."""

    # bytes end to end: stdin as bytes, argv back to the bytes it was given as (os.fsencode
    # undoes Python's surrogateescape decoding of argv)
    data = sys.stdin.buffer.read() if payload == "-" else os.fsencode(payload)
    value: Any
    if raw:
        value = data
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise click.BadParameter(
                f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}), and "
                "JSON must be UTF-8; pass --raw to enqueue the bytes as they are",
                param_hint="--payload",
            ) from None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(
                f"not valid JSON ({exc}); pass --raw to enqueue it as bytes anyway",
                param_hint="--payload",
            ) from None
    for name, check, value_given in (
        ("QUEUE", check_queue, queue),
        ("--job-id", check_job_id, job_id),
        ("--priority", check_priority, priority),
    ):
        if value_given is not None:
            try:
                check(value_given)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint=name) from None
    app = make_app(database_url, transport)

    async def go() -> str:
        async with app:
            return await app.enqueue(
                queue,
                value,
                job_id=job_id,
                correlation_id=correlation_id,
                delay=delay.total_seconds(),
                priority=priority,
            )

    found = run(go())
    unserved = unserved_warning(app, queue)
    if unserved:
        click.echo(unserved, err=True)
    if as_json:
        emit_json({"job_id": found, "queue": queue})
    else:
        console.print(found)


def unserved_warning(app: App, queue: str) -> str | None:
    """One line for stderr when ``app`` has consumers but none serves ``queue`` (a typo, or
    a queue another app serves): the job is enqueued all the same. An app without consumers
    (a producer) says nothing: it cannot know who serves what."""
    if not app.consumers or app.serves(queue):
        return None
    ctx = click.get_current_context(silent=True)
    name = (ctx.meta.get("jobfence.app") if ctx is not None else None) or "the app"
    return (
        f"warning: no consumer of {name} serves queue {queue!r} (it serves: "
        f"{', '.join(app.consumed_queues)}); the job waits until a worker for that queue runs"
    )
