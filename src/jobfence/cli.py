"""The ``jobfence`` command line.

Every command takes ``--database-url`` (or ``$JOBFENCE_DATABASE_URL``). Bad flags, bad URLs
and unreachable databases are reported in one line, never with a traceback.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from .config import DEFAULT_BATCH_WINDOW, ENV_DATABASE_URL, ENV_TRANSPORT_URL, MAX_BATCH_SIZE
from .errors import Category, JobfenceError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

console = Console()
err_console = Console(stderr=True)


def database_option(func: F) -> F:
    return click.option(
        "--database-url",
        envvar=ENV_DATABASE_URL,
        show_envvar=True,
        default=None,
        help="postgresql://… or sqlite:///file.db (default: sqlite:///jobfence.db).",
    )(func)


def transport_option(func: F) -> F:
    return click.option(
        "--transport",
        envvar=ENV_TRANSPORT_URL,
        show_envvar=True,
        default=None,
        help="Queue URL if not the database: amqp://…, nats://…, redis://…, pubsub://PROJECT, "
        "or another postgresql:// / sqlite:/// database. Fence and dead letters stay in "
        "--database-url.",
    )(func)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="jobfence")
def main_group() -> None:
    """jobfence: effectively-once job effects, retries and readable dead letters."""


@main_group.command()
@database_option
def migrate(database_url: str | None) -> None:
    """Create or upgrade jobfence's tables (idempotent)."""
    from .app import App

    app = App(database_url)
    applied = run(app.migrate())
    if applied:
        console.print(f"applied migrations {', '.join(map(str, applied))} to {app.url.display}")
    else:
        console.print(f"{app.url.display} is up to date")


