"""``jobfence migrate``, ``jobfence worker`` and ``jobfence enqueue``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from ..app import App
from ..config import DEFAULT_BATCH_WINDOW, MAX_BATCH_SIZE
from ._common import (
    _queue_list,
    console,
    database_option,
    load_app,
    main_group,
    run,
    transport_option,
)


@main_group.command()
@database_option
def migrate(database_url: str | None) -> None:
    """Create or upgrade jobfence's tables (idempotent)."""

    app = App(database_url)
    applied = run(app.migrate())
    if applied:
        console.print(f"applied migrations {', '.join(map(str, applied))} to {app.url.display}")
    else:
        console.print(f"{app.url.display} is up to date")


@main_group.command()
@click.argument("app_spec", metavar="APP")
@database_option
@transport_option
@click.option("--queues", "-q", help="Comma-separated queues to consume (default: all of APP's).")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 1000),
    default=10,
    show_default=True,
    help="Jobs processed at once.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus /metrics on this port (127.0.0.1).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_BATCH_SIZE),
    default=1,
    show_default=True,
    help="Group commit: jobs per transaction, each in its own savepoint (PostgreSQL queue).",
)
@click.option(
    "--batch-window",
    type=click.FloatRange(0, 60),
    default=DEFAULT_BATCH_WINDOW,
    show_default=True,
    help="Group commit without a backlog: ready jobs share a transaction while their handlers "
    "are expected to take no longer than this many seconds in a row (0: only under a backlog).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(0, 10_000),
    default=None,
    help="Jobs claimed ahead of free slots (default: concurrency × batch size).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(0),
    default=30.0,
    show_default=True,
    help="Seconds in-flight jobs get to finish after SIGTERM.",
)
@click.option(
    "--log-format", type=click.Choice(["console", "json"]), default="console", show_default=True
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
def worker(
    app_spec: str,
    database_url: str | None,
    transport: str | None,
    queues: str | None,
    concurrency: int,
    metrics_port: int | None,
    batch_size: int,
    batch_window: float,
    prefetch: int | None,
    metrics_host: str,
    shutdown_grace: float,
    log_format: str,
    log_level: str,
) -> None:
    """Run a worker for APP (module:attribute, e.g. myapp:app) until SIGTERM."""
    from .. import logs
    from ..metrics import serve_metrics

    logs.configure(log_level, log_format)
    app = load_app(app_spec)
    if database_url:
        app.use_database(database_url)
    if transport:
        app.use_transport(transport)
    w = app.worker(
        queues=_queue_list(queues),
        concurrency=concurrency,
        shutdown_grace=shutdown_grace,
        prefetch=prefetch,
        batch_size=batch_size,
        batch_window=batch_window,
    )
    if metrics_port:
        try:
            serve_metrics(metrics_port, metrics_host)
        except OSError as exc:
            raise click.UsageError(
                f"cannot serve metrics on {metrics_host}:{metrics_port}: {exc}"
            ) from None

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
@click.option("--delay", type=click.FloatRange(0), default=0.0, help="Seconds before it may run.")
@click.option(
    "--raw",
    is_flag=True,
    help="Enqueue the payload bytes as given, even if not JSON or not UTF-8.",
)
def enqueue(
    queue: str,
    database_url: str | None,
    transport: str | None,
    payload: str,
    job_id: str | None,
    correlation_id: str | None,
    delay: float,
    raw: bool,
) -> None:
    """Put one job on QUEUE."""

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
    app = App(database_url, transport=transport)

    async def go() -> str:
        async with app:
            return await app.enqueue(
                queue, value, job_id=job_id, correlation_id=correlation_id, delay=delay
            )

    console.print(run(go()))
