"""HTTP ingestion idempotency (SPEC I1–I4): ``Idempotency-Key`` / ``X-Idempotency-Key`` for any
ASGI app. See :mod:`jobfence.http.idempotency` and ``docs/http-idempotency.md``."""

from .idempotency import IdempotencyMiddleware, idempotency_of
from .keys import (
    DEFAULT_LEASE,
    DEFAULT_WINDOW,
    IN_FLIGHT,
    MALFORMED,
    MISMATCH,
    MISSING,
    REPLAYED_HEADER,
    TOO_LARGE,
    IdempotencyContext,
    IdempotencyStore,
    KeyProblem,
    cleanup_keys,
    fingerprint_request,
    parse_key,
    problem_body,
)
from .sockets import tcp_listen_socket

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_WINDOW",
    "IN_FLIGHT",
    "MALFORMED",
    "MISMATCH",
    "MISSING",
    "REPLAYED_HEADER",
    "TOO_LARGE",
    "IdempotencyContext",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "KeyProblem",
    "cleanup_keys",
    "fingerprint_request",
    "idempotency_of",
    "parse_key",
    "problem_body",
    "tcp_listen_socket",
]
