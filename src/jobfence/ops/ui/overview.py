"""The overview: per queue, what waits, runs, retries and failed; the last hour as a chart.

Counting every job costs about half a second per million jobs (docs/benchmarks.md), so the
automatic refreshes (every 10 s, from every open tab) share one set of counts for
:attr:`Refreshes.reuse` seconds per partner scope; opening the page always counts afresh."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ...review import jobctl
from ...review import stats as counts
from ..deps import jobfence_app
from .jobs import served
from .render import chart, page
from .session import User, actor_of, signed_in

router = APIRouter()
SIGNED_IN: Any = Depends(signed_in)


async def _per_minute(db: Any, name: str, params: dict[str, Any]) -> dict[int, int]:
    rows = await db.run(name, params)
    return {int(r["ago"]): int(r["n"]) for r in rows if 0 <= int(r["ago"]) < 60}


@router.get("/ui/")
async def overview(request: Request, user: User = SIGNED_IN) -> Response:
    data = await overview_data(request, user)
    request.app.state.ui_refreshes.kept[user.principal.partner] = (
        time.monotonic(),
        data,
    )
    return page(request, "overview.html", user, **data)


@dataclass
class Refreshes:
    """Overview data recently counted, by partner scope (``app.state.ui_refreshes``)."""

    reuse: float = 5.0
    kept: dict[str | None, tuple[float, dict[str, Any]]] = field(default_factory=dict)


@router.get("/ui/overview-panel")
async def overview_panel(request: Request, user: User = SIGNED_IN) -> Response:
    """The overview's content alone (htmx refreshes it every 10 s)."""
    cache: Refreshes = request.app.state.ui_refreshes
    key = user.principal.partner
    now = time.monotonic()
    hit = cache.kept.get(key)
    if hit is None or now - hit[0] >= cache.reuse:
        hit = (now, await overview_data(request, user))
        cache.kept[key] = hit
    return page(request, "_overview_panel.html", user, **hit[1])


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
    unserved = jobctl.unserved_among(infos)  # from the counts above: jobs counted once
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
