"""``IdempotencyMiddleware(one_transaction=True)`` (issue 16 §1): the key's claim, the app's
writes and the stored response commit together, once. Through a real uvicorn server on
loopback and real PostgreSQL (and SQLite for the basic path)."""

from __future__ import annotations

import asyncio

import httpx

from ..helpers import query, scalar
from .idem_app import make_app
from .servers import serving

A = {"Authorization": "Bearer token-a"}
ORDER = {"sku": "A-1", "quantity": 3}


async def test_concurrent_posts_with_one_key_wait_for_the_first_and_get_its_answer(
    pg_database: str,
) -> None:
    """32 identical POSTs with one key at once: one order; the others wait for the first
    one's commit (its key row is locked) and replay its stored answer — no 409 in flight."""
    async with (
        serving(make_app(pg_database, pause=0.2, one_transaction=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        headers = {**A, "Idempotency-Key": "order-32"}
        answers = await asyncio.gather(
            *(client.post("/orders", json=ORDER, headers=headers) for _ in range(32))
        )
    originals = [r for r in answers if "idempotent-replayed" not in r.headers]
    assert {r.status_code for r in answers} == {201}
    assert len(originals) == 1
    assert all(r.json() == originals[0].json() for r in answers)
    assert await query(pg_database, "SELECT partner, idem_key FROM orders") == [
        ("partner-a", "order-32")
    ]


async def test_the_order_the_key_and_the_response_commit_together(pg_database: str) -> None:
    async with (
        serving(make_app(pg_database, pause=0, one_transaction=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        first = await client.post("/orders", json=ORDER, headers={**A, "Idempotency-Key": "k1"})
        again = await client.post("/orders", json=ORDER, headers={**A, "Idempotency-Key": "k1"})
    assert first.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    rows = await query(
        pg_database,
        "SELECT o.xmin::text = k.xmin::text, k.state, k.status_code FROM orders AS o "
        "JOIN core.idempotency_keys AS k ON k.key = o.idem_key",
    )
    assert rows == [(True, "completed", 201)]  # written by one transaction


async def test_a_5xx_rolls_back_the_apps_writes_and_frees_the_key(pg_database: str) -> None:
    async with (
        serving(make_app(pg_database, pause=0, one_transaction=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        key = {**A, "Idempotency-Key": "k-fail"}
        failed = await client.post(
            "/orders", json=ORDER, headers={**key, "X-Test-Fail-After-Write": "1"}
        )
        assert await scalar(pg_database, "SELECT count(*) FROM orders") == 0
        assert await scalar(pg_database, "SELECT count(*) FROM core.idempotency_keys") == 0
        retried = await client.post("/orders", json=ORDER, headers=key)
    assert failed.status_code == 500
    assert failed.json() == {"detail": "failed after writing"}
    assert retried.status_code == 201
    assert "idempotent-replayed" not in retried.headers
    assert await scalar(pg_database, "SELECT count(*) FROM orders") == 1


async def test_mismatch_and_replay_on_sqlite(sqlite_database: str) -> None:
    async with (
        serving(make_app(sqlite_database, pause=0, one_transaction=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        key = {**A, "Idempotency-Key": "k-lite"}
        first = await client.post("/orders", json=ORDER, headers=key)
        replay = await client.post("/orders", json=ORDER, headers=key)
        other = await client.post("/orders", json={"sku": "B"}, headers=key)
    assert first.status_code == 201
    assert replay.headers["idempotent-replayed"] == "true"
    assert other.status_code == 409
    assert other.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"
    assert await scalar(sqlite_database, "SELECT count(*) FROM orders") == 1
