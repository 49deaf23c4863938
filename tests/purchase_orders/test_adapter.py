"""The ERP adapter against the ERP stand-in process: in-process retry (SPEC R5) with injected
timings, one token refresh on 401, and every ERP answer mapped onto the taxonomy (R4)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from jobfence import (
    AuthenticationError,
    BusinessError,
    IntegrationError,
    TemporaryError,
)
from jobfence_examples.purchase_orders import CallRetry, ErpClient, ErpSettings
from jobfence_examples.purchase_orders.erp import ErpProcess, Switches

DOC = {"company_id": "BU-1", "document_type": "STANDARD", "lines": [{"item": "X"}]}


@pytest.fixture(scope="module")
def erp_process() -> Iterator[ErpProcess]:
    """One stand-in process for the module, reset before each test."""
    process = ErpProcess(Switches())
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def erp(erp_process: ErpProcess) -> ErpProcess:
    erp_process.reset(Switches())
    return erp_process


class Sleeps:
    """An injected sleep: records the R5 intervals instead of waiting them, and can change
    the ERP's switches between attempts (what a recovering ERP looks like)."""

    def __init__(self, erp_url: str, then: dict[str, Any] | None = None) -> None:
        self.erp_url = erp_url
        self.then = then
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        if self.then is not None:
            await control(self.erp_url, **self.then)


async def control(url: str, **switches: Any) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{url}/_control", json=switches)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data


async def stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        data: dict[str, Any] = (await client.get(f"{url}/_stats")).json()
        return data


@pytest.fixture
async def client_for(erp: ErpProcess) -> AsyncIterator[Any]:
    made: list[ErpClient] = []

    async def make(sleeps: Sleeps, **settings: Any) -> ErpClient:
        client = ErpClient(ErpSettings(erp.url, **settings), sleep=sleeps)
        await client.open()
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


