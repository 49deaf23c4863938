"""The ERP adapter against the ERP stand-in process: each ERP answer read as what happened to
the request (recorded, rejected with its category, not sent, in doubt), the lookup by key that
resolves a doubt, the token refresh; and the adapter as a recorded step (``job.call``) over an
ERP that does not de-duplicate: a lost answer is looked up, never sent twice."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from jobfence import (
    App,
    AuthenticationError,
    AuthorizationError,
    BusinessError,
    CallInDoubt,
    CallNotSent,
    CallRejected,
    CallRetry,
    CallUnauthorized,
    Category,
    Job,
    Tx,
)
from jobfence.calls.outcomes import Sent, reading
from jobfence_examples.purchase_orders import ErpClient, ErpOrder, ErpSettings
from jobfence_examples.purchase_orders.adapter import STEP
from jobfence_examples.purchase_orders.erp import ErpProcess, Switches

from ..helpers import RunningWorker, eventually

DOC = {"company_id": "BU-1", "document_type": "STANDARD", "lines": [{"item": "X"}]}
FAST = CallRetry(attempts=3, initial=0.01, multiplier=2.0, maximum=0.05)


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
    erp_process.reset(Switches(deduplicate=False))
    return erp_process


async def control(url: str, **switches: Any) -> None:
    async with httpx.AsyncClient() as client:
        (await client.post(f"{url}/_control", json=switches)).raise_for_status()


async def stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        data: dict[str, Any] = (await client.get(f"{url}/_stats")).json()
        return data


@pytest.fixture
async def client(erp: ErpProcess) -> AsyncIterator[ErpClient]:
    made = ErpClient(ErpSettings(erp.url, timeout=0.3))
    await made.open()
    yield made
    await made.close()


async def test_a_created_order_is_its_reference(erp: ErpProcess, client: ErpClient) -> None:
    answer = await client.send_order("req-1", DOC)
    assert answer == {"reference": answer["reference"], "created": True}
    assert answer["reference"].startswith("PO")
    assert ErpOrder.of(answer) == ErpOrder(answer["reference"], True, "sent")
    found = await client.find_order("req-1")
    assert found == {"reference": answer["reference"], "created": True, "how": "found"}
    assert await client.find_order("req-2") is None


@pytest.mark.parametrize(
    ("switch", "kind", "category", "code"),
    [
        ("functional_rate", CallRejected, Category.INTEGRATION_ERROR, "ERP_HTTP_400"),
        ("business_rate", BusinessError, Category.BUSINESS_ERROR, "ERP_HTTP_409"),
    ],
)
async def test_refusals_are_rejections_of_their_category(
    erp: ErpProcess,
    client: ErpClient,
    switch: str,
    kind: type[Exception],
    category: Category,
    code: str,
) -> None:
    """A functional 400 and a business 409 had no effect: the step is failed, not retried,
    and the job's category is the taxonomy's for the answer."""
    await control(erp.url, **{switch: 1.0})
    with pytest.raises(kind) as caught:
        await client.send_order("req-func", DOC)
    assert reading(caught.value) is Sent.REJECTED
    assert caught.value.category is category  # type: ignore[attr-defined]
    assert caught.value.code == code  # type: ignore[attr-defined]
    assert (await stats(erp.url))["orders_created"] == 0


@pytest.mark.parametrize(
    ("switches", "code"),
    [
        ({"ambiguous_rate": 1.0}, "ERP_HTTP_500"),
        ({"timeout_rate": 1.0, "timeout_seconds": 1.0}, "ERP_TIMEOUT"),
    ],
)
async def test_an_answer_lost_after_the_create_is_in_doubt_and_found_by_key(
    erp: ErpProcess, client: ErpClient, switches: dict[str, Any], code: str
) -> None:
    """A 500 after the ERP created the order, a timeout after it: in doubt — and the
    lookup by the key finds the order the ERP made."""
    await control(erp.url, **switches)
    with pytest.raises(CallInDoubt) as caught:
        await client.send_order("req-lost", DOC)
    assert caught.value.code == code
    found = await client.find_order("req-lost")
    assert found is not None
    assert (await stats(erp.url))["orders_created"] == 1


async def test_503_is_in_doubt_and_the_lookup_says_not_there(
    erp: ErpProcess, client: ErpClient
) -> None:
    await control(erp.url, error_rate=1.0)
    with pytest.raises(CallInDoubt) as caught:
        await client.send_order("req-503", DOC)
    assert caught.value.code == "ERP_HTTP_503"
    assert await client.find_order("req-503") is None


async def test_a_401_is_unauthorized_and_the_refresh_gets_a_new_token(
    erp: ErpProcess, client: ErpClient
) -> None:
    await client.send_order("req-token-1", DOC)
    async with httpx.AsyncClient() as http:
        await http.post(f"{erp.url}/_expire_tokens")
    with pytest.raises(CallUnauthorized) as caught:
        await client.send_order("req-token-2", DOC)
    assert caught.value.code == "ERP_UNAUTHORIZED"
    await client.refresh_token()
    assert (await client.send_order("req-token-2", DOC))["created"] is True
    assert client.stats.token_refreshes == 1
    # the lookup refreshes by itself once
    async with httpx.AsyncClient() as http:
        await http.post(f"{erp.url}/_expire_tokens")
    assert await client.find_order("req-token-2") is not None
    assert client.stats.token_refreshes == 2


async def test_bad_client_credentials_are_an_authentication_rejection(erp: ErpProcess) -> None:
    client = ErpClient(ErpSettings(erp.url, client_secret="wrong"))
    await client.open()
    try:
        with pytest.raises(AuthenticationError) as caught:
            await client.send_order("req-creds", DOC)
    finally:
        await client.close()
    assert caught.value.code == "ERP_BAD_CREDENTIALS"
    assert reading(caught.value) is Sent.REJECTED  # no order request left


async def test_a_403_is_an_authorization_rejection() -> None:
    from jobfence_examples.purchase_orders.adapter import _refusal

    request = httpx.Request("POST", "http://erp/x")
    refused = _refusal(httpx.Response(403, json={"detail": "no"}, request=request))
    assert isinstance(refused, AuthorizationError)
    assert reading(refused) is Sent.REJECTED
    assert reading(_refusal(httpx.Response(429, request=request))) is Sent.NOT_SENT


async def test_an_unreachable_erp_is_not_sent() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        client = ErpClient(ErpSettings(f"http://127.0.0.1:{sock.getsockname()[1]}"))
        await client.open()
        try:
            with pytest.raises(CallNotSent) as caught:
                await client.send_order("req-down", DOC)
        finally:
            await client.close()
    assert caught.value.code == "ERP_UNREACHABLE"


async def test_as_a_recorded_step_a_lost_answer_is_found_never_sent_twice(
    erp: ErpProcess, client: ErpClient, database_url: str
) -> None:
    """Over an ERP that does not de-duplicate, every create answering 500 after creating
    the order: the step is in doubt, the lookup finds the order, the job goes on with it —
    one order, one create request; a redelivery gets the recorded order without a call."""
    await control(erp.url, ambiguous_rate=1.0)
    orders: list[ErpOrder] = []
    app = App(database_url)

    @app.consumer("po")
    async def handle(job: Job[Any], tx: Tx) -> None:
        async def send(key: str) -> dict[str, Any]:
            return await client.send_order(key, DOC)

        recorded = await job.call(
            STEP, send, reconcile=client.find_order, key=job.payload["request_id"], retry=FAST,
            refresh=client.refresh_token,
        )  # fmt: skip
        orders.append(ErpOrder.of(recorded))

    async with app:
        await app.enqueue("po", {"request_id": "req-step"}, job_id="evt-1")
        async with RunningWorker(app, poll_interval=0.05):
            await eventually(lambda: orders, timeout=30, what="the order")
    counters = await stats(erp.url)
    assert (counters["orders_created"], counters["order_calls"], counters["duplicates"]) == (
        1,
        1,
        0,
    )
    assert counters["lookups"] == 1
    assert orders[0].how == "found"
    [made] = (await _orders(erp.url)).values()
    assert orders[0].order_id == made["OrderNumber"]


async def _orders(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        data: dict[str, Any] = (await http.get(f"{url}/_orders")).json()
        return data
