"""``IdempotencyMiddleware(claim_at_commit=True)`` (issue 27): the key is looked up first (a
stored answer is replayed from that read), the app runs on a transaction that has sent
nothing, and the key's claim, the app's queued writes, the stored answer and COMMIT go in
one round trip — concurrent requests' in one transaction. Through real uvicorn servers on
loopback and real PostgreSQL; two server processes race one key."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ..helpers import query, scalar
from .idem_app import make_app
from .servers import serving, start_server_process

A = {"Authorization": "Bearer token-a"}
ORDER = {"sku": "A-1", "quantity": 3}


def _split(answers: list[httpx.Response]) -> tuple[list[httpx.Response], list[httpx.Response]]:
    originals = [r for r in answers if "idempotent-replayed" not in r.headers]
    replays = [r for r in answers if r.headers.get("idempotent-replayed") == "true"]
    return originals, replays


async def test_the_claim_the_order_and_the_answer_commit_in_one_transaction(
    pg_database: str,
) -> None:
    async with (
        serving(make_app(pg_database, pause=0, claim_at_commit=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        key = {**A, "Idempotency-Key": "k1"}
        first = await client.post("/orders-queued", json=ORDER, headers=key)
        again = await client.post("/orders-queued", json=ORDER, headers=key)
        other = await client.post("/orders-queued", json={"sku": "B"}, headers=key)
        deferred = (await client.get("/deferred")).json()["deferred"]
    assert first.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"  # from the look-up, app not run
    assert again.json() == first.json()
    assert other.status_code == 409
    assert other.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"
    assert deferred == 1  # the app ran once, on a transaction that had sent nothing
    rows = await query(
        pg_database,
        "SELECT o.xmin::text = k.xmin::text, k.state, k.status_code FROM orders AS o "
        "JOIN core.idempotency_keys AS k ON k.key = o.idem_key",
    )
    assert rows == [(True, "completed", 201)]


async def test_concurrent_keys_share_one_commit(pg_database: str) -> None:
    """24 POSTs with their own keys at once: 24 orders, each with its key and answer, and
    fewer transactions than requests (requests that wait for the commit of others go in the
    next one together)."""
    async with (
        serving(make_app(pg_database, pause=0.05, claim_at_commit=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        answers = await asyncio.gather(
            *(
                client.post("/orders-queued", json=ORDER, headers={**A, "Idempotency-Key": f"c{i}"})
                for i in range(24)
            )
        )
    assert [r.status_code for r in answers] == [201] * 24
    assert await scalar(pg_database, "SELECT count(*) FROM orders") == 24
    together = await query(
        pg_database,
        "SELECT count(*) FROM orders AS o JOIN core.idempotency_keys AS k "
        "ON k.key = o.idem_key AND k.xmin::text = o.xmin::text AND k.state = 'completed'",
    )
    assert together == [(24,)]
    transactions = await scalar(pg_database, "SELECT count(DISTINCT xmin::text) FROM orders")
    assert transactions < 24


async def test_a_conflicting_write_fails_only_its_own_request(pg_database: str) -> None:
    """Two of 16 concurrent requests write a row that can exist once: the shared commit
    fails, each request is committed alone, and only the second of the two fails (500, its
    key not stored: a retry may run it again)."""
    async with (
        serving(make_app(pg_database, pause=0.05, claim_at_commit=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):

        async def post(i: int) -> httpx.Response:
            headers = {**A, "Idempotency-Key": f"u{i}"}
            if i in (3, 11):
                headers["X-Test-Order-Unique"] = "unique:the-one"
            return await client.post("/orders-queued", json=ORDER, headers=headers)

        answers = await asyncio.gather(*(post(i) for i in range(16)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [201] * 15 + [500]
    failed = next(i for i, r in enumerate(answers) if r.status_code == 500)
    assert failed in (3, 11)
    assert await scalar(pg_database, "SELECT count(*) FROM orders") == 15
    keys = await query(
        pg_database, "SELECT key FROM core.idempotency_keys WHERE state = 'completed'"
    )
    assert sorted(k for (k,) in keys) == sorted(f"u{i}" for i in range(16) if i != failed)


async def test_one_key_at_once_makes_one_order_and_replays_it(pg_database: str) -> None:
    async with (
        serving(make_app(pg_database, pause=0.05, claim_at_commit=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        headers = {**A, "Idempotency-Key": "same"}
        answers = await asyncio.gather(
            *(client.post("/orders-queued", json=ORDER, headers=headers) for _ in range(32))
        )
    originals, replays = _split(answers)
    assert {r.status_code for r in answers} == {201}
    assert len(originals) == 1
    assert len(replays) == 31
    assert await query(pg_database, "SELECT partner, idem_key FROM orders") == [
        ("partner-a", "same")
    ]


async def test_a_5xx_commits_nothing_and_frees_the_key(pg_database: str) -> None:
    """``/orders`` reads its row back, so its transaction begins (the claim goes with the
    insert); the 500 after it rolls both back."""
    async with (
        serving(make_app(pg_database, pause=0, claim_at_commit=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        key = {**A, "Idempotency-Key": "k-fail"}
        failed = await client.post(
            "/orders", json=ORDER, headers={**key, "X-Test-Fail-After-Write": "1"}
        )
        assert await scalar(pg_database, "SELECT count(*) FROM orders") == 0
        assert await scalar(pg_database, "SELECT count(*) FROM core.idempotency_keys") == 0
        retried = await client.post("/orders", json=ORDER, headers=key)
        again = await client.post("/orders", json=ORDER, headers=key)
    assert failed.status_code == 500
    assert retried.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == retried.json()
    assert await scalar(pg_database, "SELECT count(*) FROM orders") == 1


@pytest.mark.parametrize("path", ["/orders-queued", "/orders"])
async def test_two_server_processes_racing_one_key_make_one_order(
    pg_database: str, path: str
) -> None:
    """32 identical POSTs with one key, half to each of two server processes at once: one
    order; one original answer, every other one its replay (no 409: a key is never seen in
    progress, its claim commits with its answer); no 5xx. ``/orders-queued`` sends its
    claim with COMMIT, ``/orders`` with its first statement."""
    procs: list[Any] = []
    try:
        for _ in range(2):
            procs.append(
                await asyncio.to_thread(
                    start_server_process,
                    "tests.http.idem_app",
                    pg_database,
                    "30",
                    "claim_at_commit",
                )
            )
        headers = {**A, "Idempotency-Key": "two-hosts"}
        async with (
            httpx.AsyncClient(base_url=procs[0][1], timeout=30) as one,
            httpx.AsyncClient(base_url=procs[1][1], timeout=30) as two,
        ):
            answers = await asyncio.gather(
                *(c.post(path, json=ORDER, headers=headers) for c in [one, two] * 16)
            )
            late = await one.post(path, json=ORDER, headers=headers)
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
    originals, replays = _split(answers)
    assert {r.status_code for r in answers} == {201}
    assert len(originals) == 1
    assert len(replays) == 31
    assert all(r.json() == originals[0].json() for r in replays)
    assert await query(pg_database, "SELECT partner, idem_key FROM orders") == [
        ("partner-a", "two-hosts")
    ]
    assert late.headers["idempotent-replayed"] == "true"


async def test_on_sqlite_it_is_one_transaction(sqlite_database: str) -> None:
    """No deferred transactions on SQLite: the key is claimed first, the queued insert runs
    at once in its transaction; the answers are the same."""
    async with (
        serving(make_app(sqlite_database, pause=0, claim_at_commit=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        key = {**A, "Idempotency-Key": "k1"}
        first = await client.post("/orders-queued", json=ORDER, headers=key)
        again = await client.post("/orders-queued", json=ORDER, headers=key)
        other = await client.post("/orders-queued", json={"sku": "B"}, headers=key)
        deferred = (await client.get("/deferred")).json()["deferred"]
    assert first.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert other.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"
    assert deferred == 0
    assert await scalar(sqlite_database, "SELECT count(*) FROM orders") == 1
