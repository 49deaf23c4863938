"""The operators' console: server-rendered pages under ``/ui`` of the ops server.

``jobfence ops serve`` serves it beside the ops API (same process, same database, same
tokens); :func:`install` adds it to an ops API app. Pages are Jinja2 templates rendered on the
server, with htmx (vendored, no CDN) for the few live parts: filtering without a reload, the
progress of a bulk replay, the overview's refresh. Why this and not a single-page app:
docs/ops-console.md.

Modules: :mod:`.session` (sign-in sessions, CSRF and Origin checks), :mod:`.render` (templates,
security headers, payload and chart rendering), one router per area (:mod:`.signin`,
:mod:`.overview`, :mod:`.letters`, :mod:`.jobs`, :mod:`.calls`, :mod:`.schedules`,
:mod:`.pages`).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware

from ...db import DRIVER_ERROR, is_connection_lost
from ...errors import DatabaseUnavailable, InvalidRequest, NotFound, ReviewConflict
from . import calls, jobs, letters, overview, pages, schedules, signin
from .render import HERE, page, redirect
from .session import DEFAULT_IDLE, DEFAULT_TTL, Refused, Sessions, SignInRequired, signed_in

__all__ = ["install"]

_STATUS = {
    Refused: None,
    NotFound: 404,
    InvalidRequest: 422,
    ReviewConflict: 409,
    RequestValidationError: 422,
    StarletteHTTPException: None,
    DatabaseUnavailable: 503,
    DRIVER_ERROR: None,
}
_TITLES = {
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    422: "Refused",
    405: "Not allowed",
    503: "Database unavailable",
}


def install(
    api: FastAPI, *, session_ttl: timedelta = DEFAULT_TTL, idle: timedelta = DEFAULT_IDLE
) -> None:
    """Serve the console under ``/ui`` of ``api`` (an app made by
    :func:`jobfence.ops.app.create_app`)."""
    api.state.ui_sessions = Sessions(ttl=session_ttl, idle=min(idle, session_ttl))
    api.state.ui_refreshes = overview.Refreshes()
    # Static files are gzipped for clients that accept it (htmx 52→17 KB, Swagger UI's bundle
    # 1.7 MB→0.46 MB). Pages are not: they carry the session's CSRF token beside text a link
    # can choose (the filters), which compression would leak through sizes (BREACH).
    api.mount(
        "/ui/static",
        GZipMiddleware(StaticFiles(directory=HERE / "static"), minimum_size=1024),
        name="ui-static",
    )
    for module in (signin, overview, letters, jobs, calls, schedules, pages):
        api.include_router(module.router, include_in_schema=False)

    @api.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return redirect("/ui/")

    @api.exception_handler(SignInRequired)
    async def sign_in(request: Request, exc: SignInRequired) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.method != "GET":
            return page(
                request,
                "error.html",
                None,
                status=401,
                title="Signed out",
                message="your session ended: sign in again",
            )
        response = redirect(f"/ui/login?next={_quote(target)}")
        if request.headers.get("hx-request"):
            response.headers["HX-Redirect"] = "/ui/login"
        return response

    # Errors on console paths are pages; elsewhere the ops API's problem+json handlers answer.
    for kind in _STATUS:
        api.add_exception_handler(kind, _html_or(api.exception_handlers.get(kind)))


def _quote(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="/")


def _html_or(fallback: Any) -> Any:
    async def handler(request: Request, exc: Exception) -> Response:
        if not request.url.path.startswith("/ui") or request.url.path.startswith("/ui/static"):
            if fallback is None:
                raise exc
            result: Response = await fallback(request, exc)
            return result
        status = _status_of(exc)
        user = None
        if status != 503:  # no database: show the page without the session
            with contextlib.suppress(SignInRequired):
                user = await signed_in(request)
        message = getattr(exc, "message", None) or getattr(exc, "detail", None) or str(exc)
        if status == 503:
            message = f"the database is unreachable ({message.splitlines()[0]}); try again"
        elif isinstance(exc, DRIVER_ERROR):
            message = f"database error ({type(exc).__name__})"
        if isinstance(exc, RequestValidationError):
            message = "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc', ())[1:])}: {e.get('msg', '')}"
                for e in exc.errors()
            )
            in_path = any(e.get("loc", ("",))[0] == "path" for e in exc.errors())
            status = 404 if in_path else 422
        return page(
            request,
            "error.html",
            user,
            status=status,
            title=_TITLES.get(status, "Error"),
            message=str(message),
        )

    return handler


def _status_of(exc: Exception) -> int:
    if isinstance(exc, Refused):
        return exc.status
    if isinstance(exc, StarletteHTTPException):
        return exc.status_code
    if isinstance(exc, DRIVER_ERROR):
        return 503 if is_connection_lost(exc) else 500
    for kind, status in _STATUS.items():
        if isinstance(exc, kind) and status is not None:
            return status
    return 500
