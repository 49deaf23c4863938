"""The ERP stand-in's deduplication switch and its order finder: with deduplication off a
repeated create is a second order (what the call ledger must prevent), and the finder the
adapter's reconcile uses lists every order made for a requestId."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from jobfence_examples.purchase_orders.adapter import ORDERS_PATH, TOKEN_PATH
from jobfence_examples.purchase_orders.erp import ErpProcess, Switches


@pytest.fixture(scope="module")
def erp_off() -> Iterator[ErpProcess]:
    """A stand-in started with deduplication off (the switch given as a start flag)."""
    process = ErpProcess(Switches(deduplicate=False))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _token(http: httpx.Client) -> dict[str, str]:
    answer = http.post(
        TOKEN_PATH,
        data={"grant_type": "client_credentials"},
        auth=("jobfence-po", "stand-in-secret"),
    )
    answer.raise_for_status()
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


def _create(http: httpx.Client, auth: dict[str, str], request_id: str) -> httpx.Response:
    return http.post(ORDERS_PATH, json={"requestId": request_id, "lines": []}, headers=auth)


def test_deduplication_off_makes_a_second_order_and_the_finder_lists_both(
    erp_off: ErpProcess,
) -> None:
    erp_off.reset(Switches(deduplicate=False))
    with httpx.Client(base_url=erp_off.url, timeout=10) as http:
        assert http.get("/_control").json()["deduplicate"] is False
        auth = _token(http)
        first, second = _create(http, auth, "req-1"), _create(http, auth, "req-1")
        assert (first.status_code, second.status_code) == (201, 201)
        assert first.json()["OrderNumber"] != second.json()["OrderNumber"]
        found = http.get(ORDERS_PATH, params={"q": "requestId=req-1"}, headers=auth).json()
        assert found["count"] == 2
        assert [o["OrderNumber"] for o in found["items"]] == [
            first.json()["OrderNumber"],
            second.json()["OrderNumber"],
        ]
        none = http.get(ORDERS_PATH, params={"q": "requestId=req-2"}, headers=auth).json()
        assert none == {"items": [], "count": 0}
        counters: dict[str, Any] = http.get("/_stats").json()
    assert counters["orders_created"] == 2
    assert counters["duplicates"] == 1
    assert counters["deduplicated"] == 0
    assert counters["lookups"] == 2


def test_deduplication_on_answers_the_first_order_again(erp_off: ErpProcess) -> None:
    erp_off.reset(Switches())  # the default: on
    with httpx.Client(base_url=erp_off.url, timeout=10) as http:
        auth = _token(http)
        first, again = _create(http, auth, "req-1"), _create(http, auth, "req-1")
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json() == first.json()
        found = http.get(ORDERS_PATH, params={"q": "requestId=req-1"}, headers=auth).json()
        counters = http.get("/_stats").json()
    assert found["count"] == 1
    assert (counters["orders_created"], counters["duplicates"], counters["deduplicated"]) == (
        1,
        0,
        1,
    )


def test_the_finder_needs_a_token_and_a_request_id(erp_off: ErpProcess) -> None:
    erp_off.reset(Switches())
    with httpx.Client(base_url=erp_off.url, timeout=10) as http:
        assert http.get(ORDERS_PATH, params={"q": "requestId=x"}).status_code == 401
        auth = _token(http)
        refused = http.get(ORDERS_PATH, params={"q": "OrderNumber=PO1"}, headers=auth)
        assert refused.status_code == 400
        assert "requestId" in refused.json()["detail"]
