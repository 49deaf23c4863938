"""What every ``jobfence`` command shares: the root group, the common options, the consoles,
and loading an app (``MODULE:ATTRIBUTE``)."""

from __future__ import annotations

import asyncio
import functools
import getpass
import importlib
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from .. import logs
from ..app import App
from ..config import ENV_DATABASE_URL, ENV_SCHEMA, ENV_TRANSPORT_URL
from ..core.jobs import AttemptRecord
from ..review import letters

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: piped output (grep, a file, a test) is not squeezed into 80 columns: tables keep their
#: ids on one line; $COLUMNS still wins, and a terminal keeps its own width
_PIPED_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(width=_PIPED_WIDTH)
err_console = Console(stderr=True)


class NotConfirmed(Exception):
    """The operator answered no at a confirmation: exit 1 with this one line (not 130, which
    says Ctrl-C)."""


async def confirm(question: str, *, declined: str) -> None:
    """Ask ``question``; raise :class:`NotConfirmed` (``declined`` names what was not done)
    unless the answer is yes. Ctrl-C or end of input at the prompt stays an abort (130)."""
    if not await asyncio.to_thread(click.confirm, question):
        raise NotConfirmed(f"not confirmed: {declined}")


ENV_APP = "JOBFENCE_APP"

NO_DATABASE = (
    "no database given: pass --database-url (postgresql://… or sqlite:///file.db), set "
    f"{ENV_DATABASE_URL}, or name your app with --app myapp:app (or {ENV_APP}) to use its "
    "database"
)


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        ctx.meta[f"jobfence.{param.name}"] = value
    return value


def app_option(func: F) -> F:
    return click.option(
        "--app",
        "app",
        envvar=ENV_APP,
        show_envvar=True,
        default=None,
        expose_value=False,
        callback=_remember,
        metavar="MODULE:ATTR",
        help="Your jobfence.App (e.g. myapp:app): use its database, schema and transport.",
    )(func)


def schema_option(func: F) -> F:
    return click.option(
        "--schema",
        envvar=ENV_SCHEMA,
        show_envvar=True,
        default=None,
        expose_value=False,
        callback=_remember,
        help="PostgreSQL schema of jobfence's tables (default: core).",
    )(func)


def database_option(func: F) -> F:
    """``--database-url``, ``--schema`` and ``--app``: where the command's database is (see
    :func:`make_app`)."""
    return database_url_option(app_option(func))


def database_url_option(func: F) -> F:
    """``--database-url`` and ``--schema``, for commands whose APP is an argument."""
    func = schema_option(func)
    return click.option(
        "--database-url",
        envvar=ENV_DATABASE_URL,
        show_envvar=True,
        default=None,
        help="postgresql://… or sqlite:///file.db (default: --app's database).",
    )(func)


#: SQLite: how long a command that is not a long-running process (worker, relay, ops serve)
#: waits for the file's one write lock before it says, in one line, that it is locked
CLI_LOCK_TIMEOUT = 5.0


def make_app(
    database_url: str | None,
    transport: str | None = None,
    *,
    app_spec: str | None = None,
    create: bool = False,
    long_running: bool = False,
) -> App:
    """The App a command works on: ``--app`` (or the command's APP argument) with
    ``--database-url``/``--schema``/``--transport`` overriding what it says; else a bare App
    on ``--database-url``. With neither, one line naming the three ways to give a database:
    outside ``jobfence demo`` no command falls back to a SQLite file of its own. Unless
    ``create``, a SQLite file must already exist (a typo must not start an empty store).
    Unless ``long_running``, a write waits at most :data:`CLI_LOCK_TIMEOUT` for SQLite's write
    lock (a running job holds it), then fails in one line (never a traceback)."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    spec = app_spec or meta.get("jobfence.app")
    schema = meta.get("jobfence.schema")
    if spec:
        app: App = load_app(spec)
        app.use_database(database_url, schema=schema)
    elif database_url:
        app = App(database_url, schema=schema)
    else:
        raise click.UsageError(NO_DATABASE)
    if transport:
        app.use_transport(transport)
    if not long_running:
        app.lock_timeout = CLI_LOCK_TIMEOUT
    if not create and app.url.dialect == "sqlite" and not app.url.path.exists():
        raise click.ClickException(
            f"no SQLite database at {app.url.path} (from {app.url.display}); create it with "
            f"`jobfence migrate --database-url {app.url.display}`, or check the path"
        )
    return app


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
    """Run a command's coroutine. While it runs, ``kill -USR1 <pid>`` logs every task and
    where it waits (:func:`jobfence.logs.dump_tasks`): what a stuck process is stuck on."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGUSR1, logs.dump_tasks)
        except (ValueError, RuntimeError):  # not the main thread (a command run from a thread)
            return await coro
        try:
            return await coro
        finally:
            loop.remove_signal_handler(signal.SIGUSR1)

    return asyncio.run(main())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="jobfence")
