"""A job looked up by its job_id — what people know — for the doors' show, cancel and
retry-now (issue 23): the queue row it is, or what became of it.

A job_id names a job across its whole life; the queue row id (``id`` in ``jobs list``) only
while it waits, runs or retries. :func:`find_job` answers the row id of the job with a
job_id (in ``queue`` when given). When no queued job has it, the :class:`NotFound` says what
became of it: **finished** (its fence row: which consumer processed it, and when — until the
fence expires), a **dead letter** (its id and review status), or neither (never enqueued, or
finished so long ago that its fence expired). Several queued jobs with the job_id (in
different queues, or enqueued twice) are an :class:`InvalidRequest` listing them: name the
queue or the row id.

Fences carry no partner: a partner-scoped actor is told only what its scope shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from ..db import Database, to_datetime
from ..errors import InvalidRequest, NotFound
from . import deadletters as dl
from .jobctl import JobFilter, list_jobs
from .validation import ALL_STATUSES

__all__ = ["Fence", "fences_of", "find_job"]

#: how many queued jobs, letters or fences a lookup lists in its answer
SHOWN = 5


@dataclass(frozen=True)
class Fence:
    """A fence row: ``consumer`` processed the job at ``processed_at``."""

    consumer: str
    processed_at: datetime
    expires_at: datetime


def _utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


async def fences_of(db: Database, job_id: str, consumers: list[str]) -> list[Fence]:
    """The fence rows of ``job_id`` among ``consumers`` (one primary-key probe each)."""
    if not consumers:
        return []
    rows = await db.run("fence_find", {"job_id": job_id, "consumers": db.array(consumers)})
    found = []
    for r in rows:
        processed, expires = to_datetime(r["processed_at"]), to_datetime(r["expires_at"])
        assert processed is not None
        assert expires is not None
        found.append(Fence(r["consumer"], processed, expires))
    return found


async def find_job(
    db: Database,
    job_id: str,
    *,
    actor: dl.Actor,
    queue: str | None = None,
    consumers: Mapping[str, str] | None = None,
    queue_db: Database | None = None,
) -> int:
    """The queue row id of the job with ``job_id`` (in ``queue`` when given).

    ``consumers`` maps the app's queues to their consumer names (the fence's key; default:
    the queue's name), so that a finished job can be told apart from one never enqueued."""
    found = await list_jobs(
        queue_db or db, JobFilter(queue=queue, job_id=job_id), actor=actor, limit=SHOWN + 1
    )
    if len(found.items) == 1:
        return found.items[0].id
    if found.items:
        listed = ", ".join(f"#{j.id} in {j.queue} ({j.state})" for j in found.items[:SHOWN])
        more = " and more" if len(found.items) > SHOWN else ""
        raise InvalidRequest(
            f"job_id {job_id!r} matches several queued jobs: {listed}{more}; name its queue, "
            "or its row id (the id the jobs list shows)"
        )
    raise NotFound(await _gone(db, job_id, actor=actor, queue=queue, consumers=consumers or {}))


async def _gone(
    db: Database,
    job_id: str,
    *,
    actor: dl.Actor,
    queue: str | None,
    consumers: Mapping[str, str],
) -> str:
    """What became of a job_id no queued job has: finished, a dead letter, or unknown."""
    where = f" in queue {queue}" if queue else ""
    said = f"job {job_id!r}{where} is not in the queue (waiting, running or retrying)"
    letters = await dl.search(
        db, dl.Filter(queue=queue, job_id=job_id, status=ALL_STATUSES), actor=actor, limit=SHOWN
    )
    if actor.partner is None:
        names = [consumers.get(queue, queue)] if queue else sorted(set(consumers.values()))
        if not queue:
            names = sorted({*names, *(letter.consumer for letter in letters.items)})
        fences = await fences_of(db, job_id, names)
        if fences:
            done = "; ".join(
                f"consumer {f.consumer} processed it at {_utc(f.processed_at)} (its fence, kept "
                f"until {_utc(f.expires_at)})"
                for f in fences
            )
            said = f"job {job_id!r}{where} finished: {done}"
            if not letters.items:
                return said
    if letters.items:
        shown = ", ".join(
            f"{letter.id} ({letter.status}, {letter.error_category})" for letter in letters.items
        )
        return f"{said}; dead letter{'s' if len(letters.items) > 1 else ''}: {shown}"
    if actor.partner is None and not consumers and queue:
        return (
            f"{said}: no fence of a consumer named {queue} and no dead letter has it; if the "
            "queue's consumer has another name, name the app (whose consumers say so)"
        )
    if actor.partner is None and not consumers:
        return (
            f"{said}, and no dead letter has it; to see whether it finished, name its queue "
            "or the app (a fence is kept per consumer)"
        )
    return f"{said}: never enqueued, or finished before its fence expired; no dead letter has it"
