"""Sign-in and sign-out: an ops token in, a session cookie out."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..auth import authenticate, hash_token
from ..deps import database
from .render import page, redirect
from .session import COOKIE, Refused, checked_post, same_origin, sessions

router = APIRouter()


def _next(value: object) -> str:
    """Where to go after sign-in: a console path only (never another site)."""
    text = value if isinstance(value, str) else ""
    if not text.startswith("/ui/") or text.startswith("//") or "\\" in text:
        return "/ui/"
    return text


@router.get("/ui/login")
async def login_page(request: Request, next: str = "/ui/") -> Response:
    return page(request, "signin.html", None, next=_next(next))


@router.post("/ui/login")
async def login(request: Request) -> Response:
    if not same_origin(request):  # login CSRF: nobody signs you in from another site
        raise Refused(403, "refused: sign in from the console's own page")
    form = await request.form()
    sent = form.get("token")
    token = sent.strip() if isinstance(sent, str) else ""
    goto = _next(form.get("next"))
    principal = await authenticate(database(request), token)
    if principal is None:
        return page(
            request,
            "signin.html",
            None,
            status=401,
            next=goto,
            error="unknown, revoked or expired token",
        )
    store = sessions(request)
    cookie = await store.create(database(request), hash_token(token))
    response = redirect(goto)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(store.ttl.total_seconds()),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    await checked_post(request)
    await sessions(request).drop(database(request), request.cookies.get(COOKIE))
    response = redirect("/ui/login")
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return response
