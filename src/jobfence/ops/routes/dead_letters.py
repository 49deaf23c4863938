"""``/v1/dead-letters``: find and understand dead letters, replay or discard one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Query

from ...app import App
from ...db import Database
from ...review import deadletters as service
from ...review.validation import MAX_PAGE
from .. import models
from ..auth import Principal
from ..deps import (
    APP,
    CONFLICT,
    DB,
    FORBIDDEN,
    LETTER_ID,
    MAX_ID,
    MISSING,
    OPERATOR,
    VIEWER,
    actor_of,
)

router = APIRouter(tags=["dead letters"])


@router.get("/v1/dead-letters", response_model=models.LetterPage)
async def list_letters(
    who: Principal = VIEWER,
    status: str | None = Query(
        None, description="pending_review, replayed, discarded, or all (the default: any)"
    ),
    queue: str | None = None,
    consumer: str | None = None,
    category: str | None = None,
    error: str | None = Query(None, description="Case-insensitive substring of the error."),
    job_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    before: int | None = Query(
        None, ge=0, le=MAX_ID, description="The previous page's next_cursor."
    ),
    db: Database = DB,
) -> Any:
    """Dead letters, newest first, without payloads."""
    flt = service.Filter(
        queue=queue,
        consumer=consumer,
        category=category,
        error=error,
        job_id=job_id,
        since=since,
        until=until,
        status=status,
    )
    page = await service.search(db, flt, actor=actor_of(who), limit=limit, before=before)
    return {
        "items": [models.LetterSummary.of(x) for x in page.items],
        "next_cursor": page.next_cursor,
    }


@router.get("/v1/dead-letters/{letter_id}", response_model=models.LetterDetail, responses=MISSING)
async def show_letter(
    letter_id: int = LETTER_ID, who: Principal = VIEWER, db: Database = DB
) -> Any:
    """One letter: payload, every attempt, error, correlation_id, replay chain, audit."""
    view = await service.show(db, letter_id, actor=actor_of(who))
    return models.LetterDetail.of_view(view)


@router.post(
    "/v1/dead-letters/{letter_id}/replay",
    response_model=models.ItemResult,
    responses={**FORBIDDEN, **MISSING, **CONFLICT},
)
async def replay_letter(
    letter_id: int = LETTER_ID,
    body: models.ReplayBody | None = None,
    who: Principal = OPERATOR,
    jf: App = APP,
) -> Any:
    """Republish the job with the same job_id, payload and correlation_id."""
    result = await service.replay(
        jf.db,
        jf.transport,
        letter_id,
        actor=actor_of(who),
        reason=body.reason if body else None,
    )
    return result.__dict__


@router.post(
    "/v1/dead-letters/{letter_id}/discard",
    response_model=models.LetterSummary,
    responses={**FORBIDDEN, **MISSING, **CONFLICT},
)
async def discard_letter(
    body: models.DiscardBody,
    letter_id: int = LETTER_ID,
    who: Principal = OPERATOR,
    db: Database = DB,
) -> Any:
    """Discard a pending letter; the reason is required and must not be blank."""
    letter = await service.discard(db, letter_id, actor=actor_of(who), reason=body.reason)
    return models.LetterSummary.of(letter)
