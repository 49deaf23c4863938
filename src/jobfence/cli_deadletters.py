"""CLI twins of the ops API (thin over :mod:`jobfence.deadletters`), fence cleanup, the ops
server and its tokens, and alert delivery.

    jobfence dead-letters show|replay|discard|audit|stats|replay-report
    jobfence cleanup [--once]
    jobfence ops serve | ops token create|list|revoke
    jobfence alerts deliver [--once] | alerts list

Readable tables for people; ``--json`` for scripts. Actions are recorded in the audit log as
``--actor`` (default ``$JOBFENCE_ACTOR``, else ``user@host``).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import deadletters as service
from . import letters, replays
from .app import DEFAULT_LEASE, App
from .cli import console, database_option, dead_letters, err_console, main_group, run
from .cli import transport_option as _transport_option
from .errors import Category, NotFound, ReviewConflict
from .fence import exposure as fence_exposure
from .retry import DEFAULT_POLICY

F = TypeVar("F", bound=Callable[..., Any])

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


# -- dead-letters show -------------------------------------------------------------------------


@dead_letters.command("show")
@click.argument("letter_id", type=int)
@database_option
@json_option
def show(letter_id: int, database_url: str | None, as_json: bool) -> None:
    """Everything about one dead letter: payload, attempts, error, chain, audit trail."""

    async def go() -> service.LetterView:
        async with _opened(database_url) as app:
            return await service.show(
                app.db, letter_id, actor=service.Actor(_default_actor(), "cli")
            )

    view = run(go())
    letter = view.letter
    if as_json:
        data = letter.summary()
        data["payload"] = letters.payload_view(letter.payload)
        data["followers"] = view.followers
        data["audit"] = [e.to_json() for e in view.audit]
        _emit(data)
        return
    table = Table(title=f"dead letter {letter.id}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("status", letter.status),
        ("queue / consumer", f"{letter.queue} / {letter.consumer}"),
        ("job_id", letter.job_id),
        ("correlation_id", letter.correlation_id or "-"),
        ("partner", letter.partner or "-"),
        ("category", letter.error_category),
        ("error code", letter.error_code or "-"),
        ("last error", letter.last_error),
        ("attempts", str(letter.attempts)),
        ("enqueued / failed", f"{_ts(letter.enqueued_at)} / {_ts(letter.failed_at)} UTC"),
        ("replay of", str(letter.previous_id) if letter.previous_id else "-"),
        ("failed again as", ", ".join(map(str, view.followers)) or "-"),
    ]
    if letter.status != "pending_review":
        rows.append(("reviewed", f"{letter.reviewed_by} at {_ts(letter.reviewed_at)} UTC"))
        rows.append(("reason", letter.review_reason or "-"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    history = Table(title="attempts")
    for column in ("#", "at", "category", "error", "retry at"):
        history.add_column(column, overflow="fold")
    for attempt in letter.history:
        history.add_row(
            str(attempt.attempt),
            attempt.at,
            attempt.category,
            attempt.error,
            attempt.retry_at or "",
        )
    console.print(history)
    shown = letters.payload_view(letter.payload)
    size = f"{letter.payload_size} bytes" + (", truncated" if letter.payload_truncated else "")
    console.print(f"[bold]payload[/bold] ({shown['encoding']}, {size}):")
    text = shown["data"] or ""
    if shown["encoding"] == "utf-8":
        with contextlib.suppress(ValueError):
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    console.print(text, markup=False, highlight=False)
    if view.audit:
        trail = Table(title="audit")
        for column in ("at", "actor", "via", "action", "reason"):
            trail.add_column(column, overflow="fold")
        for entry in view.audit:
            trail.add_row(_ts(entry.at), entry.actor, entry.via, entry.action, entry.reason or "")
        console.print(trail)


# -- dead-letters replay -----------------------------------------------------------------------


def _preview_table(preview: replays.ReplayPreview) -> None:
    table = Table(title=f"bulk replay {preview.replay_id}: {preview.total} pending letters")
    for column in ("queue", "category", "letters", "already applied", "truncated"):
        table.add_column(column)
    for row in preview.breakdown:
        table.add_row(
            row["queue"],
            row["category"],
            str(row["letters"]),
            str(row["applied"]),
            str(row["truncated"]),
        )
    console.print(table)
    if preview.sample:
        sample = Table(title=f"sample ({len(preview.sample)} of {preview.total})")
        for column in ("id", "failed at", "queue", "job_id", "error"):
            sample.add_column(column, overflow="fold")
        for row in preview.sample:
            sample.add_row(
                str(row["id"]),
                _ts(row["failed_at"]),
                row["queue"],
                row["job_id"],
                row["last_error"][:100],
            )
        console.print(sample)
    if preview.already_applied:
        console.print(
            f"{preview.already_applied} of them were applied meanwhile (their job_id is fenced): "
            "they will be marked replayed without being republished."
        )
    if preview.truncated:
        console.print(
            f"{preview.truncated} have a truncated payload and cannot be replayed; they stay "
            "pending."
        )


def _report(status: replays.ReplayStatus, as_json: bool) -> None:
    if as_json:
        _emit({**status.__dict__, "done": status.done})
        return
    table = Table(
        title=f"bulk replay {status.id}: {status.state}, {status.done} of {status.total} done"
    )
    table.add_column("outcome")
    table.add_column("letters", justify="right")
    for outcome in ("published", "already_applied", "not_pending", "truncated", "pending"):
        if status.counts.get(outcome):
            table.add_row(outcome, str(status.counts[outcome]))
    console.print(table)
    if any(status.counts.get(k) for k in ("not_pending", "truncated")):
        console.print(
            f"per item: jobfence dead-letters replay-report {status.id} --outcome not_pending"
        )


def _progress_runner(as_json: bool) -> tuple[Progress | None, Callable[[int, int], None]]:
    if as_json:
        return None, lambda done, total: None
    progress = Progress(
        TextColumn("replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
    )
    task = progress.add_task("replay", total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


@dead_letters.command("replay")
@click.argument("letter_ids", nargs=-1, type=int)
@database_option
@_transport_option
@click.option("--queue", help="Only letters of this queue.")
@click.option("--consumer", help="Only letters of this consumer.")
@click.option(
    "--category", type=click.Choice([c.value for c in Category]), help="Only this category."
)
@click.option("--error", "error_text", help="Only letters whose error contains this (any case).")
@click.option("--job-id", help="Only letters of this job_id.")
@click.option("--since", help="Failed at or after: ISO time, or a duration ago (2h).")
@click.option("--until", help="Failed before: ISO time, or a duration ago.")
@click.option("--all-pending", is_flag=True, help="Every pending letter (no filter).")
@click.option("--resume", "resume_id", type=int, help="Run (or finish) an earlier bulk replay.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--expect", type=int, help="With --yes: refuse unless the snapshot has this many.")
@click.option(
    "--rate",
    type=click.FloatRange(0),
    default=500.0,
    show_default=True,
    help="Letters per second (0: no limit).",
)
@click.option("--reason", help="Why (kept on the letters and in the audit log).")
@actor_option
@json_option
def replay(
    letter_ids: tuple[int, ...],
    database_url: str | None,
    transport: str | None,
    queue: str | None,
    consumer: str | None,
    category: str | None,
    error_text: str | None,
    job_id: str | None,
    since: str | None,
    until: str | None,
    all_pending: bool,
    resume_id: int | None,
    yes: bool,
    expect: int | None,
    rate: float,
    reason: str | None,
    actor: str,
    as_json: bool,
) -> None:
    """Republish dead letters with their job_id, payload and correlation_id.

    One LETTER_ID replays that letter at once. Several ids, or a filter, make a bulk replay:
    it shows what it will touch (count, breakdown, sample), asks for confirmation, then works
    through that fixed snapshot at --rate letters per second and reports each outcome.
    """
    who = service.Actor(actor, "cli")
    filtered = any(
        v is not None for v in (queue, consumer, category, error_text, job_id, since, until)
    )
    if resume_id is not None and (letter_ids or filtered or all_pending):
        raise click.UsageError("--resume takes no letter ids or filters")
    if len(letter_ids) == 1 and not filtered and not all_pending and resume_id is None:
        _replay_one(database_url, transport, letter_ids[0], who, reason, as_json)
        return
    if as_json and not yes:
        raise click.UsageError(
            "--json runs unattended: add --yes (and --expect N to pin the count)"
        )
    flt = service.Filter(
        queue=queue,
        consumer=consumer,
        category=category,
        error=error_text,
        job_id=job_id,
        since=_moment(since, "--since"),
        until=_moment(until, "--until"),
        ids=letter_ids or None,
    )

    async def go() -> replays.ReplayStatus | None:
        async with _opened(database_url, transport) as app:
            if resume_id is not None:
                status = await replays.replay_status(app.db, resume_id, actor=who)
                if not as_json:
                    _report(status, False)
                total = status.total
                question = f"Run the rest of bulk replay {resume_id}?"
            else:
                preview = await replays.preview_replay(
                    app.db, flt, actor=who, all_pending=all_pending
                )
                if not as_json:
                    _preview_table(preview)
                total = preview.total
                resume = preview.replay_id
                question = f"Replay these {total} dead letters (snapshot {resume})?"
                if total == 0:
                    if as_json:
                        _emit({"replay_id": resume, "total": 0, "counts": {}})
                    else:
                        console.print("nothing to replay: no pending letter matches")
                    return None
            replay_id = resume_id if resume_id is not None else preview.replay_id
            if expect is not None and expect != total:
                raise ReviewConflict(f"the snapshot has {total} letters, not the {expect} expected")
            if not yes and not await asyncio.to_thread(click.confirm, question):
                raise click.exceptions.Abort
            progress, update = _progress_runner(as_json)
            with progress or contextlib.nullcontext():
                return await replays.run_replay(
                    app.db,
                    app.transport,
                    replay_id,
                    actor=who,
                    expected_total=total,
                    rate=rate or None,
                    on_progress=update,
                )

    status = run(go())
    if status is not None:
        _report(status, as_json)


def _replay_one(
    database_url: str | None,
    transport: str | None,
    letter_id: int,
    who: service.Actor,
    reason: str | None,
    as_json: bool,
) -> None:
    async def go() -> service.ItemResult:
        async with _opened(database_url, transport) as app:
            return await service.replay(app.db, app.transport, letter_id, actor=who, reason=reason)

    result = run(go())
    if as_json:
        _emit(result.__dict__)
    elif result.outcome == "published":
        console.print(f"dead letter {letter_id}: republished with its job_id (outcome: published)")
    else:
        console.print(f"dead letter {letter_id}: {result.outcome} — {result.detail}")


@dead_letters.command("replay-report")
@click.argument("replay_id", type=int)
@database_option
@click.option(
    "--outcome",
    type=click.Choice(["pending", "published", "already_applied", "not_pending", "truncated"]),
    help="Only items with this outcome.",
)
@click.option("--limit", type=click.IntRange(1, service.MAX_PAGE), default=50, show_default=True)
@json_option
def replay_report(
    replay_id: int, database_url: str | None, outcome: str | None, limit: int, as_json: bool
) -> None:
    """A bulk replay's status and its per-item report."""
    who = service.Actor(_default_actor(), "cli")

    async def go() -> tuple[replays.ReplayStatus, service.Page[dict[str, Any]]]:
        async with _opened(database_url) as app:
            status = await replays.replay_status(app.db, replay_id, actor=who)
            items = await replays.replay_items(
                app.db, replay_id, actor=who, outcome=outcome, limit=limit
            )
            return status, items

    status, items = run(go())
    if as_json:
        for item in items.items:
            _emit(item)
        return
    _report(status, False)
    table = Table(title="items")
    for column in ("letter", "outcome", "queue", "job_id", "detail"):
        table.add_column(column, overflow="fold")
    for item in items.items:
        table.add_row(
            str(item["dead_letter_id"]),
            item["outcome"],
            item["queue"],
            item["job_id"],
            item["detail"] or "",
        )
    console.print(table)


