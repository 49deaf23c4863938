"""Bulk replay (SPEC D3): replay every pending letter a filter matches, safely.

It works on a fixed snapshot: :func:`preview_replay` stores the ids a filter matches (with
counts and a sample), :func:`start_replay` needs the operator to confirm that count, and
:func:`execute_replay` works through the snapshot in batches — rate-limited, with a progress
callback, recording an outcome per item. It is resumable and idempotent: only items without
an outcome are attempted, and only letters still pending are republished, so running it
again (or a new bulk replay over the same filter) republishes nothing twice. Each batch is
one transaction with :func:`jobfence.review.deadletters.republish`, like a single replay.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from ..core.leases import default_holder
from ..db import Database, Tx, to_datetime
from ..errors import InvalidRequest, NotFound, ReviewConflict
from ..transports import Transport
from .deadletters import (
    Actor,
    Filter,
    ItemResult,
    Page,
    lock_for_review,
    record,
    replay_outcomes,
    republish,
)
from .validation import checked_id, checked_limit, checked_reason, when_text

MAX_BULK = 100_000
PREVIEW_TTL = timedelta(hours=1)
RUNNER_LEASE = timedelta(seconds=60)
DEFAULT_BATCH = 500
BROKER_BATCH = 100  # payloads travel through Python when the queue is not in this database


@dataclass(frozen=True)
class ReplayPreview:
    """What a bulk replay will touch: the snapshot's size, a breakdown and a sample."""

    replay_id: int
    total: int
    expires_at: datetime
    filter: dict[str, Any]
    breakdown: list[dict[str, Any]]  # queue, category, letters, truncated, applied
    sample: list[dict[str, Any]]

    @property
    def already_applied(self) -> int:
        return sum(int(row["applied"]) for row in self.breakdown)

    @property
    def truncated(self) -> int:
        return sum(int(row["truncated"]) for row in self.breakdown)


@dataclass(frozen=True)
class ReplayStatus:
    id: int
    state: str  # previewed | running | done
    total: int
    counts: dict[str, int]  # outcome → items ("pending": not yet attempted)
    filter: dict[str, Any]
    partner: str | None
    created_by: str
    created_at: datetime
    expires_at: datetime
    confirmed_by: str | None
    confirmed_at: datetime | None
    finished_at: datetime | None
    runner: str | None = None
    runner_lost: bool = False

    @property
    def done(self) -> int:
        return self.total - self.counts.get("pending", 0)


async def _replay_batch(
    db: Database,
    transport: Transport,
    ids: Sequence[int],
    *,
    actor: Actor,
    reason: str | None,
    replay_id: int,
    runner: str,
) -> list[ItemResult]:
    """One batch of a bulk replay, in one transaction that also renews the runner's lease
    and records each item's outcome."""
    async with db.transaction() as tx:
        renewed = await tx.q(
            "replay_renew",
            {"id": replay_id, "runner": runner, "lease": RUNNER_LEASE.total_seconds()},
        )
        if not renewed:
            raise ReviewConflict(
                f"replay {replay_id} is no longer ours to run (another runner took it over)"
            )
        rows = await lock_for_review(db, tx, ids)
        results = replay_outcomes(rows, ids, actor)
        woke = await republish(
            db, tx, transport, results, actor=actor, reason=reason, replay_id=replay_id
        )
        groups: dict[tuple[str, str | None], list[int]] = {}
        for r in results:
            groups.setdefault((r.outcome, r.detail), []).append(r.dead_letter_id)
        for (outcome, note), letters in groups.items():
            await tx.q(
                "replay_items_done",
                {
                    "replay_id": replay_id,
                    "ids": db.array(letters),
                    "outcome": outcome,
                    "detail": note,
                },
            )
    if woke:
        transport.wake()  # local workers (SQLite has no notifications)
    return results


