"""What the ops routes share: the jobfence App behind the API (and its running bulk replays),
the caller's principal as a service Actor, and the common parameters and error responses."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, Path, Request

from .. import deadletters as service
from ..app import App
from ..db import Database
from . import models
from .auth import Principal, require

MAX_ID = service.MAX_ID  # ids and cursors are bigint (PostgreSQL) / INTEGER (SQLite)

Responses = dict[int | str, dict[str, Any]]


@dataclass
class OpsState:
    """One ops API's state (``api.state.ops``): the app it serves, its runner id for bulk
    replays, and the replays running in this server (cancelled when it stops)."""

    jobfence: App
    runner: str
    runs: dict[int, asyncio.Task[Any]] = field(default_factory=dict)


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
