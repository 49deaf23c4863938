"""The ops HTTP API (SPEC K3): FastAPI over :mod:`jobfence.review.deadletters`, for operators.

Every route but ``/healthz``, ``/readyz`` and ``/livez`` needs a bearer token (``jobfence
ops token create``); write routes need the ``operator`` role; a partner-scoped token sees
only its partner's letters and gets 404 for anything else. Request bodies over ``max_body``
bytes get 413 before anything else happens. Every write goes through a service function that
appends an audit row in the same transaction. Errors are problem+json: ``{type, title,
status, code, detail}``.

:func:`create_app` builds the app: the routes are one router per resource
(:mod:`jobfence.ops.routes`), sharing :mod:`jobfence.ops.deps` (the App, the principal) and
:mod:`jobfence.ops.problems` (problem+json); :mod:`jobfence.ops.body_limit` caps bodies.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from fastapi import FastAPI, Request

from ..app import App
from ..core.leases import default_holder
from . import models
from .auth import Principal
from .body_limit import DEFAULT_MAX_BODY, BodyLimit
from .deps import VIEWER, OpsState
from .problems import install_handlers
from .routes import audit, calls, dead_letters, flow, jobs, outbox, replays, schedules, stats

__all__ = ["DEFAULT_MAX_BODY", "create_app"]


def create_app(
    database_url: str | None = None,
    *,
    transport: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    jobfence_app: App | None = None,
    close_app: bool | None = None,
    console: bool = True,
    session_ttl: timedelta | None = None,
) -> FastAPI:
    """The ops API over the jobfence database at ``database_url`` (replays republish to
    ``transport``, by default the database queue). Pass ``jobfence_app`` to reuse an app
    (opened already, so that start-up failures surface before the server starts); the
    lifespan closes it at shutdown only with ``close_app=True`` (default: only its own).
    ``console``: also serve the operators' console under ``/ui`` (:mod:`jobfence.ops.ui`),
    whose sign-in sessions last ``session_ttl`` at most (default 8 hours; 1 hour idle).

    The server checks each database connection it takes from the pool
    (``Database.check_connections``, turned on for the app it serves): a connection a
    database restart left stale is replaced, and an unreachable database answers 503."""
    closes = jobfence_app is None if close_app is None else close_app
    ops = OpsState(
        jobfence_app or App(database_url, transport=transport), f"ops:{default_holder()}"
    )

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        jf = ops.jobfence
        await jf.open()
        # a request never fails on a connection a database restart left stale, and an
        # outage answers 503 within seconds (docs/ops-api.md)
        jf.db.check_connections = True
        if jf.transport.jobs_db is not None:
            jf.transport.jobs_db.check_connections = True
        api.state.jobfence = jf
        api.state.jobfence_db = jf.db
        try:
            yield
        finally:
            for task in ops.runs.values():
                task.cancel()
            for task in list(ops.runs.values()):
                with contextlib.suppress(BaseException):
                    await task
            if closes:
                await jf.close()

    api = FastAPI(
        title="jobfence ops API",
        version="1",
        description=(
            "Dead letters for operators: find, understand, replay or discard them (one by "
            "one or in bulk), follow bulk replays, read the audit log; jobs waiting, running "
            "or retrying (cancel, retry now) and queues (pause, resume); recorded calls of jobs to "
            "other systems (settle one in doubt). Authenticate with "
            "`Authorization: Bearer <token>` (`jobfence ops token create`). Errors are "
            "problem+json."
        ),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        responses={
            401: {"model": models.Problem, "description": "No, unknown or expired token."},
            413: {"model": models.Problem, "description": "Request body too large."},
        },
    )
    api.state.ops = ops
    api.add_middleware(BodyLimit, max_bytes=max_body)
    install_handlers(api)

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request, who: Principal = VIEWER) -> Any:
        return api.openapi()

    api.include_router(stats.router)  # /healthz, /metrics, /v1/stats
    api.include_router(dead_letters.router)
    api.include_router(replays.router)
    api.include_router(audit.router)
    api.include_router(jobs.router)  # job control, queues, bulk discard
    api.include_router(flow.router)  # flow control: limits, keys, key pauses
    api.include_router(calls.router)  # recorded calls: the in-doubt ones, settle
    api.include_router(schedules.router)  # periodic jobs: next and last runs
    api.include_router(outbox.router(), prefix="/v1")  # outbox listing and re-drive
    if console:
        from .ui import install

        # the operators' console under /ui (after the handlers it wraps)
        install(api, **({"session_ttl": session_ttl} if session_ttl is not None else {}))
    return api
