"""The periodic jobs as operators see them (``jobfence schedules``, ``GET /v1/schedules``, the
console's Schedules page): each schedule's definition, its next tick, and its last tick
enqueued with what became of it.

The definitions are read from the database (``core.schedules``, written by the schedulers),
so a command needs no app to list them; with the app, schedules it defines that no scheduler
has stored yet are listed too (never run), and rows of schedules it no longer defines are
marked. Every running scheduler declares its schedules at its start and every
:data:`~jobfence.core.periodic.DECLARE_EVERY` (``defined_at``): a schedule not declared for
:data:`~jobfence.core.periodic.UNDECLARED_AFTER` is one no running app declares — removed
from the code, or its app stopped — and is listed as "not declared since" that time, without
an app named. Its row stays (its last tick, for the day it comes back) until
:func:`prune_schedules` removes the rows not declared for days.

The outcome of the last tick is what the database still knows: the job waiting,
running or retrying in the database queue, its fence (processed, until the fence expires),
or a dead letter; else ``unknown`` (on a broker while in flight, or finished longer ago than
the fence is kept).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from ..core.periodic import DECLARE_EVERY, UNDECLARED_AFTER, Missed, Periodic
from ..db import Database, to_datetime
from ..errors import ConfigurationError

__all__ = ["Schedule", "list_schedules", "prune_schedules"]


@dataclass(frozen=True)
class Schedule:
    """One periodic job: its definition, next tick and last tick."""

    name: str
    cron: str
    tz: str
    queue: str
    missed: str
    #: the next tick (UTC); None when the stored definition no longer parses
    next_run: datetime | None
    #: the tick the schedule is at (enqueued, or dropped by the missed-tick policy)
    last_slot: datetime | None
    #: the last tick enqueued: its job_id, when, and what became of it
    last_job_id: str | None
    last_enqueued_at: datetime | None
    #: waiting, running, retrying, processed, dead_letter, unknown; None: never enqueued
    last_outcome: str | None
    last_processed_at: datetime | None
    dead_letter_id: int | None
    #: when a scheduler first stored it (None: the app defines it, no scheduler ran yet)
    created_at: datetime | None
    #: whether the app named defines it (None: no app named)
    defined: bool | None
    #: when a running scheduler last declared it (None: never stored)
    declared_at: datetime | None = None
    #: not declared for UNDECLARED_AFTER: no running app declares it any more
    undeclared: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _outcome(row: Mapping[str, Any]) -> str | None:
    if row["last_job_id"] is None:
        return None
    queued = row["queued"]
    if queued:
        state, _, attempts = str(queued).partition(":")
        if state == "running":
            return "running"
        return "retrying" if attempts not in ("", "0") else "waiting"
    if row["processed_at"] is not None:
        return "processed"
    if row["dead_letter_id"] is not None:
        return "dead_letter"
    return "unknown"


def _next(row: Mapping[str, Any], after: datetime) -> datetime | None:
    """The next tick of a stored definition (None if it no longer parses)."""
    try:
        stored = Periodic(
            name=row["name"],
            cron=row["cron"],
            queue=row["queue"],
            tz=row["tz"],
            missed=cast(Missed, row["missed"]),
        )
    except ConfigurationError:
        return None
    return stored.next_slot(after)


async def list_schedules(
    db: Database, defined: Mapping[str, Periodic] | None = None
) -> list[Schedule]:
    """Every stored schedule (and, with ``defined``, the app's not stored yet), by name."""
    rows = await db.run("schedules_list")
    found: list[Schedule] = []
    now = datetime.now(tz=UTC)
    for row in rows:
        now = to_datetime(row["now"]) or now
        last_slot = to_datetime(row["last_slot"])
        after = max(now, last_slot) if last_slot else now
        declared_at = to_datetime(row["defined_at"])
        found.append(
            Schedule(
                name=row["name"],
                cron=row["cron"],
                tz=row["tz"],
                queue=row["queue"],
                missed=row["missed"],
                next_run=_next(row, after),
                last_slot=last_slot,
                last_job_id=row["last_job_id"],
                last_enqueued_at=to_datetime(row["last_enqueued_at"]),
                last_outcome=_outcome(row),
                last_processed_at=to_datetime(row["processed_at"]),
                dead_letter_id=(
                    int(row["dead_letter_id"]) if row["dead_letter_id"] is not None else None
                ),
                created_at=to_datetime(row["created_at"]),
                defined=None if defined is None else row["name"] in defined,
                declared_at=declared_at,
                undeclared=declared_at is not None and now - declared_at > UNDECLARED_AFTER,
            )
        )
    stored = {s.name for s in found}
    for p in (defined or {}).values():
        if p.name not in stored:
            found.append(
                Schedule(
                    name=p.name,
                    cron=p.cron,
                    tz=p.tz,
                    queue=p.queue,
                    missed=p.missed,
                    next_run=p.next_slot(now),
                    last_slot=None,
                    last_job_id=None,
                    last_enqueued_at=None,
                    last_outcome=None,
                    last_processed_at=None,
                    dead_letter_id=None,
                    created_at=None,
                    defined=True,
                )
            )
    return sorted(found, key=lambda s: s.name)


async def prune_schedules(db: Database, older_than: timedelta) -> list[str]:
    """Delete the rows of schedules no running scheduler declared for ``older_than`` (at
    least :data:`~jobfence.core.periodic.UNDECLARED_AFTER`, so a row a running scheduler still
    declares is never removed); return their names. A schedule declared again later starts
    afresh: it counts from then, and runs none of the ticks of its absence."""
    if not isinstance(older_than, timedelta) or older_than < UNDECLARED_AFTER:
        raise ConfigurationError(
            f"prune rows not declared for {_hours(UNDECLARED_AFTER)} or longer: running "
            f"schedulers declare theirs every {_hours(DECLARE_EVERY)}, so a younger row may "
            "be in use"
        )
    rows = await db.run("schedules_prune", {"seconds": older_than.total_seconds()})
    return sorted(row["name"] for row in rows)


def _hours(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours:g} hour{'' if hours == 1 else 's'}"