def test_call_retry_intervals_follow_r5() -> None:
    """R5: 2 s initial, ×2, at most 30 s; 3 attempts by default."""
    retry = CallRetry()
    assert retry.attempts == 3
    assert [retry.interval(n) for n in range(1, 7)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


async def test_three_attempts_with_r5_intervals_then_temporary_error(
    erp: ErpProcess, client_for: Any
) -> None:
    """An ERP answering 503 to everything: 3 calls, waits of 2 s and 4 s between them (the
    default R5 timings, injected), then TEMPORARY_ERROR for the broker-level retry."""
    await control(erp.url, error_rate=1.0)
    sleeps = Sleeps(erp.url)
    client = await client_for(sleeps)
    with pytest.raises(TemporaryError) as caught:
        await client.create_purchase_order("req-503", DOC)
    assert caught.value.code == "ERP_HTTP_503"
    assert sleeps.seconds == [2.0, 4.0]
    assert (await stats(erp.url))["order_calls"] == 3
    assert (await stats(erp.url))["orders_created"] == 0


async def test_transient_failure_then_success_within_the_call(
    erp: ErpProcess, client_for: Any
) -> None:
    """The first call fails with 503, the ERP recovers, the second call creates the order."""
    await control(erp.url, error_rate=1.0)
    sleeps = Sleeps(erp.url, then={"error_rate": 0.0})
    client = await client_for(sleeps)
    order = await client.create_purchase_order("req-recover", DOC)
    assert order.created is True
    assert order.order_id.startswith("PO")
    assert sleeps.seconds == [2.0]
    assert (await stats(erp.url))["order_calls"] == 2


async def test_ambiguous_500_and_timeout_are_retried_and_deduplicated_by_the_erp(
    erp: ErpProcess, client_for: Any
) -> None:
    """A 500 after the ERP created the order, then a timeout after it: the retries find the
    order the ERP already has (its de-duplication by requestId) — one order, not three."""
    await control(erp.url, ambiguous_rate=1.0)
    client = await client_for(
        Sleeps(erp.url, then={"ambiguous_rate": 0.0}), timeout=0.3, retry=CallRetry()
    )
    first = await client.create_purchase_order("req-ambiguous", DOC)
    await control(erp.url, timeout_rate=1.0, timeout_seconds=1.0)
    client2 = await client_for(
        Sleeps(erp.url, then={"timeout_rate": 0.0}), timeout=0.3, retry=CallRetry()
    )
    second = await client2.create_purchase_order("req-timeout", DOC)
    counters = await stats(erp.url)
    assert first.created is False
    assert second.created is False
    assert counters["orders_created"] == 2
    assert counters["deduplicated"] == 2
    assert counters["ambiguous"] == 1
    assert counters["timeouts"] == 1


async def test_one_token_refresh_on_401(erp: ErpProcess, client_for: Any) -> None:
    """An expired token: 401, one refresh, the call goes through; a refresh is not an
    attempt (no R5 wait)."""
    sleeps = Sleeps(erp.url)
    client = await client_for(sleeps)
    await client.create_purchase_order("req-token-1", DOC)
    async with httpx.AsyncClient() as http:
        await http.post(f"{erp.url}/_expire_tokens")
    order = await client.create_purchase_order("req-token-2", DOC)
    assert order.created is True
    assert client.stats.token_refreshes == 1
    assert sleeps.seconds == []
    counters = await stats(erp.url)
    assert counters["unauthorized"] == 1
    assert counters["tokens_issued"] == 2


async def test_401_after_the_refresh_is_an_authentication_error(
    erp: ErpProcess, client_for: Any
) -> None:
    """Tokens that are dead on arrival: 401, refresh, 401 again → AUTHENTICATION_ERROR."""
    await control(erp.url, token_ttl=0.0)
    client = await client_for(Sleeps(erp.url))
    with pytest.raises(AuthenticationError) as caught:
        await client.create_purchase_order("req-401", DOC)
    assert caught.value.code == "ERP_UNAUTHORIZED"
    assert client.stats.token_refreshes == 1
    assert (await stats(erp.url))["unauthorized"] == 2


async def test_bad_client_credentials_are_an_authentication_error(
    erp: ErpProcess, client_for: Any
) -> None:
    """The token endpoint refusing our client credentials → AUTHENTICATION_ERROR at once."""
    client = await client_for(Sleeps(erp.url), client_secret="wrong")
    with pytest.raises(AuthenticationError) as caught:
        await client.create_purchase_order("req-creds", DOC)
    assert caught.value.code == "ERP_BAD_CREDENTIALS"


@pytest.mark.parametrize(
    ("switch", "error", "code"),
    [
        ("functional_rate", IntegrationError, "ERP_HTTP_400"),
        ("business_rate", BusinessError, "ERP_HTTP_409"),
    ],
)
async def test_functional_answers_are_not_retried(
    erp: ErpProcess, client_for: Any, switch: str, error: type[Exception], code: str
) -> None:
    """A functional 400 (INTEGRATION_ERROR) or business 409 (BUSINESS_ERROR): one call, no
    in-process retry."""
    await control(erp.url, **{switch: 1.0})
    sleeps = Sleeps(erp.url)
    client = await client_for(sleeps)
    with pytest.raises(error) as caught:
        await client.create_purchase_order("req-func", DOC)
    assert getattr(caught.value, "code", None) == code
    assert sleeps.seconds == []
    assert (await stats(erp.url))["order_calls"] == 1


async def test_unreachable_erp_is_temporary() -> None:
    """Nothing listening: each of the 3 attempts fails to connect (to the token endpoint
    first) → TEMPORARY_ERROR ERP_UNREACHABLE after the R5 waits."""
    sleeps: list[float] = []

    async def record(seconds: float) -> None:
        sleeps.append(seconds)

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        client = ErpClient(
            ErpSettings(url, retry=CallRetry(initial=timedelta(seconds=0.5))), sleep=record
        )
        await client.open()
        try:
            with pytest.raises(TemporaryError) as caught:
                await client.create_purchase_order("req-down", DOC)
        finally:
            await client.close()
    assert caught.value.code == "ERP_UNREACHABLE"
    assert sleeps == [0.5, 1.0]
