"""How a failed ``send`` is read (seed 004 §10.4): jobfence's exceptions, httpx's, statuses."""

from __future__ import annotations

import httpx
import pytest

from jobfence import (
    AuthenticationError,
    CallInDoubt,
    CallNotSent,
    CallRejected,
    CallRetry,
    CallUnauthorized,
    Category,
    ConfigurationError,
    IntegrationError,
    classify,
)
from jobfence.calls import check
from jobfence.calls.outcomes import Sent, reading

REQUEST = httpx.Request("POST", "http://erp.test/orders")


def answer(status: int, body: str = "") -> httpx.Response:
    return httpx.Response(status, text=body, request=REQUEST)


@pytest.mark.parametrize(
    ("status", "raised", "category"),
    [
        (401, CallUnauthorized, Category.AUTHENTICATION_ERROR),
        (422, CallRejected, Category.INTEGRATION_ERROR),
        (409, CallRejected, Category.INTEGRATION_ERROR),
        (429, CallNotSent, Category.TEMPORARY_ERROR),
        (408, CallInDoubt, Category.TEMPORARY_ERROR),
        (500, CallInDoubt, Category.TEMPORARY_ERROR),
        (503, CallInDoubt, Category.TEMPORARY_ERROR),
    ],
)
def test_check_raises_what_a_status_means(
    status: int, raised: type[Exception], category: Category
) -> None:
    with pytest.raises(raised) as caught:
        check(answer(status, "supplier 42 is blocked"))
    assert classify(caught.value) is category
    assert f"HTTP {status} from POST http://erp.test/orders: supplier 42 is blocked" in str(
        caught.value
    )


def test_a_success_passes_through() -> None:
    ok = answer(201, '{"id": "PO-1"}')
    assert check(ok) is ok


@pytest.mark.parametrize(
    ("exc", "read"),
    [
        (httpx.ConnectError("refused", request=REQUEST), Sent.NOT_SENT),
        (httpx.ConnectTimeout("slow dns", request=REQUEST), Sent.NOT_SENT),
        (httpx.PoolTimeout("no connection free", request=REQUEST), Sent.NOT_SENT),
        (httpx.ReadTimeout("no answer", request=REQUEST), Sent.IN_DOUBT),
        (httpx.WriteTimeout("half sent", request=REQUEST), Sent.IN_DOUBT),
        (httpx.RemoteProtocolError("dropped", request=REQUEST), Sent.IN_DOUBT),
        (httpx.ReadError("reset", request=REQUEST), Sent.IN_DOUBT),
        (
            httpx.HTTPStatusError("x", request=REQUEST, response=answer(404)),
            Sent.REJECTED,
        ),
        (
            httpx.HTTPStatusError("x", request=REQUEST, response=answer(502)),
            Sent.IN_DOUBT,
        ),
        (CallRejected("no", status=422), Sent.REJECTED),
        (CallUnauthorized("expired"), Sent.UNAUTHORIZED),
        (CallNotSent("refused"), Sent.NOT_SENT),
        (CallInDoubt("timeout"), Sent.IN_DOUBT),
        (KeyError("id"), Sent.IN_DOUBT),  # a bug reading the answer: it may have been sent
        (TimeoutError(), Sent.IN_DOUBT),
    ],
)
def test_every_failure_is_read_and_the_unknown_as_in_doubt(exc: Exception, read: Sent) -> None:
    assert reading(exc) is read


def test_the_exceptions_sit_in_the_taxonomy() -> None:
    assert isinstance(CallRejected("no"), IntegrationError)
    assert isinstance(CallUnauthorized("no"), AuthenticationError)
    assert CallRejected("no", status=422).code == "HTTP_422"


def test_the_in_process_retry_is_seed_10_3_and_checked() -> None:
    default = CallRetry()
    assert [default.delay(n) for n in (1, 2, 3, 4, 5, 6)] == [2, 4, 8, 16, 30, 30]
    with pytest.raises(ConfigurationError, match="attempts must be ≥ 1"):
        CallRetry(attempts=0)
    with pytest.raises(ConfigurationError, match="maximum ≥ initial"):
        CallRetry(initial=5, maximum=1)
