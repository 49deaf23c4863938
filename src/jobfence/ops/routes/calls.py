"""``/v1/calls``: the recorded calls of jobs to other systems — find the ones in doubt, show
one, settle it (:mod:`jobfence.calls.review`).

The same service functions as ``jobfence calls …`` and the console's calls page. Roles and
scope as for dead letters: a viewer lists and shows, an operator settles; a partner-scoped
token sees only its partner's calls (404 for another's). A settlement is audited and replays
the job's parked dead letter in the same transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from ...app import App
from ...calls import review
from ...calls.ledger import MAX_REFERENCE
from ...review.validation import MAX_REASON
from ..auth import Principal
from ..deps import APP, CONFLICT, FORBIDDEN, MAX_ID, MISSING, OPERATOR, VIEWER, actor_of

router = APIRouter(tags=["calls"])
CALL_ID: Any = Path(ge=1, le=MAX_ID, description="A recorded call's id.")


class CallSummary(BaseModel):
    """A recorded call as lists show it (without the recorded outcome)."""

    id: int
    consumer: str
    queue: str
    job_id: str
    step: str = Field(description="The step's name, unique within its job (e.g. erp.create).")
    key: str = Field(description="The idempotency key sent downstream.")
    partner: str | None
    state: Literal["pending", "succeeded", "failed", "in_doubt", "applied", "not_applied"]
    attempts: int
    created_at: datetime = Field(description="When the intent was committed.")
    updated_at: datetime
    age_seconds: float = Field(description="Since the intent, by the database's clock.")
    reference: str | None = Field(description="The downstream's reference (an order number).")
    last_error: str | None
    settled_by: str | None
    settled_reason: str | None
    settled_at: datetime | None

    @classmethod
    def of(cls, call: review.CallSummary) -> CallSummary:
        return cls(**call.__dict__)


class CallPage(BaseModel):
    items: list[CallSummary]
    next_cursor: int | None = Field(description="Pass as `after` for the next page; null: end.")


class CallDetail(CallSummary):
    """One call with its recorded outcome and its job's parked dead letter."""

    outcome: Any = Field(description="The recorded summary of the answer (JSON), or null.")
    dead_letter_id: int | None = Field(
        description="The job's dead letter pending review (the parked job), or null."
    )


class SettleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outcome: Literal["applied", "not_applied"] = Field(
        description="applied: the downstream has the effect (the job goes on as if the call "
        "had answered); not_applied: it has not (the job calls again, with the same key)."
    )
    reference: str | None = Field(
        default=None,
        max_length=MAX_REFERENCE,
        description="applied: the downstream's reference (required); not_applied: none.",
    )
    reason: str = Field(
        max_length=MAX_REASON, description="What was checked downstream (required)."
    )


class ReplayOutcome(BaseModel):
    dead_letter_id: int
    outcome: Literal["published", "already_applied"]
    detail: str | None = None


class Settled(BaseModel):
    call: CallSummary
    audit_id: int = Field(description="The audit row (action call.settle).")
    replay: ReplayOutcome | None = Field(
        description="The replay of the job's parked dead letter; null: the job was not parked "
        "(it finds the settlement when it runs)."
    )


@router.get("/v1/calls", response_model=CallPage)
async def list_calls(
    who: Principal = VIEWER,
    state: str = Query(
        "in_doubt",
        description="pending, succeeded, failed, in_doubt (the default), applied, "
        "not_applied, or all",
    ),
    queue: str | None = None,
    consumer: str | None = None,
    step: str | None = None,
    job_id: str | None = None,
    older_than: float | None = Query(
        None, ge=0, le=3_153_600_000, description="Seconds since the intent, at least."
    ),
    limit: int = Query(50, ge=1, le=review.MAX_PAGE),
    after: int | None = Query(None, ge=0, le=MAX_ID, description="The previous next_cursor."),
    jf: App = APP,
) -> Any:
    """Recorded calls in scope, oldest first; by default the in-doubt ones."""
    flt = review.CallFilter(
        state=state,
        queue=queue,
        consumer=consumer,
        step=step,
        job_id=job_id,
        older_than=timedelta(seconds=older_than) if older_than is not None else None,
    )
    calls = await review.ledger_db(jf.ledger, jf.db)
    page = await review.list_calls(calls, flt, actor=actor_of(who), limit=limit, after=after)
    return {"items": [CallSummary.of(c) for c in page.items], "next_cursor": page.next_cursor}


@router.get("/v1/calls/{call_id}", response_model=CallDetail, responses=MISSING)
async def show_call(call_id: int = CALL_ID, who: Principal = VIEWER, jf: App = APP) -> Any:
    """One call: job, step, key, state, recorded outcome, settlement, parked dead letter."""
    calls = await review.ledger_db(jf.ledger, jf.db)
    view = await review.show_call(jf.db, calls, call_id, actor=actor_of(who))
    return CallDetail(
        **view.call.__dict__, outcome=view.outcome, dead_letter_id=view.dead_letter_id
    )


@router.post(
    "/v1/calls/{call_id}/settle",
    response_model=Settled,
    responses={**FORBIDDEN, **MISSING, **CONFLICT},
)
async def settle_call(
    body: SettleBody, call_id: int = CALL_ID, who: Principal = OPERATOR, jf: App = APP
) -> Any:
    """Settle an in-doubt call (reason required; a reference with applied), audited; the
    job's parked dead letter is replayed in the same transaction."""
    done = await review.settle_call(
        jf.db,
        await review.ledger_db(jf.ledger, jf.db),
        jf.transport,
        call_id,
        actor=actor_of(who),
        outcome=body.outcome,
        reason=body.reason,
        reference=body.reference,
    )
    return done.to_json()
