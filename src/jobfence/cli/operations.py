"""``jobfence cleanup``, ``jobfence ops serve|token …`` and ``jobfence alerts deliver|list``:
the background duties and the ops server, run from the command line."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import click
from rich.table import Table

from ..app import DEFAULT_LEASE
from ..core.fence import exposure as fence_exposure
from ..core.retry import DEFAULT_POLICY
from ..errors import require_extra
from ..review import deadletters as service
from .common import (
    POSITIVE,
    Duration,
    actor_option,
    console,
    database_option,
    emit_json,
    err_console,
    json_option,
    limit_option,
    log_options,
    main_group,
    opened_app,
    run,
    show_time,
)
from .common import transport_option as _transport_option

# -- cleanup -------------------------------------------------------------------------------------


def _stop_on_signals(stop: asyncio.Event) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def remove() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    return remove


@main_group.command("cleanup")
@database_option
@click.option("--once", is_flag=True, help="One pass, then exit (default: every --interval).")
@click.option(
    "--interval", type=POSITIVE, default="5m", show_default=True, help="Time between passes."
)
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=5000,
    show_default=True,
    help="Fence rows deleted per short transaction.",
)
@click.option(
    "--min-age",
    type=Duration(),
    default=None,
    help="Never delete fences younger than this (default: the default retry window plus one "
    "lease per attempt, 18m30s).",
)
@json_option
@log_options
def cleanup(
    database_url: str | None,
    once: bool,
    interval: timedelta,
    batch: int,
    min_age: timedelta | None,
    as_json: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Delete expired fence rows in short batches (one cleaner at a time).

    A fence is kept while its job could still be delivered, while its job_id has a dead
    letter pending review (or replayed recently), or while that job is still retrying.
    Also removes the decided dead letters past the retention the database's owner set, if
    any (never a letter pending review).
    """
    from .. import logs
    from ..runtime.cleanup import cleanup_fences, cleanup_loop, expire_letters

    logs.configure(log_level, log_format)
    age = min_age if min_age is not None else fence_exposure(DEFAULT_POLICY, DEFAULT_LEASE)
    every = interval

    async def go() -> None:
        async with opened_app(database_url) as app:
            if once:
                result = await cleanup_fences(app.db, min_age=age, batch=batch)
                letters = await expire_letters(app.db, batch=batch) if result.ran else 0
                if as_json:
                    emit_json({**result.__dict__, "ran": result.ran, "letters_expired": letters})
                elif result.busy:
                    console.print(f"another cleaner is running ({result.busy}); nothing done")
                else:
                    days = f"{result.days} expired days dropped whole, " if result.days else ""
                    console.print(
                        f"deleted {result.deleted} expired fences ({days}{result.batches} "
                        f"batches), {result.seconds:.2f}s (longest transaction "
                        f"{result.longest_batch * 1000:.0f} ms)"
                    )
                    if letters:
                        console.print(
                            f"removed {letters} decided dead letters past the retention the "
                            "database's owner set"
                        )
                return
            stop = asyncio.Event()
            remove = _stop_on_signals(stop)
            try:
                console.print(f"cleaning expired fences every {every}; SIGTERM stops")
                await cleanup_loop(app.db, min_age=age, interval=every, batch=batch, stop=stop)
            finally:
                remove()

    run(go())


# -- ops ---------------------------------------------------------------------------------------


@main_group.group("ops")
def ops_group() -> None:
    """The ops HTTP API and its access tokens (pip install 'jobfence[ops]')."""


def _needs_ops(*modules: str) -> None:
    """One line naming the extra (no traceback) when jobfence[ops] is not installed."""
    require_extra("ops", click.get_current_context().command_path, "fastapi", *modules)


