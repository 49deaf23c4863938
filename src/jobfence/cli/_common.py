"""What every ``jobfence`` command shares: the root group, the common options, the consoles,
and loading an app (``MODULE:ATTRIBUTE``)."""

from __future__ import annotations

import asyncio
import getpass
import importlib
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
from rich.console import Console

from .. import letters
from ..app import App
from ..config import ENV_DATABASE_URL, ENV_TRANSPORT_URL

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

console = Console()
err_console = Console(stderr=True)


class NotConfirmed(Exception):
    """The operator answered no at a confirmation: exit 1 with this one line (not 130, which
    says Ctrl-C)."""


async def confirm(question: str, *, declined: str) -> None:
    """Ask ``question``; raise :class:`NotConfirmed` (``declined`` names what was not done)
    unless the answer is yes. Ctrl-C or end of input at the prompt stays an abort (130)."""
    if not await asyncio.to_thread(click.confirm, question):
        raise NotConfirmed(f"not confirmed: {declined}")


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


def _queue_list(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [q.strip() for q in value.split(",") if q.strip()]


@main_group.group("dead-letters")
def dead_letters() -> None:
    """Read (and act on) dead letters."""


_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _span(text: str, what: str) -> timedelta:
    match = _SPAN.match(text)
    if not match:
        raise click.BadParameter(
            f"{text!r} is not a duration like 90s, 30m, 12h or 7d", param_hint=what
        )
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def _moment(text: str | None, what: str) -> datetime | None:
    """An ISO 8601 time (UTC if no zone) or a duration ago (``2h`` = two hours ago)."""
    if text is None:
        return None
    if _SPAN.match(text):
        return datetime.now(UTC) - _span(text, what)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither an ISO time (2024-05-01T10:00) nor a duration ago (2h)",
            param_hint=what,
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _default_actor() -> str:
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
        default=_default_actor,
        help="Who is acting, for the audit log (default: user@host).",
    )(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="JSON for scripts.")(func)


@asynccontextmanager
async def _opened(database_url: str | None, transport: str | None = None) -> AsyncIterator[App]:
    app = App(database_url, transport=transport)
    async with app:
        yield app


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, default=_default, ensure_ascii=False))


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return letters.payload_view(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _ts(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"
