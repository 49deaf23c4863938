"""The outbox routes of the ops API (SPEC O2): list and show events, re-drive failed ones.

Served by the ops API under ``/v1``; any FastAPI app can mount them too, with
``api.include_router(jobfence.ops.routes.outbox.router())`` (the purchase-order service
does). Authentication is :func:`jobfence.ops.auth.require` against the opened jobfence
``Database`` at ``request.app.state.jobfence_db``: viewers read, operators preview and
re-drive. The outbox spans every partner, so a token scoped to one partner gets 403 here.
Each re-drive is audited.

A re-drive is explicit: it names its events (``event_ids``), or asks for every failed event
(``all: true``, optionally of one ``queue``) with ``expected_total``, the count
``GET /outbox/events/redrive/preview`` showed. Unknown fields are refused (422), so a typo
such as ``event_id`` can never widen a re-drive to everything.

(No ``from __future__ import annotations`` here: FastAPI reads these signatures at run time.)
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ... import outbox
from ...db import Database
from ...errors import ConfigurationError, InvalidRequest, ReviewConflict
from ...review.validation import MAX_ID
from ..auth import Principal, require

MAX_EVENT_IDS = 10_000
EventId = Annotated[str, Field(min_length=1, max_length=outbox.MAX_KEY_LENGTH)]
QueueName = Annotated[str, Field(min_length=1, max_length=200)]


class RedriveBody(BaseModel):
    """Which failed events to put back to PENDING: named ones, or all (after a preview)."""

    model_config = ConfigDict(extra="forbid")

    event_ids: list[EventId] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_EVENT_IDS,
        description="Events to re-drive (only those in PUBLISH_FAILED_RETRY move).",
    )
    all_failed: bool = Field(
        default=False,
        alias="all",
        description="Every PUBLISH_FAILED_RETRY event (of `queue`): needs `expected_total`.",
    )
    queue: QueueName | None = Field(default=None, description="With `all`: only this queue.")
    expected_total: int | None = Field(
        default=None,
        ge=0,
        le=MAX_ID,
        description="With `all`: the preview's total; a different current count is 409.",
    )
    reason: str = Field(min_length=1, max_length=2000, description="Why (kept in the audit).")

    @model_validator(mode="after")
    def _explicit(self) -> "RedriveBody":
        if self.queue is not None and not self.all_failed:
            raise ValueError("queue goes with all: true; named events are re-driven as named")
        if (self.event_ids is not None) == self.all_failed:
            raise ValueError(
                "name the events (event_ids) or ask for every failed event explicitly "
                "(all: true, with the preview's expected_total) — not both, not neither"
            )
        if self.all_failed and self.expected_total is None:
            raise ValueError(
                "all: true needs expected_total: preview first (GET "
                "…/outbox/events/redrive/preview) and confirm the total it shows"
            )
        if not self.reason.strip():
            raise ValueError("a re-drive needs a reason")
        return self


def _unscoped(role: str) -> Any:
    """``require(role)`` plus the scope check, as a dependency (so it answers before the body
    is validated: a scoped token learns nothing about the body it sent)."""
    needed = require("operator" if role == "operator" else "viewer")

    async def dependency(principal: Principal = Depends(needed)) -> Principal:
        if principal.partner is not None:
            raise HTTPException(
                403, "the outbox spans every partner: use a token without a partner scope"
            )
        return principal

    return Depends(dependency)


VIEWER = _unscoped("viewer")
OPERATOR = _unscoped("operator")


def _db(request: Request) -> Database:
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
        queue: str | None = Query(default=None, max_length=200),
        limit: int = Query(default=50, ge=1, le=500),
        principal: Principal = VIEWER,
    ) -> dict[str, Any]:
        """Events newest first (no payloads) and the count per state."""
        if state is not None and state not in outbox.STATES:
            raise HTTPException(422, f"state must be one of {', '.join(outbox.STATES)}")
        db = _db(request)
        events = await outbox.list_events(db, state=state, queue=queue, limit=limit)
        return {"counts": await outbox.counts(db), "events": [e.to_json() for e in events]}

    @routes.get("/events/redrive/preview")
    async def redrive_preview(
        request: Request,
        queue: str | None = Query(default=None, min_length=1, max_length=200),
        sample: int = Query(default=10, ge=0, le=100),
        principal: Principal = OPERATOR,
    ) -> dict[str, Any]:
        """The dry run of re-driving every PUBLISH_FAILED_RETRY event (of `queue`): the total,
        the count per queue, a sample, and the body to confirm it with (`confirm`, plus a
        reason). Changes nothing."""
        found = await outbox.preview_redrive(_db(request), queue=queue, sample=sample)
        return found.to_json()

    @routes.get("/events/{event_id}")
    async def get_event(
        request: Request,
        event_id: str,
        principal: Principal = VIEWER,
    ) -> dict[str, Any]:
        """One event with the history of its attempts and re-drives."""
        event = await outbox.get_event(_db(request), event_id)
        if event is None:
            raise HTTPException(404, "no such outbox event")
        return event.to_json()

    @routes.post("/events/redrive")
    async def redrive(
        request: Request,
        body: RedriveBody,
        principal: Principal = OPERATOR,
    ) -> dict[str, Any]:
        """Put PUBLISH_FAILED_RETRY events back to PENDING with fresh attempts (audited):
        `{"event_ids": [...], "reason"}`, or `{"all": true, "queue"?, "expected_total",
        "reason"}` after the preview. 409 when the failed events are no longer
        `expected_total`."""
        try:
            ids = await outbox.redrive(
                _db(request),
                actor=principal.name,
                reason=body.reason,
                event_ids=body.event_ids,
                all_failed=body.all_failed,
                queue=body.queue,
                expected_total=body.expected_total,
                via="api",
            )
        except ReviewConflict as exc:
            raise HTTPException(409, str(exc)) from None
        except (InvalidRequest, ConfigurationError) as exc:
            raise HTTPException(422, str(exc)) from None
        return {"redriven": ids, "count": len(ids)}

    return routes