async def preview_replay(
    db: Database,
    flt: Filter,
    *,
    actor: Actor,
    all_pending: bool = False,
    sample: int = 10,
    expires_in: timedelta = PREVIEW_TTL,
    limit: int = MAX_BULK,
) -> ReplayPreview:
    """Snapshot the pending letters ``flt`` matches (the dry run of a bulk replay).

    Nothing is republished: this stores the exact ids, returns their count, a breakdown
    (with how many are already applied or truncated) and a sample. Run it with
    :func:`start_replay` + :func:`execute_replay` (or :func:`run_replay`) before it expires.
    """
    flt = replace(flt.check(), status=None)
    if flt.is_empty and not all_pending:
        raise InvalidRequest(
            "say which letters to replay: give a filter (queue, category, error text, time "
            "range, ids…), or ask for every pending letter explicitly (all_pending)"
        )
    if not 0 <= sample <= 100:
        raise InvalidRequest("sample must be between 0 and 100")
    criteria = flt.criteria() or {"all_pending": True}
    async with db.transaction() as tx:
        created = await tx.q(
            "replay_create",
            {
                "actor": actor.name,
                "partner": actor.partner,
                "filter": json.dumps(criteria),
                "expires_in": expires_in.total_seconds(),
            },
        )
        replay_id = int(created[0]["id"])
        await tx.q(
            "replay_snapshot",
            {**flt.params(db, actor.partner), "replay_id": replay_id, "limit": limit + 1},
        )
        total = int((await tx.q("replay_set_total", {"replay_id": replay_id}))[0]["total"])
        if total > limit:
            raise InvalidRequest(
                f"the filter matches more than {limit} pending letters; narrow it (for "
                "example with a time range) and replay in several steps"
            )
        breakdown = await _breakdown(tx, replay_id)
        samples = [
            {**r, "failed_at": to_datetime(r["failed_at"])}
            for r in await tx.q("replay_sample", {"replay_id": replay_id, "limit": sample})
        ]
        await record(
            tx,
            actor,
            "replay.preview",
            replay_id=replay_id,
            partner=actor.partner,
            details={"total": total, "filter": criteria},
            new_state="previewed",
        )
        status = await _replay_row(tx, replay_id)
    return ReplayPreview(
        replay_id=replay_id,
        total=total,
        expires_at=status["expires_at"],
        filter=criteria,
        breakdown=breakdown,
        sample=samples,
    )


async def _breakdown(tx: Tx, replay_id: int) -> list[dict[str, Any]]:
    return [
        {
            "queue": r["queue"],
            "category": r["category"],
            "letters": int(r["letters"]),
            "truncated": int(r["truncated"] or 0),
            "applied": int(r["applied"] or 0),
        }
        for r in await tx.q("replay_breakdown", {"replay_id": replay_id})
    ]


async def replay_breakdown(db: Database, replay_id: int, *, actor: Actor) -> list[dict[str, Any]]:
    """A replay's letters per queue and category, with how many are already applied (their
    job_id is fenced: marked replayed without a republish) or truncated (they stay pending),
    as the preview gave them — for a replay looked at again later (the console's page)."""
    await replay_status(db, replay_id, actor=actor)  # existence and scope
    async with db.transaction() as tx:
        return await _breakdown(tx, replay_id)


async def _replay_row(tx: Tx, replay_id: int) -> dict[str, Any]:
    rows = await tx.q("replay_get", {"id": replay_id})
    if not rows:
        raise NotFound(f"no replay {replay_id}")
    row = dict(rows[0])
    for key in ("created_at", "expires_at", "confirmed_at", "runner_until", "finished_at"):
        row[key] = to_datetime(row[key])
    if isinstance(row["filter"], str):
        row["filter"] = json.loads(row["filter"])
    return row


