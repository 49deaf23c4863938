"""Counts for operators, read from the database: dead letters by queue, category and status,
each queue's backlog (a queue nobody serves shows here), and the Prometheus gauges fed from
the same queries (SPEC K1). The CLI's ``dead-letters stats`` and the ops API's ``/v1/stats``
and ``/metrics`` read them here."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from .db import Database
from .deadletters import Actor


@dataclass(frozen=True)
class Stats:
    letters: list[dict[str, Any]]  # queue, category, status, letters
    queue_depth: list[dict[str, Any]] | None = field(default=None)  # None for partner scopes
    #: per queue with jobs: waiting, running, oldest_waiting_s and served (whether one of the
    #: app's consumers serves it; None when the app names no consumers); None for partners
    queues: list[dict[str, Any]] | None = field(default=None)

    @property
    def unserved(self) -> list[str]:
        """Queues with waiting jobs that no consumer of the app serves."""
        return [q["queue"] for q in self.queues or () if q["served"] is False and q["waiting"]]


async def stats(
    db: Database,
    *,
    actor: Actor,
    queue_db: Database | None = None,
    served: Collection[str] = (),
    jobs: bool = True,
) -> Stats:
    """Letters by queue, category and status; for unscoped callers the queue depth, and each
    queue's backlog, marked by whether a queue in ``served`` (the app's consumers' queues;
    empty: not known) covers it, so a queue nobody consumes shows. ``jobs=False``: the letters
    only (the console counts jobs with :func:`jobfence.jobctl.list_queues`)."""
    rows = await db.run("dl_stats", {"partner": actor.partner})
    letters = [{**r, "letters": int(r["letters"])} for r in rows]
    if actor.partner is not None or not jobs:
        return Stats(letters)
    source = queue_db or db
    depth = await source.run("queue_depth")
    backlog = [
        {
            "queue": r["queue"],
            "waiting": int(r["waiting"] or 0),
            "running": int(r["running"] or 0),
            "oldest_waiting_s": (
                None if r["oldest_waiting_s"] is None else round(float(r["oldest_waiting_s"]), 3)
            ),
            "served": (r["queue"] in served) if served else None,
        }
        for r in await source.run("queue_backlog")
    ]
    return Stats(letters, [{**r, "jobs": int(r["jobs"])} for r in depth], backlog)


async def refresh_gauges(db: Database, queue_db: Database | None = None) -> None:
    """Set the pending-review, queue-depth, paused-queue and undelivered-alert gauges
    (SPEC K1; pauses: issue 14 §2)."""
    from .metrics import ALERTS_UNDELIVERED, PENDING_REVIEW, QUEUE_DEPTH, QUEUE_PAUSED

    pending = await db.run("dl_pending_counts")
    depth = await (queue_db or db).run("queue_depth")
    paused = await (queue_db or db).run("queue_pauses")
    undelivered = await db.run("alerts_undelivered")
    PENDING_REVIEW.clear()
    for row in pending:
        PENDING_REVIEW.labels(row["queue"], row["category"]).set(int(row["letters"]))
    QUEUE_DEPTH.clear()
    for row in depth:
        QUEUE_DEPTH.labels(row["queue"], row["state"]).set(int(row["jobs"]))
    QUEUE_PAUSED.clear()
    for row in paused:
        QUEUE_PAUSED.labels(row["queue"]).set(1)
    ALERTS_UNDELIVERED.set(int(undelivered[0]["deliveries"]))
