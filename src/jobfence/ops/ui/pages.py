"""The outbox (states, re-drive), the audit log (by actor, action, time) and the ops API's
Swagger UI, behind the console's sign-in."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from ... import outbox
from ...errors import InvalidRequest
from ...review import deadletters as service
from ..deps import MAX_ID, database
from .letters import form_time
from .render import CSP_SWAGGER, link, page, plural, redirect, secure
from .session import Refused, User, actor_of, flash, operator, signed_in

router = APIRouter()
SIGNED_IN: Any = Depends(signed_in)
OPERATOR: Any = Depends(operator)
PAGE = 50


def _unscoped(user: User) -> None:
    if user.scoped:
        raise Refused(403, "the outbox spans every partner: sign in with an unscoped token")


def _cursor(value: str | None) -> int | None:
    if not value:
        return None
    if not value.isdigit() or int(value) > MAX_ID:
        raise InvalidRequest("the page cursor must be a whole number")
    return int(value)


@router.get("/ui/outbox")
async def outbox_page(request: Request, user: User = SIGNED_IN) -> Response:
    _unscoped(user)
    q = request.query_params
    state = q.get("state") or None
    queue = (q.get("queue") or "").strip() or None
    before = _cursor(q.get("before"))
    db = database(request)
    if state is not None and state not in outbox.STATES:
        raise InvalidRequest(f"state must be one of {', '.join(outbox.STATES)}")
    events = await outbox.list_events(db, state=state, queue=queue, limit=PAGE, before=before)
    cursor = events[-1].id if len(events) == PAGE else None
    return page(
        request,
        "outbox.html",
        user,
        events=events,
        counts=await outbox.counts(db),
        states=outbox.STATES,
        state=state or "",
        queue=queue or "",
        next_url=link("/ui/outbox", state=state, queue=queue, before=cursor) if cursor else None,
        first_url=link("/ui/outbox", state=state, queue=queue) if before else None,
    )


@router.post("/ui/outbox/redrive")
async def redrive(request: Request, user: User = OPERATOR) -> Response:
    _unscoped(user)
    form = await request.form()
    ids = [v for v in form.getlist("event_ids") if isinstance(v, str)]
    reason = form.get("reason")
    if not ids:
        raise InvalidRequest("select the failed events to re-drive")
    done = await outbox.redrive(
        database(request),
        actor=user.principal.name,
        reason=reason if isinstance(reason, str) else "",
        event_ids=ids,
        via="console",
    )
    await flash(request, user, "ok", f"{plural(len(done), 'event')} re-driven")
    return redirect("/ui/outbox?state=PENDING")


@router.get("/ui/audit")
async def audit_page(request: Request, user: User = SIGNED_IN) -> Response:
    q = request.query_params
    fields = {k: (q.get(k) or "").strip() for k in ("actor", "action", "since", "until")}
    before = _cursor(q.get("before"))
    error = None
    entries: list[Any] = []
    cursor = None
    try:
        found = await service.audit(
            database(request),
            actor=actor_of(user.principal),
            by=fields["actor"] or None,
            action=fields["action"] or None,
            since=form_time("since", fields["since"]),
            until=form_time("until", fields["until"]),
            before=before,
            limit=PAGE,
        )
        entries, cursor = found.items, found.next_cursor
    except InvalidRequest as exc:
        error = str(exc)
    return page(
        request,
        "audit.html",
        user,
        status=422 if error else 200,
        error=error,
        entries=entries,
        filters=fields,
        next_url=link("/ui/audit", **fields, before=cursor) if cursor else None,
        first_url=link("/ui/audit", **fields) if before else None,
    )


@router.get("/ui/api")
async def swagger(request: Request, user: User = SIGNED_IN) -> Response:
    """Swagger UI (vendored) over the ops API's OpenAPI document; "Try it out" needs the
    token itself (Authorize), as the API takes bearer tokens, not the console's cookie."""
    return page(request, "swagger.html", user, csp=CSP_SWAGGER)


@router.get("/ui/api/openapi.json")
async def openapi(request: Request, user: User = SIGNED_IN) -> Response:
    return secure(JSONResponse(request.app.openapi()))
