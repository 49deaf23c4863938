"""Recorded calls (:mod:`jobfence.calls.review`): the calls of jobs to other systems, the
in-doubt ones by default (filters, keyset pages), one call with its recorded outcome and
parked dead letter, and the settle form (applied with the downstream's reference, or not
applied; a reason is required)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response

from ...calls import review
from ...errors import InvalidRequest
from ..deps import MAX_ID, jobfence_app
from .letters import read_form
from .render import link, page, redirect
from .session import User, actor_of, flash, operator, signed_in

router = APIRouter()
SIGNED_IN: Any = Depends(signed_in)
OPERATOR: Any = Depends(operator)
CALL: Any = Path(ge=1, le=MAX_ID)
PAGE = 50
FILTERS = ("state", "queue", "step", "job_id", "older_than")


def _minutes(value: str) -> timedelta | None:
    if not value:
        return None
    try:
        minutes = float(value)
    except ValueError:
        raise InvalidRequest("older than must be a number of minutes, e.g. 15") from None
    if not 0 <= minutes <= 52_560_000:
        raise InvalidRequest("older than must be from 0 to 100 years in minutes")
    return timedelta(minutes=minutes)


@router.get("/ui/calls")
async def list_calls(request: Request, user: User = SIGNED_IN) -> Response:
    q = request.query_params
    kept = {k: (q.get(k) or "").strip() for k in FILTERS}
    kept["state"] = kept["state"] or "in_doubt"
    after = q.get("after")
    error = None
    items: list[review.CallSummary] = []
    cursor = None
    try:
        flt = review.CallFilter(
            state=kept["state"],
            queue=kept["queue"] or None,
            step=kept["step"] or None,
            job_id=kept["job_id"] or None,
            older_than=_minutes(kept["older_than"]),
        )
        jf = jobfence_app(request)
        found = await review.list_calls(
            await review.ledger_db(jf.ledger, jf.db),
            flt,
            actor=actor_of(user.principal),
            limit=PAGE,
            after=int(after) if after and after.isdigit() else None,
        )
        items, cursor = found.items, found.next_cursor
    except InvalidRequest as exc:
        error = str(exc)
    return page(
        request,
        "calls.html",
        user,
        status=422 if error else 200,
        error=error,
        calls=items,
        filters=kept,
        states=[*review.CALL_STATES, review.ALL_STATES],
        age=review.age_text,
        next_url=link("/ui/calls", **kept, after=cursor) if cursor else None,
        first_url=link("/ui/calls", **kept) if after else None,
    )


@router.get("/ui/calls/{call_id}")
async def show_call(request: Request, call_id: int = CALL, user: User = SIGNED_IN) -> Response:
    jf = jobfence_app(request)
    calls = await review.ledger_db(jf.ledger, jf.db)
    view = await review.show_call(jf.db, calls, call_id, actor=actor_of(user.principal))
    return page(request, "call.html", user, view=view, call=view.call, age=review.age_text)


@router.post("/ui/calls/{call_id}/settle")
async def settle_call(request: Request, call_id: int = CALL, user: User = OPERATOR) -> Response:
    jf = jobfence_app(request)
    form = await read_form(request)
    outcome = form.get("outcome", "")
    done = await review.settle_call(
        jf.db,
        await review.ledger_db(jf.ledger, jf.db),
        jf.transport,
        call_id,
        actor=actor_of(user.principal),
        outcome=outcome,
        reason=form.get("reason", ""),
        reference=(form.get("reference") or "").strip() or None if outcome == "applied" else None,
    )
    replayed = (
        f"; dead letter {done.replay.dead_letter_id} replayed"
        if done.replay is not None
        else "; the job is not parked: it finds the settlement when it runs"
    )
    await flash(
        request,
        user,
        "ok",
        f"Call {call_id} settled as {done.call.state.replace('_', ' ')}{replayed}",
    )
    return redirect(f"/ui/calls/{call_id}")
