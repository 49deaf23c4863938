"""``GET /v1/schedules``: the periodic jobs, their next run and their last run with what became
of it (the same listing as ``jobfence schedules`` and the console's Schedules page)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...app import App
from ...review.schedules import list_schedules
from .. import models
from ..auth import Principal
from ..deps import APP, VIEWER

router = APIRouter()


@router.get(
    "/v1/schedules",
    response_model=list[models.ScheduleView],
    tags=["schedules"],
    responses={403: {"model": models.Problem, "description": "A partner-scoped token."}},
)
async def schedules(who: Principal = VIEWER, jf: App = APP) -> Any:
    """Every periodic job: cron, time zone, queue, missed-tick policy, the next run and the
    last run (its job_id, when it was enqueued, and its outcome: waiting, running,
    retrying, processed, dead_letter or unknown; null when never run). Schedules the served
    app defines that no scheduler has stored yet are listed too. Unscoped tokens only."""
    if who.partner is not None:
        raise StarletteHTTPException(
            403, "schedules span every partner: read them with an unscoped token"
        )
    found = await list_schedules(jf.db, jf.periodic_jobs or None)
    return [s.as_dict() for s in found]