def main_group() -> None:
    """jobfence: effectively-once job effects, retries and readable dead letters."""


def load_app(spec: str) -> Any:
    """Import ``module:attribute`` (the current directory is importable)."""
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


def queue_list(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [q.strip() for q in value.split(",") if q.strip()]


@main_group.group("dead-letters")
def dead_letters() -> None:
    """Read (and act on) dead letters."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
DURATION_HELP = "a duration: 250ms, 30s, 5m, 12h, 7d, or plain seconds"


def parse_duration(text: str) -> timedelta | None:
    """``30s``, ``5m``, ``7d``, ``250ms`` or plain seconds (``1.5``); None if not one."""
    match = _DURATION.match(text)
    if not match:
        return None
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


class Duration(click.ParamType[timedelta]):
    """The one duration grammar of every duration flag (``30s``, ``5m``, ``7d``, ``250ms``,
    plain seconds); the value is a ``timedelta`` at least ``minimum``."""

    name = "duration"

    def __init__(self, minimum: timedelta = timedelta(0), maximum: timedelta | None = None):
        self.minimum = minimum
        self.maximum = maximum

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> timedelta:
        if isinstance(value, timedelta):
            return value
        found = parse_duration(str(value))
        if found is None:
            self.fail(f"{value!r} is not {DURATION_HELP}", param, ctx)
        if found < self.minimum:
            self.fail(f"{value!r} is less than {_show(self.minimum)}", param, ctx)
        if self.maximum is not None and found > self.maximum:
            self.fail(f"{value!r} is more than {_show(self.maximum)}", param, ctx)
        return found


def _show(span: timedelta) -> str:
    seconds = span.total_seconds()
    return f"{seconds:g}s"


POSITIVE = Duration(minimum=timedelta(microseconds=1))


def parse_moment(text: str | None, what: str) -> datetime | None:
    """An ISO 8601 time (UTC if no zone) or a duration ago (``2h`` = two hours ago)."""
    if text is None:
        return None
    ago = parse_duration(text)
    if ago is not None:
        return datetime.now(UTC) - ago
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither an ISO time (2024-05-01T10:00) nor a duration ago (2h)",
            param_hint=what,
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


ENV_LOG_LEVEL = "JOBFENCE_LOG_LEVEL"
ENV_LOG_FORMAT = "JOBFENCE_LOG_FORMAT"


def log_options(func: F) -> F:
    """``--log-level`` and ``--log-format``, the same on every long-running command."""
    func = click.option(
        "--log-format",
        type=click.Choice(["console", "json"]),
        envvar=ENV_LOG_FORMAT,
        show_envvar=True,
        default="console",
        show_default=True,
        help="console (for people) or json (one object per line, for log shippers).",
    )(func)
    return click.option(
        "--log-level",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        envvar=ENV_LOG_LEVEL,
        show_envvar=True,
        default="INFO",
        show_default=True,
        help="Least severe level logged.",
    )(func)


def metrics_options(func: F) -> F:
    """``--metrics-port``, ``--metrics-host`` and ``--liveness-timeout`` of the long-running
    processes (worker, relay): /metrics, /livez and /readyz on one port."""
    func = click.option(
        "--liveness-timeout",
        type=Duration(minimum=timedelta(seconds=2)),
        envvar="JOBFENCE_LIVENESS_TIMEOUT",
        show_envvar=True,
        default="30s",
        show_default=True,
        help="/livez fails when the event loop has not ticked for this long (a stuck loop).",
    )(func)
    func = click.option(
        "--metrics-host",
        envvar="JOBFENCE_METRICS_HOST",
        show_envvar=True,
        default="127.0.0.1",
        show_default=True,
        help="Address /metrics, /livez and /readyz listen on (0.0.0.0 in a container).",
    )(func)
    return click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        envvar="JOBFENCE_METRICS_PORT",
        show_envvar=True,
        default=None,
        help="Serve Prometheus /metrics and the /livez and /readyz probes on this port "
        "(default: not served).",
    )(func)


def serve_probes(port: int | None, host: str, liveness_timeout: timedelta) -> None:
    """Start the metrics and health server (:func:`jobfence.runtime.health.serve`) when asked to."""
    if not port:
        return
    from ..runtime.health import serve

    try:
        serve(port, host, liveness_timeout=liveness_timeout.total_seconds())
    except OSError as exc:
        raise click.UsageError(f"cannot serve metrics on {host}:{port}: {exc}") from None


def limit_option(default: int = 50) -> Callable[[F], F]:
    """``--limit``: rows per page, capped as the ops API caps it (``MAX_PAGE``)."""
    from ..review.validation import MAX_PAGE

    return click.option(
        "--limit",
        type=click.IntRange(1, MAX_PAGE),
        default=default,
        show_default=True,
        help=f"Rows to show, at most {MAX_PAGE} (the ops API's page cap).",
    )


#: the criteria of ``--queue … --until`` (what the ops API's and the console's letter filter take)
LETTER_CRITERIA = ("queue", "consumer", "category", "error_text", "job_id", "since", "until")


def letter_filter_options(func: Callable[..., T]) -> Callable[..., T]:
    """Which dead letters, the same criteria on every command that takes a letter filter
    (``list``, ``replay``, ``discard-matching``; the ops API and the console take them too):
    ``--queue --consumer --category --error --job-id --since --until``. The command gets
    them as one ``letter_filter`` argument, a :class:`~jobfence.review.deadletters.Filter`."""
    from ..errors import Category
    from ..review.deadletters import Filter

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> T:
        given = {name: kwargs.pop(name) for name in LETTER_CRITERIA}
        kwargs["letter_filter"] = Filter(
            queue=given["queue"],
            consumer=given["consumer"],
            category=given["category"],
            error=given["error_text"],
            job_id=given["job_id"],
            since=parse_moment(given["since"], "--since"),
            until=parse_moment(given["until"], "--until"),
        )
        return func(*args, **kwargs)

    options = [
        click.option("--queue", help="Only letters of this queue."),
        click.option("--consumer", help="Only letters of this consumer."),
        click.option(
            "--category",
            type=click.Choice([c.value for c in Category]),
            help="Only this category.",
        ),
        click.option(
            "--error", "error_text", help="Only letters whose error contains this (any case)."
        ),
        click.option("--job-id", help="Only letters of this job_id."),
        click.option("--since", help="Failed at or after: ISO time, or a duration ago (2h)."),
        click.option("--until", help="Failed before: ISO time, or a duration ago."),
    ]
    decorated: Callable[..., T] = command
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def default_actor() -> str:
    """``$JOBFENCE_ACTOR``, else ``user@host``: who acts (or reads) for the audit log."""
    if os.environ.get("JOBFENCE_ACTOR"):
        return os.environ["JOBFENCE_ACTOR"]
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def actor_option(func: F) -> F:
    return click.option(
        "--actor",
        envvar="JOBFENCE_ACTOR",
        show_envvar=True,
        default=default_actor,
        help="Who is acting, for the audit log (default: user@host).",
    )(func)


def json_option(func: F) -> F:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="JSON for scripts: one object, or one object per line for a list.",
    )(func)


@asynccontextmanager
async def opened_app(
    database_url: str | None, transport: str | None = None, *, long_running: bool = False
) -> AsyncIterator[App]:
    app = make_app(database_url, transport, long_running=long_running)
    async with app:
        yield app


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, default=_default, ensure_ascii=False))


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return letters.payload_view(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def show_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def print_attempts(attempts: Sequence[AttemptRecord]) -> None:
    """The attempt history as a table, then each attempt's traceback (shown as text, never
    as markup)."""
    history = Table(title="attempts")
    for column in ("#", "at", "category", "error", "retry at"):
        history.add_column(column, overflow="fold")
    for attempt in attempts:
        history.add_row(
            str(attempt.attempt),
            attempt.at,
            attempt.category,
            attempt.error,
            attempt.retry_at or "",
        )
    console.print(history)
    for attempt in attempts:
        if attempt.trace:
            console.print(f"[bold]traceback of attempt {attempt.attempt}[/bold]:")
            console.print(attempt.trace, markup=False, highlight=False)