async def replay_status(db: Database, replay_id: int, *, actor: Actor) -> ReplayStatus:
    checked_id(replay_id, "the replay id")
    async with db.transaction() as tx:
        row = await _replay_row(tx, replay_id)
        if not actor.sees(row["partner"]):
            raise NotFound(f"no replay {replay_id}")
        counts = {
            r["outcome"]: int(r["items"]) for r in await tx.q("replay_counts", {"id": replay_id})
        }
    return ReplayStatus(
        id=int(row["id"]),
        state=row["state"],
        total=int(row["total"]),
        counts=counts,
        filter=row["filter"],
        partner=row["partner"],
        created_by=row["created_by"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        confirmed_by=row["confirmed_by"],
        confirmed_at=row["confirmed_at"],
        finished_at=row["finished_at"],
        runner=row["runner"],
        runner_lost=bool(row["runner_lost"]),
    )


async def replay_items(
    db: Database,
    replay_id: int,
    *,
    actor: Actor,
    outcome: str | None = None,
    after: int | None = None,
    limit: int = 100,
) -> Page[dict[str, Any]]:
    """The per-item report of a bulk replay (``outcome`` "pending": not yet attempted)."""
    await replay_status(db, replay_id, actor=actor)  # existence and scope
    if outcome is not None and outcome not in (
        "pending",
        "published",
        "already_applied",
        "not_pending",
        "truncated",
    ):
        raise InvalidRequest(f"unknown outcome {outcome!r}")
    rows = await db.run(
        "replay_items_list",
        {
            "id": replay_id,
            "outcome": outcome,
            "after": checked_id(after, "after (the cursor)", low=0),
            "limit": checked_limit(limit),
        },
    )
    items = [{**r, "done_at": to_datetime(r["done_at"])} for r in rows]
    cursor = int(items[-1]["dead_letter_id"]) if len(items) == limit else None
    return Page(items, cursor)


async def start_replay(
    db: Database, replay_id: int, *, actor: Actor, expected_total: int, runner: str
) -> ReplayStatus:
    """Confirm a previewed bulk replay (``expected_total`` must be the count the operator
    saw) and take it for ``runner``; also resumes one whose runner stopped."""
    checked_id(replay_id, "the replay id")
    async with db.transaction() as tx:
        row = await _replay_row(tx, replay_id)
        if not actor.sees(row["partner"]):
            raise NotFound(f"no replay {replay_id}")
        if row["state"] == "done":
            raise ReviewConflict(
                f"replay {replay_id} already finished at {when_text(row['finished_at'])}"
            )
        if row["state"] == "previewed" and row["expired"]:
            raise ReviewConflict(
                f"the preview of replay {replay_id} expired at {when_text(row['expires_at'])}; "
                "preview again to see what a replay would touch now"
            )
        if row["state"] == "running" and row["runner"] != runner and not row["runner_lost"]:
            raise ReviewConflict(
                f"replay {replay_id} is being run by {row['runner']} (until "
                f"{when_text(row['runner_until'])})"
            )
        if expected_total != int(row["total"]):
            raise ReviewConflict(
                f"replay {replay_id} covers {row['total']} letters but {expected_total} were "
                "confirmed; look at its preview again and confirm its count"
            )
        claimed = await tx.q(
            "replay_claim",
            {
                "id": replay_id,
                "actor": actor.name,
                "runner": runner,
                "lease": RUNNER_LEASE.total_seconds(),
            },
        )
        if not claimed:
            raise ReviewConflict(f"replay {replay_id} could not be started; look at its status")
        await record(
            tx,
            actor,
            "replay.start" if row["state"] == "previewed" else "replay.resume",
            replay_id=replay_id,
            partner=row["partner"],
            details={"total": int(row["total"]), "runner": runner},
            old_state=row["state"],
            new_state="running",
        )
    return await replay_status(db, replay_id, actor=actor)


Progress = Callable[[int, int], None]


def check_reason(reason: str | None) -> str | None:
    """A bulk replay's optional reason, cleaned (InvalidRequest if it is not text)."""
    return checked_reason(reason, required=False)


async def execute_replay(
    db: Database,
    transport: Transport,
    replay_id: int,
    *,
    actor: Actor,
    runner: str,
    rate: float | None = None,
    batch_size: int = DEFAULT_BATCH,
    on_progress: Progress | None = None,
    reason: str | None = None,
) -> ReplayStatus:
    """Work through a started replay's snapshot: at most ``rate`` letters per second (None:
    as fast as the database allows), ``on_progress(done, total)`` after each batch."""
    if rate is not None and rate <= 0:
        raise InvalidRequest("rate must be positive (letters per second), or None")
    if batch_size < 1:
        raise InvalidRequest("batch_size must be at least 1")
    status = await replay_status(db, replay_id, actor=actor)
    why = checked_reason(reason, required=False) or f"bulk replay {replay_id}"
    step = batch_size if rate is None else max(1, min(batch_size, int(rate)))
    if not transport.commits_with(db):
        step = min(step, BROKER_BATCH)
    done, total = status.done, status.total
    if on_progress is not None:
        on_progress(done, total)
    started, sent = time.monotonic(), 0
    while True:
        todo = await db.run("replay_todo", {"id": replay_id, "limit": step})
        if not todo:
            break
        ids = [int(r["id"]) for r in todo]
        await _replay_batch(
            db, transport, ids, actor=actor, reason=why, replay_id=replay_id, runner=runner
        )
        done, sent = done + len(ids), sent + len(ids)
        if on_progress is not None:
            on_progress(done, total)
        if rate is not None:
            ahead = started + sent / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)  # the rate limit
    async with db.transaction() as tx:
        if await tx.q("replay_finish", {"id": replay_id, "runner": runner}):
            counts = {
                r["outcome"]: int(r["items"])
                for r in await tx.q("replay_counts", {"id": replay_id})
            }
            await record(
                tx,
                actor,
                "replay.finish",
                replay_id=replay_id,
                partner=status.partner,
                details={"counts": counts},
                old_state="running",
                new_state="done",
            )
    return await replay_status(db, replay_id, actor=actor)


async def run_replay(
    db: Database,
    transport: Transport,
    replay_id: int,
    *,
    actor: Actor,
    expected_total: int,
    rate: float | None = None,
    batch_size: int = DEFAULT_BATCH,
    on_progress: Progress | None = None,
    runner: str | None = None,
    reason: str | None = None,
) -> ReplayStatus:
    """Confirm and run a previewed bulk replay to the end (what the CLI does); ``reason`` is
    kept on each letter and in the audit log (default: "bulk replay N")."""

    why = check_reason(reason)  # refused before the replay is started
    who = runner or default_holder()
    await start_replay(db, replay_id, actor=actor, expected_total=expected_total, runner=who)
    return await execute_replay(
        db,
        transport,
        replay_id,
        actor=actor,
        runner=who,
        rate=rate,
        batch_size=batch_size,
        on_progress=on_progress,
        reason=why,
    )
