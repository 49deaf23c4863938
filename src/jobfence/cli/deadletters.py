"""``jobfence dead-letters list|show|replay|discard|audit|stats|replay-report``: the CLI twins
of the ops API, thin over :mod:`jobfence.review.deadletters` and :mod:`jobfence.review.replays`.

Readable tables for people; ``--json`` for scripts. Actions are recorded in the audit log as
``--actor`` (default ``$JOBFENCE_ACTOR``, else ``user@host``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import NotFound, ReviewConflict
from ..review import deadletters as service
from ..review import letters, replays
from ..review.validation import checked_reason
from .common import (
    actor_option,
    confirm,
    console,
    database_option,
    dead_letters,
    default_actor,
    emit_json,
    err_console,
    json_option,
    letter_filter_options,
    limit_option,
    make_app,
    opened_app,
    print_attempts,
    run,
    show_time,
)
from .common import transport_option as _transport_option


@dead_letters.command("list")
@database_option
@click.option(
    "--status",
    type=click.Choice(["pending_review", "replayed", "discarded", "all"]),
    default="pending_review",
    show_default=True,
    help="Only letters with this review status (all: any).",
)
@letter_filter_options
@limit_option()
@json_option
def list_dead_letters(
    database_url: str | None,
    status: str,
    letter_filter: service.Filter,
    limit: int,
    as_json: bool,
) -> None:
    """List dead letters, newest first (no payloads; see `show`)."""
    app = make_app(database_url)
    flt = dataclasses.replace(letter_filter, status=status)

    async def go() -> list[letters.DeadLetter]:
        async with app:
            return await service.matching(
                app.db, flt, actor=service.Actor(default_actor(), "cli"), limit=limit
            )

    found = run(go())
    if as_json:
        for letter in found:
            data = letter.summary()
            del data["history"]  # a list does not read the attempts: see `show`
            click.echo(json.dumps(data, ensure_ascii=False))
        return
    if not found:
        console.print(f"no dead letters ({status}) in {app.url.display}")
        return
    table = Table(title=f"dead letters ({status}) — {app.url.display}")
    for column in (
        "id",
        "failed at",
        "queue",
        "job_id",
        "category",
        "attempts",
        "error",
        "status",
        "replay of",
    ):
        table.add_column(column, overflow="fold")
    for letter in found:
        table.add_row(
            str(letter.id),
            letter.failed_at.strftime("%Y-%m-%d %H:%M:%S"),
            letter.queue,
            letter.job_id,
            letter.error_category,
            str(letter.attempts),
            letter.last_error[:120],
            letter.status,
            str(letter.previous_id) if letter.previous_id else "-",
        )
    console.print(table)


# -- dead-letters show -------------------------------------------------------------------------


@dead_letters.command("show")
@click.argument("letter_id", type=int)
@database_option
@json_option
def show(letter_id: int, database_url: str | None, as_json: bool) -> None:
    """Everything about one dead letter: payload, attempts, error, chain, audit trail."""

    async def go() -> service.LetterView:
        async with opened_app(database_url) as app:
            return await service.show(
                app.db, letter_id, actor=service.Actor(default_actor(), "cli")
            )

    view = run(go())
    letter = view.letter
    if as_json:
        data = letter.summary()
        data["payload"] = letters.payload_view(letter.payload)
        data["followers"] = view.followers
        data["audit"] = [e.to_json() for e in view.audit]
        emit_json(data)
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
        (
            "enqueued / failed",
            f"{show_time(letter.enqueued_at)} / {show_time(letter.failed_at)} UTC",
        ),
        ("replay of", str(letter.previous_id) if letter.previous_id else "-"),
        ("failed again as", ", ".join(map(str, view.followers)) or "-"),
    ]
    if letter.status != "pending_review":
        rows.append(("reviewed", f"{letter.reviewed_by} at {show_time(letter.reviewed_at)} UTC"))
        rows.append(("reason", letter.review_reason or "-"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    print_attempts(letter.history)
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
            trail.add_row(
                show_time(entry.at), entry.actor, entry.via, entry.action, entry.reason or ""
            )
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
                show_time(row["failed_at"]),
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
        emit_json({**status.__dict__, "done": status.done})
        return
    table = Table(
        title=f"bulk replay {status.id}: {status.state}, {status.done} of {status.total} done"
    )
    table.add_column("outcome")
    table.add_column("letters", justify="right")
    for outcome in (*service.ITEM_OUTCOMES, "pending"):
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
@letter_filter_options
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
    letter_filter: service.Filter,
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
    filtered = not letter_filter.is_empty
    if resume_id is not None and (letter_ids or filtered or all_pending):
        raise click.UsageError("--resume takes no letter ids or filters")
    if len(letter_ids) == 1 and not filtered and not all_pending and resume_id is None:
        _replay_one(database_url, transport, letter_ids[0], who, reason, as_json)
        return
    if as_json and not yes:
        raise click.UsageError(
            "--json runs unattended: add --yes (and --expect N to pin the count)"
        )
    flt = dataclasses.replace(letter_filter, ids=letter_ids or None)

    async def go() -> replays.ReplayStatus | None:
        async with opened_app(database_url, transport) as app:
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
                        emit_json({"replay_id": resume, "total": 0, "counts": {}})
                    else:
                        console.print("nothing to replay: no pending letter matches")
                    return None
            replay_id = resume_id if resume_id is not None else preview.replay_id
            if expect is not None and expect != total:
                raise ReviewConflict(f"the snapshot has {total} letters, not the {expect} expected")
            if not yes:
                await confirm(question, declined="nothing was replayed")
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
                    reason=reason,
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
        async with opened_app(database_url, transport) as app:
            return await service.replay(app.db, app.transport, letter_id, actor=who, reason=reason)

    result = run(go())
    if as_json:
        emit_json(result.__dict__)
    elif result.outcome == "published":
        console.print(f"dead letter {letter_id}: republished with its job_id (outcome: published)")
    else:
        console.print(f"dead letter {letter_id}: {result.outcome} — {result.detail}")


@dead_letters.command("replay-report")
@click.argument("replay_id", type=int)
@database_option
@click.option(
    "--outcome",
    type=click.Choice(["pending", *service.ITEM_OUTCOMES]),
    help="Only items with this outcome.",
)
@limit_option()
@json_option
def replay_report(
    replay_id: int, database_url: str | None, outcome: str | None, limit: int, as_json: bool
) -> None:
    """A bulk replay's status and its per-item report."""
    who = service.Actor(default_actor(), "cli")

    async def go() -> tuple[replays.ReplayStatus, service.Page[dict[str, Any]]]:
        async with opened_app(database_url) as app:
            status = await replays.replay_status(app.db, replay_id, actor=who)
            items = await replays.replay_items(
                app.db, replay_id, actor=who, outcome=outcome, limit=limit
            )
            return status, items

    status, items = run(go())
    if as_json:
        for item in items.items:
            emit_json(item)
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


# -- dead-letters discard, audit ---------------------------------------------------------------


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
    checked_reason(reason, required=True)  # a blank reason is refused before anything happens

    async def go() -> list[tuple[int, str, str]]:
        results = []
        async with opened_app(database_url) as app:
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
            emit_json({"dead_letter_id": letter_id, "outcome": outcome, "detail": why or None})
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
@limit_option()
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
    who = service.Actor(default_actor(), "cli")

    async def go() -> service.Page[service.AuditEntry]:
        async with opened_app(database_url) as app:
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
            emit_json(entry.to_json())
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
            show_time(e.at),
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
