"""``/v1/audit``: who did what, when and why."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from ...db import Database
from ...review import deadletters as service
from ...review.validation import MAX_PAGE
from .. import models
from ..auth import Principal
from ..deps import DB, MAX_ID, VIEWER, actor_of

router = APIRouter(tags=["audit"])


@router.get("/v1/audit", response_model=models.AuditPage)
async def audit_log(
    who: Principal = VIEWER,
    dead_letter_id: int | None = Query(None, ge=1, le=MAX_ID),
    replay_id: int | None = Query(None, ge=1, le=MAX_ID),
    actor: str | None = None,
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    before: int | None = Query(None, ge=0, le=MAX_ID),
    db: Database = DB,
) -> Any:
    """Who did what, when and why — newest first."""
    page = await service.audit(
        db,
        actor=actor_of(who),
        dead_letter_id=dead_letter_id,
        replay_id=replay_id,
        by=actor,
        before=before,
        limit=limit,
    )
    return {
        "items": [models.AuditRow.of(e) for e in page.items],
        "next_cursor": page.next_cursor,
    }