# -- dead-letters discard, audit, stats --------------------------------------------------------


@dead_letters.command("discard")
@click.argument("letter_ids", nargs=-1, type=int, required=True)
@database_option
@click.option("--reason", required=True, help="Why these letters need no replay (required).")
@actor_option
@json_option
def discard(
    letter_ids: tuple[int, ...], database_url: str | None, reason: str, actor: str, as_json: bool
) -> None:
    """Discard pending dead letters, saying why (the reason is kept and audited)."""
    who = service.Actor(actor, "cli")
    service._reason(reason, required=True)  # a blank reason is refused before anything happens

    async def go() -> list[tuple[int, str, str]]:
        results = []
        async with _opened(database_url) as app:
            for letter_id in letter_ids:
                try:
                    await service.discard(app.db, letter_id, actor=who, reason=reason)
                    results.append((letter_id, "discarded", ""))
                except (ReviewConflict, NotFound) as exc:
                    results.append((letter_id, "refused", str(exc)))
        return results

    results = run(go())
    for letter_id, outcome, why in results:
        if as_json:
            _emit({"dead_letter_id": letter_id, "outcome": outcome, "detail": why or None})
        elif outcome == "discarded":
            console.print(f"dead letter {letter_id}: discarded")
        else:
            err_console.print(f"dead letter {letter_id}: not discarded: {why}")
    if any(outcome != "discarded" for _, outcome, _ in results):
        raise SystemExit(1)


