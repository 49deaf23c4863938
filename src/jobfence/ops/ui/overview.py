"""The overview: per queue, what waits, runs, retries and failed; the last hour as a chart."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ... import jobctl
from ... import stats as counts
from ..deps import actor_of, jobfence_app
from .jobs import served
from .render import chart, page
from .session import User, signed_in

router = APIRouter()
SIGNED_IN: Any = Depends(signed_in)


async def _per_minute(db: Any, name: str, params: dict[str, Any]) -> dict[int, int]:
    rows = await db.run(name, params)
    return {int(r["ago"]): int(r["n"]) for r in rows if 0 <= int(r["ago"]) < 60}


@router.get("/ui/")
async def overview(request: Request, user: User = SIGNED_IN) -> Response:
    return page(request, "overview.html", user, **await overview_data(request, user))


@router.get("/ui/overview-panel")
async def overview_panel(request: Request, user: User = SIGNED_IN) -> Response:
    """The overview's content alone (htmx refreshes it every few seconds)."""
    return page(request, "_overview_panel.html", user, **await overview_data(request, user))


async def overview_data(request: Request, user: User) -> dict[str, Any]:
    jf = jobfence_app(request)
    actor = actor_of(user.principal)
    qdb = jf.transport.queue_db
    found = await counts.stats(jf.db, actor=actor, jobs=False)  # jobs: list_queues
    letters: dict[str, dict[str, int]] = defaultdict(dict)
    for row in found.letters:
        if row["status"] == "pending_review":
            letters[row["queue"]][row["category"]] = row["letters"]
    known = served(jf)
    infos = (
        await jobctl.list_queues(jf.db, actor=actor, served=known, queue_db=qdb)
        if qdb is not None
        else [jobctl.QueueInfo(queue=q) for q in sorted(letters)]
    )
    unserved = (
        await jobctl.unserved_jobs(jf.db, known, actor=actor, queue_db=qdb)
        if known and qdb is not None
        else 0
    )
    scoped = user.principal.partner is not None
    done = {} if scoped else await _per_minute(jf.db, "console_done_per_minute", {})
    failed = await _per_minute(
        jf.db, "console_failed_per_minute", {"partner": user.principal.partner}
    )
    return {
        "queues": [(q, letters.get(q.queue, {})) for q in infos],
        "categories": sorted({c for per in letters.values() for c in per}),
        "depth_known": qdb is not None,
        "unserved": unserved,
        "chart": chart(done, failed, show_done=not scoped),
    }
