"""The outbox routes of the ops API (SPEC O2): list and show events, re-drive failed ones.

Mounted by the purchase-order service (and any ops app) with
``api.include_router(jobfence.outbox.ops_router())``. Authentication is
:func:`jobfence.ops.auth.require` against the opened jobfence ``Database`` at
``request.app.state.jobfence_db``: viewers read, operators re-drive. The outbox spans every
partner, so a token scoped to one partner gets 403 here. Each re-drive is audited.

(No ``from __future__ import annotations`` here: FastAPI reads these signatures at run time.)
"""

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field

from .. import outbox
from ..db import Database
from ..ops.auth import Principal, require


class RedriveBody(BaseModel):
    event_ids: list[str] | None = Field(
        default=None,
        max_length=10_000,
        description="Events to re-drive; omitted: every PUBLISH_FAILED_RETRY event (of queue).",
    )
    queue: str | None = Field(default=None, description="With no event_ids: only this queue.")
    reason: str = Field(min_length=1, max_length=2000, description="Why (kept in the audit).")


def _db(request: Request, principal: Principal) -> Database:
    if principal.partner is not None:
        raise HTTPException(
            403, "the outbox spans every partner: use a token without a partner scope"
        )
    db: Database = request.app.state.jobfence_db
    return db


def router() -> APIRouter:
    routes = APIRouter(prefix="/outbox", tags=["outbox"])

    @routes.get("/events")
    async def list_events(
        request: Request,
        state: str | None = Query(
            default=None, description="PENDING, PUBLISHED or PUBLISH_FAILED_RETRY"
        ),
        queue: str | None = Query(default=None),
        limit: int = Query(default=50, ge=1, le=500),
        principal: Principal = Depends(require("viewer")),
    ) -> dict[str, Any]:
        """Events newest first (no payloads) and the count per state."""
        if state is not None and state not in outbox.STATES:
            raise HTTPException(422, f"state must be one of {', '.join(outbox.STATES)}")
        db = _db(request, principal)
        events = await outbox.list_events(db, state=state, queue=queue, limit=limit)
        return {"counts": await outbox.counts(db), "events": [e.to_json() for e in events]}

    @routes.get("/events/{event_id}")
    async def get_event(
        request: Request,
        event_id: str,
        principal: Principal = Depends(require("viewer")),
    ) -> dict[str, Any]:
        """One event with the history of its attempts and re-drives."""
        event = await outbox.get_event(_db(request, principal), event_id)
        if event is None:
            raise HTTPException(404, "no such outbox event")
        return event.to_json()

    @routes.post("/events/redrive")
    async def redrive(
        request: Request,
        body: RedriveBody,
        principal: Principal = Depends(require("operator")),
    ) -> dict[str, Any]:
        """Put PUBLISH_FAILED_RETRY events back to PENDING with fresh attempts (audited)."""
        if not body.reason.strip():
            raise HTTPException(422, "a re-drive needs a reason")
        ids = await outbox.redrive(
            _db(request, principal),
            actor=principal.name,
            reason=body.reason,
            event_ids=body.event_ids,
            queue=body.queue,
            via="api",
        )
        return {"redriven": ids, "count": len(ids)}

    return routes