@ops_group.command("serve")
@database_option
@_transport_option
@click.option(
    "--host",
    envvar="JOBFENCE_OPS_HOST",
    show_envvar=True,
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0 in a container).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    envvar="JOBFENCE_OPS_PORT",
    show_envvar=True,
    default=8089,
    show_default=True,
    help="Port to listen on.",
)
@click.option(
    "--max-body",
    type=click.IntRange(1024),
    envvar="JOBFENCE_OPS_MAX_BODY",
    show_envvar=True,
    default=128 * 1024,
    show_default=True,
    help="Largest request body in bytes; larger → 413.",
)
@click.option(
    "--session-ttl",
    type=POSITIVE,
    envvar="JOBFENCE_OPS_SESSION_TTL",
    show_envvar=True,
    default="8h",
    show_default=True,
    help="How long a console sign-in lasts at most (it also ends after 1h idle, at "
    "sign-out, and when its token is revoked or expires).",
)
@log_options
def ops_serve(
    database_url: str | None,
    transport: str | None,
    host: str,
    port: int,
    max_body: int,
    session_ttl: timedelta,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the ops HTTP API (OpenAPI at /openapi.json, with a token) and the operators'
    console (open /ui/ in a browser and sign in with a token)."""
    _needs_ops("uvicorn")
    import uvicorn

    from .. import logs

    logs.configure(log_level, log_format)
    logs.adopt_loggers("uvicorn", "uvicorn.error", "uvicorn.access", level=log_level)

    from ..ops.app import create_app

    async def go() -> bool:
        # Open the App before uvicorn starts: an unreachable or unmigrated database is then
        # a JobfenceError (one line from main()), not a failed lifespan's traceback.
        # The lifespan closes it at shutdown (uvicorn re-raises SIGTERM after that).
        async with opened_app(database_url, transport, long_running=True) as app:
            api = create_app(
                max_body=max_body, jobfence_app=app, close_app=True, session_ttl=session_ttl
            )
            server = uvicorn.Server(
                uvicorn.Config(
                    api,
                    host=host,
                    port=port,
                    log_level=log_level.lower(),
                    log_config=None,
                    lifespan="on",
                )
            )
            await server.serve()
            return bool(server.started)

    if not run(go()):
        raise SystemExit(1)


@ops_group.group("token")
def token_group() -> None:
    """Bearer tokens for the ops API (stored hashed)."""


@token_group.command("create")
@database_option
@click.option("--name", required=True, help="Who the token is for (shown in the audit log).")
@click.option(
    "--role",
    type=click.Choice(["viewer", "operator"]),
    required=True,
    help="viewer reads; operator also replays, discards and re-drives.",
)
@click.option("--partner", help="Limit the token to this partner's dead letters.")
@click.option(
    "--expires-in",
    default="90d",
    show_default=True,
    help="How long it is valid (12h, 30d, …); 'never' for no expiry.",
)
@json_option
@actor_option
def token_create(
    database_url: str | None,
    name: str,
    role: str,
    partner: str | None,
    expires_in: str,
    as_json: bool,
    actor: str,
) -> None:
    """Create a token and print it (only this once)."""
    _needs_ops()
    from ..ops.auth import create_token

    expiry = None if expires_in == "never" else Duration().convert(expires_in, None, None)

    who = service.Actor(actor, "cli")

    async def go() -> str:
        async with opened_app(database_url) as app:
            return await create_token(
                app.db,
                name=name,
                role=role,
                partner=partner,
                expires_in=expiry,
                actor=who,
                expiry_as=expires_in,
            )

    token = run(go())
    if as_json:
        emit_json({"name": name, "role": role, "partner": partner, "token": token})
        return
    if sys.stdout.isatty():
        err_console.print(f"token for {name} ({role}{', partner ' + partner if partner else ''}):")
    click.echo(token)


@token_group.command("list")
@database_option
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
@json_option
def token_list(database_url: str | None, include_revoked: bool, as_json: bool) -> None:
    """Tokens (never their secret)."""
    _needs_ops()
    from ..ops.auth import list_tokens

    async def go() -> list[dict[str, Any]]:
        async with opened_app(database_url) as app:
            return await list_tokens(app.db, include_revoked=include_revoked)

    from ..db import to_datetime

    tokens = [
        {**t, **{k: to_datetime(t[k]) for k in ("created_at", "expires_at", "revoked_at")}}
        for t in run(go())
    ]
    if as_json:
        for t in tokens:
            emit_json(t)
        return
    table = Table(title="ops tokens")
    for column in ("id", "name", "role", "partner", "created", "expires", "revoked"):
        table.add_column(column)
    for t in tokens:
        table.add_row(
            str(t["id"]),
            t["name"],
            t["role"],
            t["partner"] or "-",
            show_time(t["created_at"]),
            show_time(t["expires_at"]),
            show_time(t["revoked_at"]),
        )
    console.print(table)


@token_group.command("revoke")
@click.argument("name")
@database_option
@actor_option
@json_option
def token_revoke(name: str, database_url: str | None, actor: str, as_json: bool) -> None:
    """Revoke the active token called NAME."""
    _needs_ops()
    from ..ops.auth import revoke_token

    who = service.Actor(actor, "cli")

    async def go() -> bool:
        async with opened_app(database_url) as app:
            return await revoke_token(app.db, name, actor=who)

    if not run(go()):
        raise click.UsageError(f"no active token named {name!r}")
    if as_json:
        emit_json({"name": name, "revoked": True})
    else:
        console.print(f"revoked {name}")


# -- alerts --------------------------------------------------------------------------------------


@main_group.group("alerts")
def alerts_group() -> None:
    """Alert delivery (BetterStack, webhook) and the latest alerts."""


@alerts_group.command("deliver")
@database_option
@click.option("--once", is_flag=True, help="One round, then exit.")
@click.option(
    "--interval", type=POSITIVE, default="5s", show_default=True, help="Time between rounds."
)
@click.option(
    "--window",
    type=POSITIVE,
    default="5m",
    show_default=True,
    help="Alert events this close together become one alert.",
)
@json_option
@log_options
def alerts_deliver(
    database_url: str | None,
    once: bool,
    interval: timedelta,
    window: timedelta,
    as_json: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Group new alert events and deliver due alerts to the sinks configured by environment
    (JOBFENCE_BETTERSTACK_TOKEN, JOBFENCE_ALERT_WEBHOOK_URL). Workers do this too."""
    from .. import logs
    from ..alerts import AlertDispatcher, sinks_from_env

    logs.configure(log_level, log_format)
    sinks = sinks_from_env()
    grouping = window
    every = interval

    async def go() -> None:
        async with opened_app(database_url) as app:
            dispatcher = AlertDispatcher(app.db, sinks, window=grouping)
            if once:
                try:
                    result = await dispatcher.tick()
                finally:
                    await dispatcher.close()
                if as_json:
                    emit_json(result.__dict__)
                else:
                    console.print(
                        f"grouped {result.events} events into {result.alerts} alerts; delivered "
                        f"{result.delivered}, failed {result.failed} (sinks: "
                        f"{', '.join(s.key for s in sinks) or 'none configured'})"
                    )
                return
            stop = asyncio.Event()
            remove = _stop_on_signals(stop)
            try:
                await dispatcher.run(interval=every, stop=stop)
            finally:
                remove()

    run(go())


@alerts_group.command("list")
@database_option
@limit_option(20)
@json_option
def alerts_list(database_url: str | None, limit: int, as_json: bool) -> None:
    """The latest alerts and where each was delivered."""
    from ..alerts import recent_alerts
    from ..db import to_datetime

    async def go() -> list[dict[str, Any]]:
        async with opened_app(database_url) as app:
            return await recent_alerts(app.db, limit)

    rows = run(go())
    times = (
        "created_at",
        "window_start",
        "window_end",
        "ready_at",
        "delivered_at",
        "next_attempt_at",
    )
    rows = [{**r, **{k: to_datetime(r[k]) for k in times}} for r in rows]
    if as_json:
        for row in rows:
            emit_json(row)
        return
    table = Table(title="alerts")
    for column in (
        "id",
        "kind",
        "queue",
        "category",
        "count",
        "sink",
        "delivered",
        "attempts",
        "last error",
    ):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["kind"],
            r["queue"],
            r["category"],
            str(r["count"]),
            r["sink"] or "-",
            show_time(r["delivered_at"]),
            str(r["attempts"] if r["attempts"] is not None else "-"),
            r["last_error"] or "",
        )
    console.print(table)