def _transition(entry: service.AuditEntry) -> str:
    if entry.old_state is None and entry.new_state is None:
        return ""
    return f"{entry.old_state or '∅'} → {entry.new_state or '∅'}"


@dead_letters.command("audit")
@database_option
@click.option("--dead-letter", "dead_letter_id", type=int, help="Only this letter.")
@click.option("--replay", "replay_id", type=int, help="Only this bulk replay.")
@click.option("--by", help="Only this actor.")
@click.option("--limit", type=click.IntRange(1, service.MAX_PAGE), default=50, show_default=True)
@json_option
def audit(
    database_url: str | None,
    dead_letter_id: int | None,
    replay_id: int | None,
    by: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """The audit log, newest first: who did what, when and why."""
    who = service.Actor(_default_actor(), "cli")

    async def go() -> service.Page[service.AuditEntry]:
        async with _opened(database_url) as app:
            return await service.audit(
                app.db,
                actor=who,
                dead_letter_id=dead_letter_id,
                replay_id=replay_id,
                by=by,
                limit=limit,
            )

    page = run(go())
    if as_json:
        for entry in page.items:
            _emit(entry.to_json())
        return
    if not page.items:
        console.print("the audit log has no matching entries")
        return
    table = Table(title="audit log")
    for column in (
        "id",
        "at (UTC)",
        "actor",
        "via",
        "action",
        "letter",
        "replay",
        "transition",
        "reason",
        "details",
    ):
        table.add_column(column, overflow="fold")
    for e in page.items:
        table.add_row(
            str(e.id),
            _ts(e.at),
            e.actor,
            e.via,
            e.action,
            str(e.dead_letter_id or ""),
            str(e.replay_id or ""),
            _transition(e),
            e.reason or "",
            json.dumps(e.details, ensure_ascii=False) if e.details else "",
        )
    console.print(table)


@dead_letters.command("stats")
@database_option
@json_option
def stats(database_url: str | None, as_json: bool) -> None:
    """Dead letters by queue, category and status, and the queue depth."""

    async def go() -> service.Stats:
        async with _opened(database_url) as app:
            return await service.stats(app.db, actor=service.Actor(_default_actor(), "cli"))

    found = run(go())
    if as_json:
        _emit({"letters": found.letters, "queue_depth": found.queue_depth})
        return
    table = Table(title="dead letters")
    for column in ("queue", "category", "status", "letters"):
        table.add_column(column)
    for row in found.letters:
        table.add_row(row["queue"], row["category"], row["status"], str(row["letters"]))
    console.print(table)
    if found.queue_depth:
        depth = Table(title="queue depth")
        for column in ("queue", "state", "jobs"):
            depth.add_column(column)
        for row in found.queue_depth:
            depth.add_row(row["queue"], row["state"], str(row["jobs"]))
        console.print(depth)


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
@click.option("--interval", default="5m", show_default=True, help="Time between passes.")
@click.option("--batch", type=click.IntRange(1, 100_000), default=5000, show_default=True)
@click.option(
    "--min-age",
    default=None,
    help="Never delete fences younger than this (default: the default retry window plus one "
    "lease per attempt, 18m30s).",
)
@json_option
def cleanup(
    database_url: str | None,
    once: bool,
    interval: str,
    batch: int,
    min_age: str | None,
    as_json: bool,
) -> None:
    """Delete expired fence rows in short batches (one cleaner at a time).

    A fence is kept while its job could still be delivered, while its job_id has a dead
    letter pending review (or replayed recently), or while that job is still retrying.
    """
    from .cleanup import cleanup_fences, cleanup_loop

    age = _span(min_age, "--min-age") if min_age else fence_exposure(DEFAULT_POLICY, DEFAULT_LEASE)
    every = _span(interval, "--interval")

    async def go() -> None:
        async with _opened(database_url) as app:
            if once:
                result = await cleanup_fences(app.db, min_age=age, batch=batch)
                if as_json:
                    _emit({**result.__dict__, "ran": result.ran})
                elif result.busy:
                    console.print(f"another cleaner is running ({result.busy}); nothing done")
                else:
                    console.print(
                        f"deleted {result.deleted} expired fences in {result.batches} batches, "
                        f"{result.seconds:.2f}s (longest batch "
                        f"{result.longest_batch * 1000:.0f} ms)"
                    )
                return
            stop = asyncio.Event()
            remove = _stop_on_signals(stop)
            try:
                console.print(f"cleaning expired fences every {interval}; SIGTERM stops")
                await cleanup_loop(app.db, min_age=age, interval=every, batch=batch, stop=stop)
            finally:
                remove()

    run(go())


# -- ops ---------------------------------------------------------------------------------------


@main_group.group("ops")
def ops_group() -> None:
    """The ops HTTP API and its access tokens."""


@ops_group.command("serve")
@database_option
@_transport_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8089, show_default=True)
@click.option(
    "--max-body",
    type=click.IntRange(1024),
    default=128 * 1024,
    show_default=True,
    help="Bytes; larger → 413.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
def ops_serve(
    database_url: str | None,
    transport: str | None,
    host: str,
    port: int,
    max_body: int,
    log_level: str,
) -> None:
    """Serve the ops HTTP API (OpenAPI at /openapi.json, with a token)."""
    import uvicorn

    from .ops.app import create_app

    api = create_app(database_url, transport=transport, max_body=max_body)
    server = uvicorn.Server(
        uvicorn.Config(api, host=host, port=port, log_level=log_level, lifespan="on")
    )
    run(server.serve())
    if not server.started:
        raise SystemExit(1)


@ops_group.group("token")
def token_group() -> None:
    """Bearer tokens for the ops API (stored hashed)."""


@token_group.command("create")
@database_option
@click.option("--name", required=True, help="Who the token is for (shown in the audit log).")
@click.option("--role", type=click.Choice(["viewer", "operator"]), required=True)
@click.option("--partner", help="Limit the token to this partner's dead letters.")
@click.option(
    "--expires-in", default="90d", show_default=True, help="e.g. 12h, 30d; 'never' for none."
)
@actor_option
def token_create(
    database_url: str | None, name: str, role: str, partner: str | None, expires_in: str, actor: str
) -> None:
    """Create a token and print it (only this once)."""
    from .ops.auth import create_token

    expiry = None if expires_in == "never" else _span(expires_in, "--expires-in")

    async def go() -> str:
        async with _opened(database_url) as app:
            token = await create_token(
                app.db, name=name, role=role, partner=partner, expires_in=expiry
            )
            async with app.db.transaction() as tx:
                await service.record(
                    tx,
                    service.Actor(actor, "cli"),
                    "ops.token.create",
                    partner=partner,
                    details={"name": name, "role": role, "expires_in": expires_in},
                    new_state="active",
                )
            return token

    token = run(go())
    if sys.stdout.isatty():
        err_console.print(f"token for {name} ({role}{', partner ' + partner if partner else ''}):")
    click.echo(token)


@token_group.command("list")
@database_option
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
@json_option
def token_list(database_url: str | None, include_revoked: bool, as_json: bool) -> None:
    """Tokens (never their secret)."""
    from .ops.auth import list_tokens

    async def go() -> list[dict[str, Any]]:
        async with _opened(database_url) as app:
            return await list_tokens(app.db, include_revoked=include_revoked)

    from .db import to_datetime

    tokens = [
        {**t, **{k: to_datetime(t[k]) for k in ("created_at", "expires_at", "revoked_at")}}
        for t in run(go())
    ]
    if as_json:
        for t in tokens:
            _emit(t)
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
            _ts(t["created_at"]),
            _ts(t["expires_at"]),
            _ts(t["revoked_at"]),
        )
    console.print(table)


