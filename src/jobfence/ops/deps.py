"""What the ops routes share: the jobfence App behind the API (and its running bulk replays),
the caller's principal as a service Actor, and the common parameters and error responses."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, Path, Request

from ..app import App
from ..db import Database
from ..errors import ReviewConflict
from ..review import deadletters as service
from ..review import replays, validation
from . import models
from .auth import Principal, require

log = logging.getLogger("jobfence.ops")

MAX_ID = validation.MAX_ID  # ids and cursors are bigint (PostgreSQL) / INTEGER (SQLite)

Responses = dict[int | str, dict[str, Any]]


@dataclass
class OpsState:
    """One ops API's state (``api.state.ops``): the app it serves, its runner id for bulk
    replays, and the replays running in this server (cancelled when it stops)."""

    jobfence: App
    runner: str
    runs: dict[int, asyncio.Task[Any]] = field(default_factory=dict)

    async def launch_replay(
        self,
        replay_id: int,
        *,
        actor: service.Actor,
        expected_total: int,
        rate: float | None = None,
        reason: str | None = None,
    ) -> replays.ReplayStatus:
        """Confirm a previewed bulk replay and run it in the background of this server (the
        ops API's ``POST /v1/replays/{id}/run`` and the console's confirmation); also
        resumes a stopped one. Follow it with :func:`jobfence.review.replays.replay_status`."""
        running = self.runs.get(replay_id)
        if running is not None and not running.done():
            raise ReviewConflict(f"replay {replay_id} is already running in this server")
        why = replays.check_reason(reason)  # refused before the replay is started
        jf, runner, runs = self.jobfence, self.runner, self.runs
        status = await replays.start_replay(
            jf.db, replay_id, actor=actor, expected_total=expected_total, runner=runner
        )

        async def work() -> None:
            try:
                await replays.execute_replay(
                    jf.db,
                    jf.transport,
                    replay_id,
                    actor=actor,
                    runner=runner,
                    rate=rate,
                    reason=why,
                )
            except Exception:
                log.exception(
                    "bulk replay stopped; run it again to resume", extra={"replay": replay_id}
                )
            finally:
                runs.pop(replay_id, None)

        runs[replay_id] = asyncio.create_task(work(), name=f"jobfence-replay-{replay_id}")
        return status


def ops_state(request: Request) -> OpsState:
    state: OpsState = request.app.state.ops
    return state


def jobfence_app(request: Request) -> App:
    """The jobfence App the ops API serves (a dependency)."""
    return ops_state(request).jobfence


def database(request: Request) -> Database:
    """The jobfence database (a dependency)."""
    return ops_state(request).jobfence.db


def actor_of(principal: Principal) -> service.Actor:
    return service.Actor(principal.name, "api", principal.partner)


VIEWER: Any = Depends(require("viewer"))
OPERATOR: Any = Depends(require("operator"))
APP: Any = Depends(jobfence_app)
DB: Any = Depends(database)
STATE: Any = Depends(ops_state)

FORBIDDEN: Responses = {403: {"model": models.Problem, "description": "Needs operator."}}
MISSING: Responses = {404: {"model": models.Problem, "description": "Not found or in scope."}}
CONFLICT: Responses = {409: {"model": models.Problem, "description": "Already decided."}}

LETTER_ID: Any = Path(ge=1, le=MAX_ID, description="A dead letter id.")
REPLAY_ID: Any = Path(ge=1, le=MAX_ID, description="A bulk replay id.")
