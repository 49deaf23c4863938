"""Dead letters: the filtered list (keyset pages), one letter (payload shown safely, attempts
with tracebacks, replay chain, audit trail), replay and discard, and bulk replay — preview,
confirmation, live progress."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response

from ...errors import Category, InvalidRequest
from ...review import deadletters as service
from ...review import replays
from ...review.validation import ALL_STATUSES
from ..deps import MAX_ID, jobfence_app
from .render import link, page, payload_view, redirect, secure
from .session import Refused, User, actor_of, flash, operator, signed_in

router = APIRouter()
SIGNED_IN: Any = Depends(signed_in)
OPERATOR: Any = Depends(operator)
LETTER: Any = Path(ge=1, le=MAX_ID)
REPLAY: Any = Path(ge=1, le=MAX_ID)
PAGE = 50
DEFAULT_RATE = 500.0  # letters per second, as the ops API's default
FILTERS = ("status", "queue", "consumer", "category", "error", "job_id", "since", "until")
CATEGORIES = [c.value for c in Category]


def form_time(name: str, value: str | None) -> datetime | None:
    """A ``datetime-local`` (or ISO 8601) field as UTC."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{name} must be a date and time, e.g. 2026-01-31T14:00") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def letter_filter(values: dict[str, str], *, ids: list[str] | None = None) -> service.Filter:
    """The dead-letter filter of a query string or a form (empty fields: no criterion)."""

    def text(name: str) -> str | None:
        value = (values.get(name) or "").strip()
        return value or None

    chosen: tuple[int, ...] | None = None
    if ids:
        try:
            chosen = tuple(int(i) for i in ids)
        except ValueError:
            raise InvalidRequest("ids must be letter ids") from None
    return service.Filter(
        queue=text("queue"),
        consumer=text("consumer"),
        category=text("category"),
        error=text("error"),
        job_id=text("job_id"),
        since=form_time("since", text("since")),
        until=form_time("until", text("until")),
        status=text("status"),
        ids=chosen,
    ).check()


@router.get("/ui/dead-letters")
async def list_letters(request: Request, user: User = SIGNED_IN) -> Response:
    params = dict(request.query_params)
    params.setdefault("status", "pending_review")
    before = params.get("before")
    error = None
    items: list[Any] = []
    cursor = None
    try:
        flt = letter_filter(params)
        found = await service.search(
            jobfence_app(request).db,
            flt,
            actor=actor_of(user.principal),
            limit=PAGE,
            before=int(before) if before and before.isdigit() else None,
        )
        items, cursor = found.items, found.next_cursor
    except InvalidRequest as exc:
        error = str(exc)
    kept = {k: params.get(k, "") for k in FILTERS}
    return page(
        request,
        "letters.html",
        user,
        status=422 if error else 200,
        letters=items,
        filters=kept,
        error=error,
        categories=CATEGORIES,
        statuses=[*service.STATUSES, ALL_STATUSES],
        next_url=link("/ui/dead-letters", **kept, before=cursor) if cursor else None,
        first_url=link("/ui/dead-letters", **kept) if before else None,
    )


@router.get("/ui/dead-letters/{letter_id}")
async def show_letter(
    request: Request, letter_id: int = LETTER, user: User = SIGNED_IN
) -> Response:
    return await _letter_page(request, letter_id, user)


async def _letter_page(
    request: Request, letter_id: int, user: User, *, error: str | None = None
) -> Response:
    """One letter's page; with ``error`` (a refused action), 422 with the message above its
    forms (the letter stays on screen)."""
    view = await service.show(jobfence_app(request).db, letter_id, actor=actor_of(user.principal))
    return page(
        request,
        "letter.html",
        user,
        status=422 if error else 200,
        error=error,
        view=view,
        letter=view.letter,
        payload=payload_view(view.letter.payload),
    )


@router.get("/ui/dead-letters/{letter_id}/payload")
async def download_payload(
    request: Request, letter_id: int = LETTER, user: User = SIGNED_IN
) -> Response:
    """The payload bytes as kept, as a download (never rendered by the browser)."""
    view = await service.show(jobfence_app(request).db, letter_id, actor=actor_of(user.principal))
    response = Response(view.letter.payload or b"", media_type="application/octet-stream")
    response.headers["Content-Disposition"] = (
        f'attachment; filename="dead-letter-{letter_id}.payload"'
    )
    return secure(response)


