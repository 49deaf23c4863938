"""Console sessions: an ops token becomes an HttpOnly, SameSite=Strict session cookie.

- Sign-in checks the token (:func:`jobfence.ops.auth.authenticate`) and keeps only its hash in
  a server-side session; the cookie holds a random session id (256 bits) and nothing else.
- Every request re-checks the token by its hash, so revoking or expiring the token ends its
  sessions at once; a session also ends after ``ttl`` (absolute) or ``idle`` without a request,
  and at sign-out (it is revoked: a copied cookie is useless afterwards, on every replica).
- Every state-changing request must carry the session's CSRF token (form field ``csrf`` or
  header ``X-CSRF-Token``) and come from the console's own origin (``Origin``, else
  ``Referer``, must name the host the request was sent to). SameSite=Strict already keeps the
  cookie off cross-site requests; the two checks hold even where it would not.

Sessions live in the database (``core.console_sessions``), keyed by the SHA-256 of the cookie:
every replica of ``jobfence ops serve`` behind one address sees them (sign in on one, act
with the session's CSRF token on another, sign out on any), and a restart signs nobody out.
A session's one-time messages (flashes) travel with it to whichever replica shows the next
page.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit

from fastapi import Request

from ...db import Database
from ...review import deadletters as service
from ..auth import Principal, authenticate_hash
from ..deps import database

COOKIE = "jobfence_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
DEFAULT_TTL = timedelta(hours=8)
DEFAULT_IDLE = timedelta(hours=1)


class SignInRequired(Exception):
    """No session (or it ended): the console answers with the sign-in page."""


class Refused(Exception):
    """A request the console refuses (403 CSRF/Origin/role, 404 out of scope, …)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Session:
    key: str  # the SHA-256 of the cookie (the row's id)
    token_hash: str
    csrf: str
    flash: list[tuple[str, str]] = field(default_factory=list)  # (kind, message) to show now


def _key(cookie: str) -> str:
    return hashlib.sha256(cookie.encode("utf-8")).hexdigest()


@dataclass
class Sessions:
    """The console's sessions (in the database): how long they last, absolute and idle."""

    ttl: timedelta = DEFAULT_TTL
    idle: timedelta = DEFAULT_IDLE

    async def create(self, db: Database, token_hash: str) -> str:
        """A new session for a checked token; returns the cookie value (never stored)."""
        cookie = secrets.token_urlsafe(32)
        async with db.transaction() as tx:
            await tx.q("console_session_prune")
            await tx.q(
                "console_session_insert",
                {
                    "id_hash": _key(cookie),
                    "token_hash": token_hash,
                    "csrf": secrets.token_urlsafe(32),
                    "ttl": self.ttl.total_seconds(),
                    "idle": self.idle.total_seconds(),
                },
            )
        return cookie

    async def get(self, db: Database, cookie: str | None, *, take_flash: bool) -> Session | None:
        """The live session of ``cookie`` (its idle clock restarted), or None. With
        ``take_flash`` its pending messages are handed over (and cleared) for this page."""
        if not cookie or len(cookie) > 100:
            return None
        key = _key(cookie)
        async with db.transaction() as tx:
            rows = await tx.q("console_session_get", {"id_hash": key})
            if not rows:
                return None
            row = rows[0]
            flash = row["flash"]
            pending = json.loads(flash) if isinstance(flash, str) else list(flash)
            take = take_flash and bool(pending)
            await tx.q("console_session_touch", {"id_hash": key, "take": take})
        return Session(
            key=key,
            token_hash=str(row["token_hash"]),
            csrf=str(row["csrf"]),
            flash=[(str(k), str(m)) for k, m in pending] if take else [],
        )

    async def drop(self, db: Database, cookie: str | None) -> None:
        """Revoke the session of ``cookie`` (sign-out): every replica refuses it at once."""
        if cookie and len(cookie) <= 100:
            await db.run("console_session_revoke", {"id_hash": _key(cookie)})


@dataclass(frozen=True)
class User:
    """Who is signed in: the token's principal and the session (its CSRF token, flashes)."""

    principal: Principal
    session: Session

    @property
    def can_act(self) -> bool:
        return self.principal.allows("operator")

    @property
    def scoped(self) -> bool:
        return self.principal.partner is not None


def actor_of(principal: Principal) -> service.Actor:
    """The service actor of a console user: audited ``via console``."""
    return service.Actor(principal.name, "console", principal.partner)


def sessions(request: Request) -> Sessions:
    found: Sessions = request.app.state.ui_sessions
    return found


async def flash(request: Request, user: User, kind: str, message: str) -> None:
    """A one-time message (``kind``: ok, error, warn) for the next page this session shows,
    whichever replica shows it."""
    await database(request).run(
        "console_session_flash", {"id_hash": user.session.key, "kind": kind, "message": message}
    )


async def signed_in(request: Request) -> User:
    """The signed-in user (a dependency); :class:`SignInRequired` otherwise."""
    db = database(request)
    page_view = request.method == "GET" and not request.headers.get("hx-request")
    cookie = request.cookies.get(COOKIE)
    session = await sessions(request).get(db, cookie, take_flash=page_view)
    if session is None:
        raise SignInRequired()
    principal = await authenticate_hash(db, session.token_hash)
    if principal is None:  # revoked or expired since sign-in
        await sessions(request).drop(db, cookie)
        raise SignInRequired()
    request.state.principal = principal
    return User(principal, session)


def same_origin(request: Request) -> bool:
    """Whether the request says it comes from the page it was sent to: ``Origin`` (or, when a
    browser omits it, ``Referer``) must name the host of the request."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return False
    host = request.headers.get("host")
    return bool(host) and urlsplit(source).netloc.lower() == str(host).lower()


async def checked_post(request: Request) -> User:
    """A state-changing request of a signed-in user: same origin and the session's CSRF
    token, else 403 (a dependency of every console POST but sign-in)."""
    user = await signed_in(request)
    if not same_origin(request):
        raise Refused(403, "refused: this request did not come from the console's own page")
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        form = await request.form()
        value = form.get(CSRF_FIELD)
        sent = value if isinstance(value, str) else None
    if not sent or not hmac.compare_digest(sent, user.session.csrf):
        raise Refused(403, "refused: the form's CSRF token is missing or stale; reload the page")
    return user


async def operator(request: Request) -> User:
    """:func:`checked_post` for actions: a viewer gets 403 whatever the page showed."""
    user = await checked_post(request)
    if not user.can_act:
        raise Refused(403, "this action needs the operator role; this token is a viewer")
    return user