def load_app(spec: str) -> Any:
    """Import ``module:attribute`` (the current directory is importable)."""
    from .app import App

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(
            f"{spec!r} is not MODULE:ATTRIBUTE, e.g. myapp:app", param_hint="APP"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise click.BadParameter(f"no module named {module_name!r}", param_hint="APP") from None
        raise
    try:
        app = getattr(module, attr)
    except AttributeError:
        raise click.BadParameter(
            f"module {module_name!r} has no attribute {attr!r}", param_hint="APP"
        ) from None
    if not isinstance(app, App):
        raise click.BadParameter(
            f"{spec} is a {type(app).__name__}, not a jobfence.App", param_hint="APP"
        )
    return app


def _queue_list(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [q.strip() for q in value.split(",") if q.strip()]


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
    from . import logs
    from .metrics import serve_metrics

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
    from .app import App

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


@main_group.group("dead-letters")
def dead_letters() -> None:
    """Read (and act on) dead letters."""


@dead_letters.command("list")
@database_option
@click.option(
    "--status",
    type=click.Choice(["pending_review", "replayed", "discarded", "all"]),
    default="pending_review",
    show_default=True,
)
@click.option("--queue", help="Only this queue.")
@click.option(
    "--category", type=click.Choice([c.value for c in Category]), help="Only this category."
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON lines for scripts.")
def list_dead_letters(
    database_url: str | None,
    status: str,
    queue: str | None,
    category: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List dead letters, newest first (no payloads; see `show`)."""
    from . import deadletters
    from .app import App

    app = App(database_url)

    async def go() -> list[Any]:
        async with app:
            return await deadletters.letters(
                app.db,
                status=None if status == "all" else status,
                queue=queue,
                category=category,
                limit=limit,
            )

    letters = run(go())
    if as_json:
        for letter in letters:
            click.echo(json.dumps(letter.summary(), ensure_ascii=False))
        return
    if not letters:
        console.print(f"no dead letters ({status}) in {app.url.display}")
        return
    table = Table(title=f"dead letters ({status}) — {app.url.display}")
    for column in ("id", "failed at", "queue", "job_id", "category", "attempts", "error", "status"):
        table.add_column(column, overflow="fold")
    for letter in letters:
        table.add_row(
            str(letter.id),
            letter.failed_at.strftime("%Y-%m-%d %H:%M:%S"),
            letter.queue,
            letter.job_id,
            letter.error_category,
            str(letter.attempts),
            letter.last_error[:120],
            letter.status,
        )
    console.print(table)


@main_group.group(invoke_without_command=True)
@database_option
@click.option(
    "--jobs",
    type=click.IntRange(10, 100_000),
    default=300,
    show_default=True,
    help="Distinct credit jobs (duplicates and failures come on top).",
)
@click.option("--concurrency", type=click.IntRange(1, 200), default=16, show_default=True)
@click.option("--keep", is_flag=True, help="Keep the temporary SQLite file and print its path.")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default="CRITICAL",
    show_default=True,
    help="Worker logs during the demo (the summary reports every outcome anyway).",
)
@click.pass_context
def demo(
    ctx: click.Context,
    database_url: str | None,
    jobs: int,
    concurrency: int,
    keep: bool,
    log_level: str,
) -> None:
    """Run the points-crediting demo (no server needed) and check its ledger.

    Without --database-url it runs on a temporary SQLite file, ignoring
    $JOBFENCE_DATABASE_URL so the demo never touches a real database by accident.

    `jobfence demo purchase-orders` runs the purchase-order service end to end instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    from . import logs
    from .demo import run_demo

    logs.configure(log_level)
    ok = run(run_demo(database_url, jobs=jobs, concurrency=concurrency, keep=keep, console=console))
    if not ok:
        raise SystemExit(1)


@demo.command("purchase-orders")
@click.option(
    "--database-url",
    default=None,
    help="A PostgreSQL database the demo may use (default: a temporary database created on "
    "postgresql://postgres@127.0.0.1:5432 and dropped afterwards).",
)
@click.option("--posts", type=click.IntRange(20, 100_000), default=300, show_default=True)
@click.option(
    "--repeat-keys",
    type=click.FloatRange(0, 0.9),
    default=0.2,
    show_default=True,
    help="Share of POSTs that repeat an earlier idempotency key (client retries).",
)
@click.option(
    "--repeat-references",
    type=click.FloatRange(0, 0.5),
    default=0.05,
    show_default=True,
    help="Share of POSTs that resend an already received document (new key).",
)
@click.option(
    "--transient",
    type=click.FloatRange(0, 0.9),
    default=0.1,
    show_default=True,
    help="Share of ERP calls failing transiently (503, 500 after creating, timeouts).",
)
@click.option(
    "--functional",
    type=click.FloatRange(0, 1),
    default=0.02,
    show_default=True,
    help="Share of requests the ERP rejects functionally (400) until the operator's fix.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary database and print its URL.")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default="CRITICAL",
    show_default=True,
)
@transport_option
def demo_purchase_orders(
    database_url: str | None,
    posts: int,
    repeat_keys: float,
    repeat_references: float,
    transient: float,
    functional: float,
    keep: bool,
    log_level: str,
    transport: str | None,
) -> None:
    """Run the purchase-order service end to end on loopback and prove no double order.

    Starts PostgreSQL database, ERP stand-in (its own process), API, worker and relay; sends
    POSTs with repeated keys and documents while the ERP fails; retries the failed requests as
    an operator; prints a summary with its checks.
    """
    from . import logs
    from .purchase_orders.demo import Scenario, run_demo

    logs.configure(log_level)
    scenario = Scenario(
        posts=posts,
        repeat_key_share=repeat_keys,
        repeat_reference_share=repeat_references,
        transient_share=transient,
        functional_share=functional,
        transport=transport,
    )
    ok = run(run_demo(database_url, scenario, keep=keep, console=console))
    if not ok:
        raise SystemExit(1)


def _extensions() -> None:
    """Commands contributed by other modules (each adds itself to ``main_group``)."""
    for name in EXTENSIONS:
        importlib.import_module(name)


#: Modules that register more commands on import.
EXTENSIONS: list[str] = [
    "jobfence.cli_outbox",
    "jobfence.cli_deadletters",
]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``jobfence`` console script."""
    _extensions()
    try:
        main_group.main(args=argv, prog_name="jobfence", standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        raise SystemExit(130) from None
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see: {exc.ctx.command_path} --help)"
        click.echo(f"jobfence: error: {exc.format_message()}{hint}", err=True)
        raise SystemExit(2) from None
    except click.ClickException as exc:
        click.echo(f"jobfence: error: {exc.format_message()}", err=True)
        raise SystemExit(exc.exit_code) from None
    except JobfenceError as exc:
        click.echo(f"jobfence: error: {exc}", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":  # pragma: no cover
    # `python -m jobfence.cli`: run the group of the importable module `jobfence.cli`, the
    # one that extension modules add their commands to (not this `__main__` copy's)
    from jobfence.cli import main as _main

    _main()