@token_group.command("revoke")
@click.argument("name")
@database_option
@actor_option
def token_revoke(name: str, database_url: str | None, actor: str) -> None:
    """Revoke the active token called NAME."""
    from .ops.auth import revoke_token

    async def go() -> bool:
        async with _opened(database_url) as app:
            done = await revoke_token(app.db, name)
            if done:
                async with app.db.transaction() as tx:
                    await service.record(
                        tx,
                        service.Actor(actor, "cli"),
                        "ops.token.revoke",
                        details={"name": name},
                        old_state="active",
                        new_state="revoked",
                    )
            return done

    if not run(go()):
        raise click.UsageError(f"no active token named {name!r}")
    console.print(f"revoked {name}")


# -- alerts --------------------------------------------------------------------------------------


@main_group.group("alerts")
def alerts_group() -> None:
    """Alert delivery (BetterStack, webhook) and the latest alerts."""


@alerts_group.command("deliver")
@database_option
@click.option("--once", is_flag=True, help="One round, then exit.")
@click.option("--interval", default="5s", show_default=True)
@click.option("--window", default="5m", show_default=True, help="Grouping window.")
@json_option
def alerts_deliver(
    database_url: str | None, once: bool, interval: str, window: str, as_json: bool
) -> None:
    """Group new alert events and deliver due alerts to the sinks configured by environment
    (JOBFENCE_BETTERSTACK_TOKEN, JOBFENCE_ALERT_WEBHOOK_URL). Workers do this too."""
    from .alerts import AlertDispatcher, sinks_from_env

    sinks = sinks_from_env()
    grouping = _span(window, "--window")
    every = _span(interval, "--interval")

    async def go() -> None:
        async with _opened(database_url) as app:
            dispatcher = AlertDispatcher(app.db, sinks, window=grouping)
            if once:
                try:
                    result = await dispatcher.tick()
                finally:
                    await dispatcher.close()
                if as_json:
                    _emit(result.__dict__)
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
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@json_option
def alerts_list(database_url: str | None, limit: int, as_json: bool) -> None:
    """The latest alerts and where each was delivered."""
    from .alerts import recent_alerts
    from .db import to_datetime

    async def go() -> list[dict[str, Any]]:
        async with _opened(database_url) as app:
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
            _emit(row)
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
            _ts(r["delivered_at"]),
            str(r["attempts"] if r["attempts"] is not None else "-"),
            r["last_error"] or "",
        )
    console.print(table)
