"""Console sessions: an ops token becomes an HttpOnly, SameSite=Strict session cookie.

- Sign-in checks the token (:func:`jobfence.ops.auth.authenticate`) and keeps only its hash in
  a server-side session; the cookie holds a random session id (256 bits) and nothing else.
- Every request re-checks the token by its hash, so revoking or expiring the token ends its
  sessions at once; a session also ends after ``ttl`` (absolute) or ``idle`` without a request,
  and at sign-out (the server forgets it: a copied cookie is useless afterwards).
- Every state-changing request must carry the session's CSRF token (form field ``csrf`` or
  header ``X-CSRF-Token``) and come from the console's own origin (``Origin``, else
  ``Referer``, must name the host the request was sent to). SameSite=Strict already keeps the
  cookie off cross-site requests; the two checks hold even where it would not.

Sessions live in the server's memory: restarting ``jobfence ops serve`` signs everyone out, and
several replicas behind one address need sticky sessions (docs/ops-console.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit

from fastapi import Request

from ..auth import Principal, authenticate_hash
from ..deps import database

COOKIE = "jobfence_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
DEFAULT_TTL = timedelta(hours=8)
DEFAULT_IDLE = timedelta(hours=1)
MAX_SESSIONS = 10_000


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
    token_hash: str
    csrf: str
    expires: float  # monotonic seconds: the absolute end
    seen: float  # monotonic seconds: the last request
    flash: list[tuple[str, str]] = field(default_factory=list)  # (kind, message)


@dataclass
class Sessions:
    """The server's sessions, by the SHA-256 of their cookie value."""

    ttl: timedelta = DEFAULT_TTL
    idle: timedelta = DEFAULT_IDLE
    _by_id: dict[str, Session] = field(default_factory=dict)

    @staticmethod
    def _key(cookie: str) -> str:
        return hashlib.sha256(cookie.encode("utf-8")).hexdigest()

    def create(self, token_hash: str) -> str:
        """A new session for a checked token; returns the cookie value."""
        now = time.monotonic()
        self._prune(now)
        cookie = secrets.token_urlsafe(32)
        self._by_id[self._key(cookie)] = Session(
            token_hash=token_hash,
            csrf=secrets.token_urlsafe(32),
            expires=now + self.ttl.total_seconds(),
            seen=now,
        )
        return cookie

    def get(self, cookie: str | None) -> Session | None:
        if not cookie or len(cookie) > 100:
            return None
        key = self._key(cookie)
        found = self._by_id.get(key)
        now = time.monotonic()
        if found is None:
            return None
        if now >= found.expires or now - found.seen >= self.idle.total_seconds():
            del self._by_id[key]
            return None
        found.seen = now
        return found

    def drop(self, cookie: str | None) -> None:
        if cookie:
            self._by_id.pop(self._key(cookie), None)

    def _prune(self, now: float) -> None:
        idle = self.idle.total_seconds()
        for key, s in list(self._by_id.items()):
            if now >= s.expires or now - s.seen >= idle:
                del self._by_id[key]
        while len(self._by_id) >= MAX_SESSIONS:  # the oldest go first
            del self._by_id[next(iter(self._by_id))]


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


def sessions(request: Request) -> Sessions:
    found: Sessions = request.app.state.ui_sessions
    return found


async def signed_in(request: Request) -> User:
    """The signed-in user (a dependency); :class:`SignInRequired` otherwise."""
    session = sessions(request).get(request.cookies.get(COOKIE))
    if session is None:
        raise SignInRequired()
    principal = await authenticate_hash(database(request), session.token_hash)
    if principal is None:  # revoked or expired since sign-in
        sessions(request).drop(request.cookies.get(COOKIE))
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
