"""The console's Schedules page: the periodic jobs, their next and last runs (the listing of
``jobfence schedules`` and ``GET /v1/schedules``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ...review.schedules import list_schedules
from ..deps import database, jobfence_app
from .render import page
from .session import Refused, User, signed_in

router = APIRouter()
SIGNED_IN: Any = Depends(signed_in)


@router.get("/ui/schedules")
async def schedules_page(request: Request, user: User = SIGNED_IN) -> Response:
    if user.scoped:
        raise Refused(403, "schedules span every partner: sign in with an unscoped token")
    defined = jobfence_app(request).periodic_jobs or None  # an app without any: not known
    found = await list_schedules(database(request), defined)
    return page(request, "schedules.html", user, schedules=found)
