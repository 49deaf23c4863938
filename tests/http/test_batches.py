"""Claims and completions of concurrent keyed requests share statements (jobfence.http.batch),
on real PostgreSQL; and what goes with a COMMIT (Tx.q_at_commit) commits or fails with it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest

from jobfence import outbox
from jobfence.config import parse_database_url
from jobfence.db import Database, connect
from jobfence.http import IdempotencyMiddleware
from jobfence.http.batch import Batches

from ..helpers import query, scalar

BODY = b'{"sku":"A-1"}'


class Counting:
    """A trivial ASGI app: counts its calls, pauses, answers 202 with the call's number."""

    def __init__(self, pause: float) -> None:
        self.calls = 0
        self.pause = pause

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        self.calls += 1
        number = str(self.calls).encode()
        await asyncio.sleep(self.pause)
        headers = [(b"content-type", b"text/plain"), (b"x-call", number)]
        await send({"type": "http.response.start", "status": 202, "headers": headers})
        await send({"type": "http.response.body", "body": b"call " + number})


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[Database]:
    db = connect(parse_database_url(url))
    await db.open(max_size=4)
    try:
        yield db
    finally:
        await db.close()


async def _post(client: httpx.AsyncClient, key: str) -> httpx.Response:
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    return await client.post("/orders", content=BODY, headers=headers)


async def test_concurrent_keyed_posts_share_their_claim_and_completion_statements(
    pg_database: str,
) -> None:
    app = Counting(pause=0.05)
    async with opened(pg_database) as db:
        middleware = IdempotencyMiddleware(app, database=db)
        transport = httpx.ASGITransport(app=middleware)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            answers = await asyncio.gather(*(_post(client, f"k{i}") for i in range(32)))
            replays = await asyncio.gather(*(_post(client, f"k{i}") for i in range(32)))
    assert [r.status_code for r in answers] == [202] * 32
    assert not any("idempotent-replayed" in r.headers for r in answers)
    assert app.calls == 32
    assert sorted(r.text for r in answers) == sorted(f"call {n}" for n in range(1, 33))
    assert [r.text for r in replays] == [r.text for r in answers]
    assert all(r.headers["idempotent-replayed"] == "true" for r in replays)
    assert all(
        r.headers["x-call"] == a.headers["x-call"] for r, a in zip(replays, answers, strict=True)
    )
    stored = await query(
        pg_database, "SELECT count(*) FROM core.idempotency_keys WHERE state = 'completed'"
    )
    assert stored == [(32,)]
    batches = middleware._batches
    assert batches is not None
    # 64 claims (32 executed, 32 replays found the key) and 32 completions, in fewer statements
    assert batches.claims.items == 64
    assert batches.claims.batches < 64
    assert batches.completions.items == 32
    assert batches.completions.batches < 32


async def test_a_duplicate_key_in_one_batch_runs_the_app_once(pg_database: str) -> None:
    app = Counting(pause=0.3)
    async with opened(pg_database) as db:
        middleware = IdempotencyMiddleware(app, database=db)
        transport = httpx.ASGITransport(app=middleware)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            answers = await asyncio.gather(*(_post(client, "same") for _ in range(8)))
            late = await _post(client, "same")
    assert app.calls == 1
    assert sorted(r.status_code for r in answers) == [202] + [409] * 7
    assert {r.json()["code"] for r in answers if r.status_code == 409} == {
        "IDEMPOTENCY_KEY_IN_FLIGHT"
    }
    assert late.status_code == 202
    assert late.headers["idempotent-replayed"] == "true"
    assert late.text == "call 1"


async def test_a_failing_batch_is_retried_one_by_one_and_fails_alone() -> None:
    async def many(items: list[int]) -> list[int]:
        if 13 in items:
            raise ValueError("a bad item spoils the statement")
        return [i * 2 for i in items]

    async def one(item: int) -> int:
        if item == 13:
            raise ValueError("bad item")
        return item * 2

    batches: Batches[int, int] = Batches(many, one)
    results = await asyncio.gather(
        *(batches.submit(i) for i in range(10, 20)), return_exceptions=True
    )
    assert [r if isinstance(r, int) else "error" for r in results] == [
        20, 22, 24, "error", 28, 30, 32, 34, 36, 38,
    ]  # fmt: skip
    assert batches.items == 10
    assert batches.batches < 10


async def test_what_goes_with_the_commit_fails_the_commit(pg_database: str) -> None:
    """An outbox event written at commit with an id already in the outbox: the commit fails
    and the transaction's other work rolls back with it; a fresh id commits with the work."""
    taken = str(uuid.uuid4())
    await query(pg_database, "CREATE TABLE effects (n int)")
    async with opened(pg_database) as db:
        async with db.work([], {}) as (tx, _):
            await outbox.write(tx, "q", {"n": 0}, event_id=taken)

        async def duplicate() -> None:
            async with db.work([], {}) as (tx, _):
                await tx.execute("INSERT INTO effects VALUES (1)")
                await outbox.write_at_commit(tx, "q", {"n": 1}, event_id=taken)
                # not sent yet: it goes with the COMMIT
                assert await scalar(pg_database, "SELECT count(*) FROM core.outbox") == 1

        with pytest.raises(psycopg.errors.UniqueViolation):
            await duplicate()
        async with db.work([], {}) as (tx, _):
            await tx.execute("INSERT INTO effects VALUES (2)")
            fresh = await outbox.write_at_commit(tx, "q", {"n": 2})
    assert await query(pg_database, "SELECT n FROM effects") == [(2,)]
    assert await query(pg_database, "SELECT event_id::text FROM core.outbox ORDER BY id") == [
        (taken,),
        (fresh,),
    ]
