"""``/healthz``, ``/metrics`` and ``/v1/stats``: is it up, the Prometheus series, the counts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...app import App
from ...db import Database
from ...review import stats as counts
from ...runtime.flow_view import limits_of, refresh_flow_gauges
from .. import models
from ..auth import Principal
from ..deps import APP, DB, VIEWER, actor_of

router = APIRouter()


@router.get("/healthz", response_model=models.Health, tags=["ops"])
async def healthz(db: Database = DB) -> Any:
    """Readiness: the server answers and its database too (no token needed; reveals nothing
    else). 503 problem+json while the database is unreachable."""
    await db.run("db_now")
    return {"status": "ok"}


@router.get("/readyz", response_model=models.Health, tags=["ops"])
async def readyz(db: Database = DB) -> Any:
    """Readiness (the same as ``/healthz``): a Kubernetes readinessProbe takes the server
    out of its Service while the database is unreachable."""
    await db.run("db_now")
    return {"status": "ok"}


@router.get("/livez", response_model=models.Health, tags=["ops"])
async def livez() -> Any:
    """Liveness: the process answers. It never asks the database, so that a database
    outage makes the server unready (``/readyz``), never restarted."""
    return {"status": "ok"}


@router.get(
    "/metrics",
    tags=["ops"],
    response_class=Response,
    responses={403: {"model": models.Problem, "description": "A partner-scoped token."}},
)
async def metrics(who: Principal = VIEWER, jf: App = APP) -> Response:
    """Prometheus metrics of this process plus the database gauges (pending review,
    queue depth, undelivered alerts). Unscoped tokens only: the series cover every
    partner and carry no partner label, so a partner-scoped token gets 403 (its
    filtered numbers are at /v1/stats)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    if who.partner is not None:
        raise StarletteHTTPException(
            403,
            "metrics cover every partner (pending letters and queue depth of all of "
            "them) and cannot be filtered by partner: scrape with an unscoped token; "
            "this token's numbers are at GET /v1/stats",
        )
    await counts.refresh_gauges(jf.db, jf.transport.jobs_db)
    limits = limits_of(jf.consumers)
    if limits:
        await refresh_flow_gauges(jf.transport.jobs_db or jf.db, limits)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/stats", response_model=models.Stats, tags=["dead letters"])
async def stats(who: Principal = VIEWER, jf: App = APP) -> Any:
    """Dead letters by queue, category and status; queue depth and each queue's backlog,
    marking queues the app does not serve (unscoped tokens)."""
    found = await counts.stats(
        jf.db,
        actor=actor_of(who),
        jobs_db=jf.transport.jobs_db,
        served=jf.consumed_queues,
    )
    return {"letters": found.letters, "queue_depth": found.queue_depth, "queues": found.queues}
