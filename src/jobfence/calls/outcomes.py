"""What a call's ``send`` can say happened, and how jobfence reads everything else (seed 004
§10.4, SPEC E3).

A ``send`` ends in one of four ways, each with its own exception (all :class:`HandlerError`
subclasses, so a handler that lets one through gets the taxonomy's treatment):

==========================  ==============================  ====================================
what happened               raise (or let httpx raise)      the step, and the job
==========================  ==============================  ====================================
the downstream said no      :class:`CallRejected`           ``failed``; INTEGRATION_ERROR, no
(a functional 4xx)          (httpx: 4xx status)             retry (the request had no effect)
401 Unauthorized            :class:`CallUnauthorized`       the ``refresh`` hook once and sent
                            (httpx: 401)                    again; then AUTHENTICATION_ERROR
the request never left      :class:`CallNotSent`            ``failed``; sent again after the
(connect error, 429)        (httpx: connect errors, 429)    in-process backoff, then TEMPORARY
it may have been applied    :class:`CallInDoubt`            ``in_doubt``: reconciled, sent
(timeout, reset, 5xx)       (httpx: read/write errors,      again where repeatable, or the job
                            timeouts, 5xx, 408)             is parked (UNKNOWN_OUTCOME)
==========================  ==============================  ====================================

Anything else ``send`` raises (a bug while reading the answer, an unknown library's error)
counts as **in doubt**: the request may have left, and jobfence never guesses that it did
not.
"""

from __future__ import annotations

import enum
from typing import Any

from ..errors import (
    AuthenticationError,
    IntegrationError,
    NonRetryableError,
    TemporaryError,
)

#: the error code of a dead letter parked because a call's outcome is unknown
UNKNOWN_OUTCOME = "UNKNOWN_OUTCOME"


class CallRejected(IntegrationError):
    """The downstream refused the request (a functional 4xx): it had no effect. The step is
    recorded ``failed``; the job is not retried (INTEGRATION_ERROR). ``status`` is the HTTP
    status when there is one."""

    def __init__(self, message: str = "", *, code: str | None = None, status: int | None = None):
        super().__init__(message, code=code or (f"HTTP_{status}" if status else "CALL_REJECTED"))
        self.status = status


class CallUnauthorized(AuthenticationError):
    """401: the credentials were refused and the request had no effect. jobfence runs the
    call's ``refresh`` hook once and sends again; a second 401 fails the job as an
    AUTHENTICATION_ERROR (one more delivery, for a token refreshed elsewhere)."""

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message, code=code or "HTTP_401")


class CallNotSent(TemporaryError):
    """The request did not leave (the connection was refused, a pool was full, a 429 said
    "not now"): nothing happened downstream. Sent again after the in-process backoff, then
    the job is retried (TEMPORARY_ERROR)."""

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message, code=code or "CALL_NOT_SENT")


class CallInDoubt(TemporaryError):
    """The request may have been applied and no answer says so (a timeout after sending, a
    reset connection, a 5xx). Raised by ``send`` to say so; raised by ``job.call`` when the
    doubt is still open after the in-process attempts (the job is retried and the next
    delivery resolves the doubt first)."""

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message, code=code or "CALL_IN_DOUBT")


class UnknownOutcome(NonRetryableError):
    """A call whose outcome is unknown and that jobfence may not repeat (no ``reconcile``,
    not ``repeatable``): the job is parked as a dead letter (NON_RETRYABLE_ERROR, code
    ``UNKNOWN_OUTCOME``) that names the step, the key and the last error, and waits for an
    operator to settle the call (applied / not applied) and replay the job."""

    def __init__(self, message: str, *, step: str, key: str) -> None:
        super().__init__(message, code=UNKNOWN_OUTCOME)
        self.step = step
        self.key = key


class Sent(enum.Enum):
    """How a failed ``send`` is read."""

    REJECTED = "rejected"
    UNAUTHORIZED = "unauthorized"
    NOT_SENT = "not_sent"
    IN_DOUBT = "in_doubt"


def reading(exc: BaseException) -> Sent:
    """What a failed ``send`` means for its request (module docstring): jobfence's own
    exceptions say it; httpx's are read by type and status; anything else is in doubt."""
    if isinstance(exc, CallUnauthorized):
        return Sent.UNAUTHORIZED
    if isinstance(exc, CallRejected):
        return Sent.REJECTED
    if isinstance(exc, CallNotSent):
        return Sent.NOT_SENT
    if isinstance(exc, CallInDoubt):
        return Sent.IN_DOUBT
    return _httpx_reading(exc) or Sent.IN_DOUBT


def status_reading(status: int) -> Sent | None:
    """An HTTP answer's status as a reading: None for a success (2xx/3xx)."""
    if status < 400:
        return None
    if status == 401:
        return Sent.UNAUTHORIZED
    if status == 429:
        return Sent.NOT_SENT  # "not now": the request was refused before any effect
    if status == 408 or status >= 500:
        return Sent.IN_DOUBT
    return Sent.REJECTED


def _httpx_reading(exc: BaseException) -> Sent | None:
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx is a dependency
        return None
    if isinstance(exc, httpx.HTTPStatusError):
        return status_reading(exc.response.status_code) or Sent.IN_DOUBT
    # the connection was never made, or no connection was free: the request did not leave
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Sent.NOT_SENT
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL | httpx.LocalProtocolError):
        return Sent.NOT_SENT  # refused by the client before anything was written
    return None  # read/write errors and timeouts, resets, protocol errors: in doubt


def check(response: Any) -> Any:
    """``response`` (an ``httpx.Response``) if its status is a success; else the exception
    that says what its status means (401 → :class:`CallUnauthorized`, 429 →
    :class:`CallNotSent`, 408 and 5xx → :class:`CallInDoubt`, other 4xx →
    :class:`CallRejected`), with the start of its body in the message::

        async def send(key: str) -> dict[str, str]:
            answer = check(await client.post(url, json=order, headers={"Idempotency-Key": key}))
            return {"reference": answer.json()["id"]}
    """
    status = int(response.status_code)
    read = status_reading(status)
    if read is None:
        return response
    try:
        body = response.text[:300]
    except Exception:  # a body that cannot be read as text says nothing more
        body = ""
    what = f"HTTP {status} from {response.request.method} {response.request.url}"
    message = f"{what}: {body}" if body else what
    if read is Sent.UNAUTHORIZED:
        raise CallUnauthorized(message)
    if read is Sent.NOT_SENT:
        raise CallNotSent(message, code=f"HTTP_{status}")
    if read is Sent.IN_DOUBT:
        raise CallInDoubt(message, code=f"HTTP_{status}")
    raise CallRejected(message, status=status)