async def read_form(request: Request) -> dict[str, Any]:
    form = await request.form()
    return {k: v for k, v in form.multi_items() if isinstance(v, str)}


@router.post("/ui/dead-letters/{letter_id}/replay")
async def replay_letter(
    request: Request, letter_id: int = LETTER, user: User = OPERATOR
) -> Response:
    jf = jobfence_app(request)
    form = await read_form(request)
    result = await service.replay(
        jf.db,
        jf.transport,
        letter_id,
        actor=actor_of(user.principal),
        reason=form.get("reason") or None,
    )
    await flash(request, user, "ok", f"Dead letter {letter_id}: {result.outcome.replace('_', ' ')}")
    return redirect(f"/ui/dead-letters/{letter_id}")


@router.post("/ui/dead-letters/{letter_id}/discard")
async def discard_letter(
    request: Request, letter_id: int = LETTER, user: User = OPERATOR
) -> Response:
    form = await read_form(request)
    try:
        await service.discard(
            jobfence_app(request).db,
            letter_id,
            actor=actor_of(user.principal),
            reason=form.get("reason", ""),
        )
    except InvalidRequest as exc:  # the letter's page again, with why
        return await _letter_page(request, letter_id, user, error=str(exc))
    await flash(request, user, "ok", f"Dead letter {letter_id} discarded")
    return redirect(f"/ui/dead-letters/{letter_id}")


# -- bulk replay ------------------------------------------------------------------------------


@router.post("/ui/replays")
async def preview_replay(request: Request, user: User = OPERATOR) -> Response:
    """Preview a bulk replay of the selected letters, or of every pending letter matching the
    list's filter (``scope=filter``): a snapshot, nothing republished yet."""
    form = await request.form()
    values = {k: v for k, v in form.items() if isinstance(v, str)}
    ids = [v for v in form.getlist("ids") if isinstance(v, str)]
    if values.get("scope") != "filter" and not ids:
        raise InvalidRequest("select letters to replay, or replay everything the filter matches")
    flt = letter_filter(
        {**values, "status": ""}, ids=ids if values.get("scope") != "filter" else None
    )
    found = await replays.preview_replay(
        jobfence_app(request).db,
        flt,
        actor=actor_of(user.principal),
        all_pending=flt.is_empty,
    )
    return redirect(f"/ui/replays/{found.replay_id}")


@router.get("/ui/replays/{replay_id}")
async def show_replay(
    request: Request, replay_id: int = REPLAY, user: User = SIGNED_IN
) -> Response:
    return page(request, "replay.html", user, **await _replay(request, replay_id, user))


@router.get("/ui/replays/{replay_id}/progress")
async def replay_progress(
    request: Request, replay_id: int = REPLAY, user: User = SIGNED_IN
) -> Response:
    """The progress panel alone (htmx polls it while the replay runs)."""
    return page(request, "_replay_progress.html", user, **await _replay(request, replay_id, user))


async def _replay(request: Request, replay_id: int, user: User) -> dict[str, Any]:
    db = jobfence_app(request).db
    actor = actor_of(user.principal)
    status = await replays.replay_status(db, replay_id, actor=actor)
    sample = await replays.replay_items(db, replay_id, actor=actor, limit=20)
    breakdown = await replays.replay_breakdown(db, replay_id, actor=actor)
    return {
        "replay": status,
        "items": sample.items,
        "breakdown": breakdown,
        "applied": sum(b["applied"] for b in breakdown),
        "truncated": sum(b["truncated"] for b in breakdown),
    }


@router.post("/ui/replays/{replay_id}/run")
async def run_replay(request: Request, replay_id: int = REPLAY, user: User = OPERATOR) -> Response:
    form = await read_form(request)
    try:
        expected = int(form.get("expected_total", ""))
    except ValueError:
        raise Refused(422, "confirm the total the preview showed") from None
    try:
        rate = float(form["rate"]) if form.get("rate") else DEFAULT_RATE
    except ValueError:
        raise Refused(422, "the rate is letters per second, e.g. 200") from None
    if not 0 < rate <= 100_000:
        raise Refused(422, "the rate must be between 0 and 100 000 letters per second")
    ops = request.app.state.ops
    await ops.launch_replay(
        replay_id,
        actor=actor_of(user.principal),
        expected_total=expected,
        rate=rate,
        reason=form.get("reason") or None,
    )
    await flash(request, user, "ok", f"Bulk replay {replay_id} started")
    return redirect(f"/ui/replays/{replay_id}")
