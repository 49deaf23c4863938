"""Bearer tokens for the ops HTTP API (SPEC K3): per-operator, hashed, with a role, an optional
partner scope and an expiry. Deny by default.

``require(role)`` is a FastAPI dependency usable by any FastAPI app whose
``app.state.jobfence_db`` is an opened :class:`jobfence.db.Database`::

    @api.post("/requests/{request_id}/retry")
    async def retry(request_id: str, who: Principal = Depends(require("operator"))) -> ...

- no ``Authorization: Bearer …`` header, an unknown, revoked or expired token → 401
- a ``viewer`` token on an ``operator`` route → 403
- scope checks (a partner's token asking for another partner's thing → 404) are the route's
  business: ``principal.partner`` is the scope (None: every partner).

Tokens are ``jfo_`` + 43 random URL-safe characters (256 bits); only their SHA-256 is stored,
so a leaked database does not leak usable tokens. :func:`create_token` returns the plain token
once (``jobfence ops token create`` prints it). Created or revoked by an actor (the CLI always
names one), a token is audited (``ops.token.create``, ``ops.token.revoke``) in its own
transaction: the token and its audit row commit together.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, cast

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..db import Database, is_unique_violation
from ..errors import TokenError
from ..review.deadletters import Actor, record

Role = Literal["viewer", "operator"]
ROLES: tuple[Role, ...] = ("viewer", "operator")
TOKEN_PREFIX = "jfo_"
MAX_NAME = 200

_bearer = HTTPBearer(auto_error=False, description="An ops token: `jobfence ops token create`.")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name, its role and its partner scope (None: all)."""

    name: str
    role: Literal["viewer", "operator"]
    partner: str | None

    def allows(self, role: Role) -> bool:
        """Operators can do what viewers can."""
        return role == "viewer" or self.role == "operator"

    def sees(self, partner: str | None) -> bool:
        """Whether something belonging to ``partner`` is inside this principal's scope."""
        return self.partner is None or self.partner == partner


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


async def authenticate(db: Database, token: str) -> Principal | None:
    """The principal of a plain token, or None when it is unknown, revoked or expired."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    return await authenticate_hash(db, hash_token(token))


async def authenticate_hash(db: Database, token_hash: str) -> Principal | None:
    """The principal of a token by its hash (what a console session keeps), or None when it
    is unknown, revoked or expired: a session ends when its token does."""
    rows = await db.run("ops_token_lookup", {"hash": token_hash})
    if not rows or rows[0]["expired"]:
        return None
    row = rows[0]
    return Principal(name=row["name"], role=cast(Role, row["role"]), partner=row["partner"])


def require(role: Literal["viewer", "operator"]) -> Callable[..., Awaitable[Principal]]:
    """A FastAPI dependency admitting tokens of ``role`` (or stronger); see the module doc."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")

    async def dependency(
        request: Request,
        credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    ) -> Principal:
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise _unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        db: Any = getattr(request.app.state, "jobfence_db", None)
        if not isinstance(db, Database):
            raise RuntimeError("app.state.jobfence_db must be an opened jobfence Database")
        principal = await authenticate(db, credentials.credentials)
        if principal is None:
            raise _unauthorized("unknown, revoked or expired token")
        if not principal.allows(role):
            raise HTTPException(
                status_code=403,
                detail=f"this route needs the {role} role; this token has {principal.role}",
            )
        request.state.principal = principal
        return principal

    dependency.__name__ = f"require_{role}"
    return dependency


async def create_token(
    db: Database,
    *,
    name: str,
    role: str,
    partner: str | None = None,
    expires_in: timedelta | None = None,
    actor: Actor | None = None,
    expiry_as: str | None = None,
) -> str:
    """Create a token and return it (the only time it is ever shown in full).

    With ``actor`` (as ``jobfence ops token create`` passes), the token and its audit row
    (``ops.token.create``) commit in one transaction: if either fails, neither exists.
    ``expiry_as`` is how the audit row states the expiry (default: the duration, e.g.
    ``30d``, or ``never``). Without ``actor`` nothing is audited (tests and demos minting
    their own tokens)."""
    if role not in ROLES:
        raise TokenError(f"role must be 'viewer' or 'operator', got {role!r}")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise TokenError(f"token name must be 1–{MAX_NAME} characters, not blank")
    if partner is not None and (not partner.strip() or len(partner) > MAX_NAME):
        raise TokenError(f"partner must be 1–{MAX_NAME} characters, not blank")
    if expires_in is not None and expires_in <= timedelta(0):
        raise TokenError("expires_in must be a positive duration")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    params = {
        "name": name.strip(),
        "hash": hash_token(token),
        "role": role,
        "partner": partner,
        "expires_in": expires_in.total_seconds() if expires_in is not None else None,
    }
    details = {
        "name": name,
        "role": role,
        "expires_in": expiry_as if expiry_as is not None else _duration(expires_in),
    }
    try:
        async with db.transaction() as tx:
            await tx.q("ops_token_insert", params)
            if actor is not None:
                await record(
                    tx,
                    actor,
                    "ops.token.create",
                    partner=partner,
                    details=details,
                    new_state="active",
                )
    except Exception as exc:
        if is_unique_violation(exc):
            raise TokenError(
                f"an active token named {name.strip()!r} exists; revoke it first or pick "
                "another name"
            ) from None
        raise
    return token


async def revoke_token(db: Database, name: str, *, actor: Actor | None = None) -> bool:
    """Revoke the active token called ``name``; False when there is none. With ``actor``, the
    revocation and its audit row (``ops.token.revoke``) commit in one transaction."""
    async with db.transaction() as tx:
        if not await tx.q("ops_token_revoke", {"name": name}):
            return False
        if actor is None:
            return True
        await record(
            tx,
            actor,
            "ops.token.revoke",
            details={"name": name},
            old_state="active",
            new_state="revoked",
        )
    return True


async def list_tokens(db: Database, *, include_revoked: bool = False) -> list[dict[str, Any]]:
    """Tokens without their hashes."""
    return [dict(row) for row in await db.run("ops_tokens_list", {"all": include_revoked})]


def _duration(span: timedelta | None) -> str:
    """``30d``, ``12h``, ``90m``, ``45s`` (the largest whole unit), or ``never``."""
    if span is None:
        return "never"
    seconds = span.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
