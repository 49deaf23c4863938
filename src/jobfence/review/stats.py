"""Counts for operators, read from the database: dead letters by queue, category and status,
each queue's backlog (a queue nobody serves shows here), and the Prometheus gauges fed from
the same queries (SPEC K1). The CLI's ``dead-letters stats`` and the ops API's ``/v1/stats``
and ``/metrics`` read them here."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ..db import Database
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
    only (the console counts jobs with :func:`jobfence.review.jobctl.list_queues`)."""
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


async def refresh_gauges(
    db: Database, queue_db: Database | None = None, calls_db: Database | None = None
) -> None:
    """Set the database gauges (SPEC K1; docs/metrics.md): letters pending review, queue
    depth, the oldest due job's wait, paused queues, the outbox backlog, the fence
    table's size and undelivered alerts. Every query reads a backlog through a partial index
    or the catalogue; all are read before any gauge changes, so a scrape never sees half. The
    calls in doubt are read from ``calls_db``, the call ledger's database when it is open (on
    PostgreSQL by default ``db``: the ledger is a table of its schema). A
    query that fails (a role without a grant, say) leaves its gauges as they were and the
    others still refresh; the failures are raised together at the end."""
    from .. import metrics as m

    source = queue_db or db
    reads = {
        "dl_pending_counts": db,
        "queue_depth": source,
        "gauge_queue_lag": source,
        "queue_pauses": source,
        "gauge_outbox_backlog": db,
        "gauge_fences": db,
        "alerts_undelivered": db,
    }
    ledger = calls_db or (db if db.dialect == "postgresql" else None)
    if ledger is not None:
        reads["calls_open_gauges"] = ledger
    rows: dict[str, list[Any]] = {}
    failed: dict[str, BaseException] = {}
    for name, where in reads.items():
        try:
            rows[name] = await where.run(name)
        except Exception as exc:
            failed[name] = exc
    if "dl_pending_counts" in rows:
        m.PENDING_REVIEW.clear()
        for row in rows["dl_pending_counts"]:
            m.PENDING_REVIEW.labels(row["queue"], row["category"]).set(int(row["letters"]))
    if "queue_depth" in rows:
        m.QUEUE_DEPTH.clear()
        for row in rows["queue_depth"]:
            m.QUEUE_DEPTH.labels(row["queue"], row["state"]).set(int(row["jobs"]))
    if "gauge_queue_lag" in rows:
        m.QUEUE_OLDEST_DUE.clear()
        for row in rows["gauge_queue_lag"]:
            oldest = max(0.0, float(row["oldest_due_s"] or 0))
            m.QUEUE_OLDEST_DUE.labels(row["queue"]).set(oldest)
    if "queue_pauses" in rows:
        m.QUEUE_PAUSED.clear()
        for row in rows["queue_pauses"]:
            m.QUEUE_PAUSED.labels(row["queue"]).set(1)
    if "gauge_outbox_backlog" in rows:
        m.OUTBOX_BACKLOG.clear()
        m.OUTBOX_OLDEST_PENDING.clear()
        for row in rows["gauge_outbox_backlog"]:
            m.OUTBOX_BACKLOG.labels(row["queue"], row["state"]).set(int(row["events"]))
            if row["state"] == "PENDING":
                oldest = max(0.0, float(row["oldest_s"] or 0))
                m.OUTBOX_OLDEST_PENDING.labels(row["queue"]).set(oldest)
    if "gauge_fences" in rows:
        fences = rows["gauge_fences"][0]
        m.FENCES.set(int(fences["fences"]))
        if fences["bytes"] is not None:
            m.FENCE_BYTES.set(int(fences["bytes"]))
    if "alerts_undelivered" in rows:
        m.ALERTS_UNDELIVERED.set(int(rows["alerts_undelivered"][0]["deliveries"]))
    if "calls_open_gauges" in rows:
        m.CALLS_OPEN.clear()
        m.CALLS_OLDEST_OPEN.clear()
        for state in ("pending", "in_doubt"):  # both known, at zero when there is none
            m.CALLS_OPEN.labels(state).set(0)
            m.CALLS_OLDEST_OPEN.labels(state).set(0)
        for row in rows["calls_open_gauges"]:
            m.CALLS_OPEN.labels(row["state"]).set(int(row["calls"]))
            m.CALLS_OLDEST_OPEN.labels(row["state"]).set(max(0.0, float(row["oldest"] or 0)))
    if failed:
        raise GaugesFailed(failed)
    m.GAUGES_REFRESHED.set_to_current_time()


class GaugesFailed(Exception):
    """Some database gauges could not be read (the others were refreshed)."""

    def __init__(self, failed: dict[str, BaseException]) -> None:
        self.failed = failed
        what = "; ".join(f"{name}: {type(e).__name__}: {e}" for name, e in failed.items())
        super().__init__(f"{len(failed)} gauge queries failed ({what})")
