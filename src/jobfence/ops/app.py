"""The ops HTTP API (SPEC K3): FastAPI over :mod:`jobfence.deadletters`, for operators.

Every route but ``/healthz`` needs a bearer token (``jobfence ops token create``); write
routes need the ``operator`` role; a partner-scoped token sees only its partner's letters and
gets 404 for anything else. Request bodies over ``max_body`` bytes get 413 before anything
else happens. Every write goes through a service function that appends an audit row in the
same transaction. Errors are problem+json: ``{type, title, status, code, detail}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import deadletters as service
from .. import replays
from ..app import App
from ..db import DATA_ERROR
from ..errors import DatabaseUnavailable, InvalidRequest, NotFound, ReviewConflict
from ..leases import default_holder
from . import models
from .auth import Principal, require

log = logging.getLogger("jobfence.ops")

PROBLEM = "application/problem+json"
DEFAULT_MAX_BODY = 128 * 1024
DRAIN_LIMIT = 8 * 1024 * 1024  # an oversized streamed body is read this far, then cut off
MAX_ID = service.MAX_ID  # ids and cursors are bigint (PostgreSQL) / INTEGER (SQLite)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    422: "INVALID_REQUEST",
    503: "UNAVAILABLE",
}


def problem(
    status: int, title: str, detail: str | None = None, *, code: str | None = None, **extra: Any
) -> JSONResponse:
    body = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "code": code or _CODES.get(status, "ERROR"),
        "detail": detail,
        **extra,
    }
    return JSONResponse(jsonable_encoder(body), status_code=status, media_type=PROBLEM)


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413, whether announced by Content-Length
    or streamed in chunks (then buffered, at most ``max_bytes``, and handed on)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                announced = int(length)
            except ValueError:
                await self._refuse(scope, receive, send, 400, "bad Content-Length")
                return
            if announced > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if headers.get(b"transfer-encoding") is None:
            await self.app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                # read (and drop) the rest, up to a bound, so the client gets to read the 413
                more = message.get("more_body", False)
                while more and size <= DRAIN_LIMIT:
                    message = await receive()
                    size += len(message.get("body", b""))
                    more = message["type"] == "http.request" and message.get("more_body", False)
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._refuse(
            scope, receive, send, 413, f"request bodies are limited to {self.max_bytes} bytes"
        )

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, why: str) -> None:
        title = "Payload too large" if status == 413 else "Bad request"
        response = problem(status, title, why)
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


def actor_of(principal: Principal) -> service.Actor:
    return service.Actor(principal.name, "api", principal.partner)


def create_app(
    database_url: str | None = None,
    *,
    transport: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    jobfence_app: App | None = None,
) -> FastAPI:
    """The ops API over the jobfence database at ``database_url`` (replays republish to
    ``transport``, by default the database queue). Pass ``jobfence_app`` to reuse an app."""
    jf = jobfence_app or App(database_url, transport=transport)
    runner = f"ops:{default_holder()}"
    runs: dict[int, asyncio.Task[Any]] = {}

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        await jf.open()
        api.state.jobfence = jf
        api.state.jobfence_db = jf.db
        try:
            yield
        finally:
            for task in runs.values():
                task.cancel()
            for task in list(runs.values()):
                with contextlib.suppress(BaseException):
                    await task
            if jobfence_app is None:
                await jf.close()

    api = FastAPI(
        title="jobfence ops API",
        version="1",
        description=(
            "Dead letters for operators: find, understand, replay or discard them, follow "
            "bulk replays, read the audit log. Authenticate with `Authorization: Bearer "
            "<token>` (`jobfence ops token create`). Errors are problem+json."
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
    api.add_middleware(BodyLimit, max_bytes=max_body)
    _handlers(api)

    viewer = Depends(require("viewer"))
    operator = Depends(require("operator"))
    Responses = dict[int | str, dict[str, Any]]
    forbidden: Responses = {403: {"model": models.Problem, "description": "Needs operator."}}
    letter_path = Path(ge=1, le=MAX_ID, description="A dead letter id.")
    replay_path = Path(ge=1, le=MAX_ID, description="A bulk replay id.")
    missing: Responses = {404: {"model": models.Problem, "description": "Not found or in scope."}}
    conflict: Responses = {409: {"model": models.Problem, "description": "Already decided."}}

    def database() -> Any:
        return jf.db

    @api.get("/healthz", response_model=models.Health, tags=["ops"])
    async def healthz() -> Any:
        """Liveness and database reachability (no token needed; reveals nothing else)."""
        await jf.db.run("db_now")
        return {"status": "ok"}

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi(who: Principal = viewer) -> Any:
        return api.openapi()

    @api.get(
        "/metrics",
        tags=["ops"],
        response_class=Response,
        responses={403: {"model": models.Problem, "description": "A partner-scoped token."}},
    )
    async def metrics(who: Principal = viewer) -> Response:
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
        transport = jf.transport
        queue_db = transport.queue_db
        await service.refresh_gauges(jf.db, queue_db)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/stats", response_model=models.Stats, tags=["dead letters"])
    async def stats(who: Principal = viewer) -> Any:
        """Dead letters by queue, category and status; queue depth (unscoped tokens)."""
        transport = jf.transport
        queue_db = transport.queue_db
        found = await service.stats(database(), actor=actor_of(who), queue_db=queue_db)
        return {"letters": found.letters, "queue_depth": found.queue_depth}

    @api.get("/v1/dead-letters", response_model=models.LetterPage, tags=["dead letters"])
    async def list_letters(
        who: Principal = viewer,
        status: str | None = Query(None, description="pending_review, replayed or discarded"),
        queue: str | None = None,
        consumer: str | None = None,
        category: str | None = None,
        error: str | None = Query(None, description="Case-insensitive substring of the error."),
        job_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = Query(50, ge=1, le=service.MAX_PAGE),
        before: int | None = Query(
            None, ge=0, le=MAX_ID, description="The previous page's next_cursor."
        ),
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
        page = await service.search(
            database(), flt, actor=actor_of(who), limit=limit, before=before
        )
        return {
            "items": [models.LetterSummary.of(x) for x in page.items],
            "next_cursor": page.next_cursor,
        }

    @api.get(
        "/v1/dead-letters/{letter_id}",
        response_model=models.LetterDetail,
        responses=missing,
        tags=["dead letters"],
    )
    async def show_letter(letter_id: int = letter_path, who: Principal = viewer) -> Any:
        """One letter: payload, every attempt, error, correlation_id, replay chain, audit."""
        view = await service.show(database(), letter_id, actor=actor_of(who))
        return models.LetterDetail.of_view(view)

    @api.post(
        "/v1/dead-letters/{letter_id}/replay",
        response_model=models.ItemResult,
        responses={**forbidden, **missing, **conflict},
        tags=["dead letters"],
    )
    async def replay_letter(
        letter_id: int = letter_path,
        body: models.ReplayBody | None = None,
        who: Principal = operator,
    ) -> Any:
        """Republish the job with the same job_id, payload and correlation_id."""
        result = await service.replay(
            database(),
            jf.transport,
            letter_id,
            actor=actor_of(who),
            reason=body.reason if body else None,
        )
        return result.__dict__

    @api.post(
        "/v1/dead-letters/{letter_id}/discard",
        response_model=models.LetterSummary,
        responses={**forbidden, **missing, **conflict},
        tags=["dead letters"],
    )
    async def discard_letter(
        body: models.DiscardBody, letter_id: int = letter_path, who: Principal = operator
    ) -> Any:
        """Discard a pending letter; the reason is required and must not be blank."""
        letter = await service.discard(
            database(), letter_id, actor=actor_of(who), reason=body.reason
        )
        return models.LetterSummary.of(letter)

    @api.post(
        "/v1/replays",
        response_model=models.Preview,
        status_code=201,
        responses=forbidden,
        tags=["bulk replay"],
    )
    async def preview(body: models.PreviewBody, request: Request, who: Principal = operator) -> Any:
        """Dry run of a bulk replay: snapshot the matching pending letters; nothing is
        republished until the snapshot is confirmed and run."""
        flt = service.Filter(**body.filter.model_dump(exclude={"ids"}), ids=_ids(body.filter.ids))
        found = await replays.preview_replay(
            database(), flt, actor=actor_of(who), all_pending=body.all_pending, sample=body.sample
        )
        confirm = str(request.url_for("run_replay", replay_id=found.replay_id).path)
        return models.Preview.of(found, confirm)

    @api.post(
        "/v1/replays/{replay_id}/run",
        response_model=models.Replay,
        status_code=202,
        responses={**forbidden, **missing, **conflict},
        tags=["bulk replay"],
    )
    async def run_replay(
        body: models.RunBody, replay_id: int = replay_path, who: Principal = operator
    ) -> Any:
        """Confirm (expected_total = the preview's total) and run a bulk replay in the
        background; follow it at GET /v1/replays/{id}. Also resumes a stopped one."""
        actor = actor_of(who)
        running = runs.get(replay_id)
        if running is not None and not running.done():
            raise ReviewConflict(f"replay {replay_id} is already running in this server")
        status = await replays.start_replay(
            database(), replay_id, actor=actor, expected_total=body.expected_total, runner=runner
        )

        async def work() -> None:
            try:
                await replays.execute_replay(
                    database(), jf.transport, replay_id, actor=actor, runner=runner, rate=body.rate
                )
            except Exception:
                log.exception(
                    "bulk replay stopped; run it again to resume", extra={"replay": replay_id}
                )
            finally:
                runs.pop(replay_id, None)

        runs[replay_id] = asyncio.create_task(work(), name=f"jobfence-replay-{replay_id}")
        return models.Replay.of(status)

    @api.get(
        "/v1/replays/{replay_id}",
        response_model=models.Replay,
        responses=missing,
        tags=["bulk replay"],
    )
    async def replay_status(replay_id: int = replay_path, who: Principal = viewer) -> Any:
        """Progress of a bulk replay and its counts per outcome ("pending": not yet done)."""
        return models.Replay.of(
            await replays.replay_status(database(), replay_id, actor=actor_of(who))
        )

    @api.get(
        "/v1/replays/{replay_id}/items",
        response_model=models.ReplayItemPage,
        responses=missing,
        tags=["bulk replay"],
    )
    async def replay_items(
        replay_id: int = replay_path,
        who: Principal = viewer,
        outcome: str | None = Query(
            None, description="pending, published, already_applied, not_pending or truncated"
        ),
        after: int | None = Query(None, ge=0, le=MAX_ID, description="The previous next_cursor."),
        limit: int = Query(100, ge=1, le=service.MAX_PAGE),
    ) -> Any:
        """The per-item report of a bulk replay, by letter id."""
        page = await replays.replay_items(
            database(), replay_id, actor=actor_of(who), outcome=outcome, after=after, limit=limit
        )
        return {"items": page.items, "next_cursor": page.next_cursor}

    @api.get("/v1/audit", response_model=models.AuditPage, tags=["audit"])
    async def audit_log(
        who: Principal = viewer,
        dead_letter_id: int | None = Query(None, ge=1, le=MAX_ID),
        replay_id: int | None = Query(None, ge=1, le=MAX_ID),
        actor: str | None = None,
        limit: int = Query(50, ge=1, le=service.MAX_PAGE),
        before: int | None = Query(None, ge=0, le=MAX_ID),
    ) -> Any:
        """Who did what, when and why — newest first."""
        page = await service.audit(
            database(),
            actor=actor_of(who),
            dead_letter_id=dead_letter_id,
            replay_id=replay_id,
            by=actor,
            before=before,
            limit=limit,
        )
        return {
            "items": [models.AuditRow.of(e) for e in page.items],
            "next_cursor": page.next_cursor,
        }

    from ..http import ops_outbox

    api.include_router(ops_outbox.router(), prefix="/v1")  # outbox listing and re-drive
    return api


def _ids(ids: list[int] | None) -> tuple[int, ...] | None:
    return tuple(ids) if ids is not None else None


def _handlers(api: FastAPI) -> None:
    @api.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = problem(exc.status_code, _title(exc.status_code), str(exc.detail))
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        return problem(
            422, "Invalid request", "the request does not match its schema", errors=errors
        )

    @api.exception_handler(InvalidRequest)
    async def refused(request: Request, exc: InvalidRequest) -> JSONResponse:
        return problem(422, "Invalid request", str(exc))

    @api.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return problem(404, "Not found", str(exc))

    @api.exception_handler(ReviewConflict)
    async def conflict(request: Request, exc: ReviewConflict) -> JSONResponse:
        return problem(409, "Conflict", str(exc), code="REVIEW_CONFLICT")

    async def bad_value(request: Request, exc: Exception) -> JSONResponse:
        # the last line of defence: the models bound what they can, and a value the database
        # still refuses (out of range, malformed) is the request's fault, not the server's
        log.info("request value refused by the database", extra={"error": str(exc)})
        return problem(
            422,
            "Invalid request",
            "a value in the request is out of range or malformed for the database "
            f"({type(exc).__name__}); ids and cursors are whole numbers up to {MAX_ID}",
        )

    api.add_exception_handler(DATA_ERROR, bad_value)

    @api.exception_handler(OverflowError)
    async def overflow(request: Request, exc: OverflowError) -> JSONResponse:
        # SQLite (and datetime arithmetic) refuse numbers they cannot hold with OverflowError
        log.info("request value overflowed", extra={"error": str(exc)})
        return problem(
            422,
            "Invalid request",
            f"a value in the request is too large ({exc}); ids and cursors are whole numbers "
            f"up to {MAX_ID}",
        )

    @api.exception_handler(DatabaseUnavailable)
    async def unavailable(request: Request, exc: DatabaseUnavailable) -> JSONResponse:
        return problem(503, "Database unavailable", str(exc))


def _title(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
