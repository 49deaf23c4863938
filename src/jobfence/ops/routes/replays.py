"""``/v1/replays``: bulk replay — preview (a snapshot), confirm and run in the background,
follow its progress and per-item report."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from ...db import Database
from ...review import deadletters as service
from ...review import replays
from ...review.validation import MAX_PAGE
from .. import models
from ..auth import Principal
from ..deps import (
    CONFLICT,
    DB,
    FORBIDDEN,
    MAX_ID,
    MISSING,
    OPERATOR,
    REPLAY_ID,
    STATE,
    VIEWER,
    OpsState,
    actor_of,
)

router = APIRouter(tags=["bulk replay"])


@router.post("/v1/replays", response_model=models.Preview, status_code=201, responses=FORBIDDEN)
async def preview(
    body: models.PreviewBody, request: Request, who: Principal = OPERATOR, db: Database = DB
) -> Any:
    """Dry run of a bulk replay: snapshot the matching pending letters; nothing is
    republished until the snapshot is confirmed and run."""
    flt = service.Filter(**body.filter.model_dump(exclude={"ids"}), ids=_ids(body.filter.ids))
    found = await replays.preview_replay(
        db, flt, actor=actor_of(who), all_pending=body.all_pending, sample=body.sample
    )
    confirm = str(request.url_for("run_replay", replay_id=found.replay_id).path)
    return models.Preview.of(found, confirm)


@router.post(
    "/v1/replays/{replay_id}/run",
    response_model=models.Replay,
    status_code=202,
    responses={**FORBIDDEN, **MISSING, **CONFLICT},
)
async def run_replay(
    body: models.RunBody,
    replay_id: int = REPLAY_ID,
    who: Principal = OPERATOR,
    ops: OpsState = STATE,
) -> Any:
    """Confirm (expected_total = the preview's total) and run a bulk replay in the
    background; follow it at GET /v1/replays/{id}. Also resumes a stopped one."""
    status = await ops.launch_replay(
        replay_id,
        actor=actor_of(who),
        expected_total=body.expected_total,
        rate=body.rate,
        reason=body.reason,
    )
    return models.Replay.of(status)


@router.get("/v1/replays/{replay_id}", response_model=models.Replay, responses=MISSING)
async def replay_status(
    replay_id: int = REPLAY_ID, who: Principal = VIEWER, db: Database = DB
) -> Any:
    """Progress of a bulk replay and its counts per outcome ("pending": not yet done)."""
    return models.Replay.of(await replays.replay_status(db, replay_id, actor=actor_of(who)))


@router.get(
    "/v1/replays/{replay_id}/items", response_model=models.ReplayItemPage, responses=MISSING
)
async def replay_items(
    replay_id: int = REPLAY_ID,
    who: Principal = VIEWER,
    outcome: str | None = Query(
        None, description="pending, published, already_applied, not_pending or truncated"
    ),
    after: int | None = Query(None, ge=0, le=MAX_ID, description="The previous next_cursor."),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
    db: Database = DB,
) -> Any:
    """The per-item report of a bulk replay, by letter id."""
    page = await replays.replay_items(
        db, replay_id, actor=actor_of(who), outcome=outcome, after=after, limit=limit
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


def _ids(ids: list[int] | None) -> tuple[int, ...] | None:
    return tuple(ids) if ids is not None else None
