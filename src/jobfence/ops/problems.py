"""Errors of the ops API as problem+json (RFC 9457): ``{type, title, status, code, detail}``,
and the exception handlers that turn the service's errors into them."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..db import DATA_ERROR, DRIVER_ERROR, is_connection_lost
from ..errors import DatabaseUnavailable, InvalidRequest, NotFound, ReviewConflict
from ..review.validation import MAX_ID

log = logging.getLogger("jobfence.ops")

PROBLEM = "application/problem+json"

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
    status: int,
    title: str,
    detail: str | None = None,
    *,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "code": code or _CODES.get(status, "ERROR"),
        "detail": detail,
        **extra,
    }
    return JSONResponse(
        jsonable_encoder(body), status_code=status, media_type=PROBLEM, headers=headers
    )


def install_handlers(api: FastAPI) -> None:
    """Answer HTTP errors, invalid requests and the service's errors with problem+json."""

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
        return problem(503, "Database unavailable", str(exc), headers={"Retry-After": "5"})

    async def driver_error(request: Request, exc: Exception) -> JSONResponse:
        if is_connection_lost(exc):  # a restart or an outage under a request: try again
            log.warning("database connection lost", extra={"error": _first(exc)})
            return problem(
                503,
                "Database unavailable",
                f"the database connection was lost ({_first(exc)}); try again",
                headers={"Retry-After": "5"},
            )
        log.error("database error", exc_info=exc)
        return problem(500, "Internal Server Error", f"database error ({type(exc).__name__})")

    api.add_exception_handler(DRIVER_ERROR, driver_error)


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
