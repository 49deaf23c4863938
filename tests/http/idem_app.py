"""A small FastAPI app behind IdempotencyMiddleware, for the HTTP idempotency tests.

``POST /orders`` inserts a row into ``orders`` (the effect we count) after a short pause
that widens races; with the header ``X-Test-Hang: 1`` it waits forever instead (a request
in flight when its server dies; headers are not part of the request fingerprint).
``POST /flaky`` answers 503 the first time; ``GET /orders`` needs no key. Partners are
identified by bearer tokens ``token-a`` / ``token-b``; anything else is 401.

``POST /orders-queued`` (for ``claim_at_commit``) writes the same row without reading
anything back: while the key's transaction has not begun it queues the insert
(``execute_at_commit``), so the claim, the order, the stored answer and COMMIT go together.
With ``X-Test-Order-Unique`` the row's body is that header instead (``orders.body`` is unique
on PostgreSQL when it starts with ``unique:``: an app's own statement that conflicts).

Run as a process: ``python -m tests.http.idem_app DATABASE_URL LEASE_SECONDS [MODE]``
(``MODE``: ``claim_at_commit``) prints ``listening on http://…``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from jobfence.config import parse_database_url
from jobfence.db import Database, connect
from jobfence.http import IdempotencyMiddleware, idempotency_of

TOKENS = {"token-a": "partner-a", "token-b": "partner-b"}
ORDERS_DDL = {
    "postgresql": "CREATE TABLE IF NOT EXISTS orders (id integer GENERATED ALWAYS AS IDENTITY "
    "PRIMARY KEY, partner text NOT NULL, idem_key text, body text NOT NULL)",
    "sqlite": "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, partner TEXT NOT NULL, "
    "idem_key TEXT, body TEXT NOT NULL)",
}


UNIQUE_BODY = (
    "CREATE UNIQUE INDEX IF NOT EXISTS orders_unique_body ON orders (body) "
    "WHERE body LIKE 'unique:%'"
)


def _partner(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return TOKENS.get(token) if scheme.lower() == "bearer" else None


def make_app(
    database_url: str,
    *,
    lease: timedelta = timedelta(seconds=60),
    window: timedelta = timedelta(hours=24),
    pause: float = 0.05,
    one_transaction: bool = False,
    claim_at_commit: bool = False,
) -> FastAPI:
    url = parse_database_url(database_url)
    state: dict[str, Any] = {"flaky": 0}

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        db = connect(url)
        await db.open(max_size=8)
        async with db.transaction() as tx:
            await tx.execute(ORDERS_DDL[url.dialect])
            if url.dialect == "postgresql":
                await tx.execute(UNIQUE_BODY)
        state["db"] = db
        try:
            yield
        finally:
            await db.close()

    api = FastAPI(lifespan=lifespan)

    def db() -> Database:
        database: Database = state["db"]
        return database

    api.add_middleware(
        IdempotencyMiddleware,
        database=db,
        partner=_partner,
        lease=lease,
        window=window,
        one_transaction=one_transaction,
        claim_at_commit=claim_at_commit,
    )

    @api.post("/orders-queued")
    async def create_queued(request: Request) -> JSONResponse:
        partner = _partner(request)
        if partner is None:
            return JSONResponse({"detail": "unauthenticated"}, status_code=401)
        body = await request.json()
        await asyncio.sleep(pause)
        context = idempotency_of(request)
        assert context is not None
        assert context.transaction is not None
        tx = context.transaction
        state["deferred"] = state.get("deferred", 0) + tx.deferred
        text = request.headers.get("x-test-order-unique") or json.dumps(body, sort_keys=True)
        await tx.execute_at_commit(
            "INSERT INTO orders (partner, idem_key, body) VALUES (%s, %s, %s)",
            (partner, context.key, text),
        )
        return JSONResponse({"partner": partner, "echo": body}, status_code=201)

    @api.get("/deferred")
    async def deferred() -> dict[str, int]:
        """How many keyed requests this process ran on a transaction not begun yet."""
        return {"deferred": int(state.get("deferred", 0))}

    @api.post("/orders")
    async def create(request: Request) -> JSONResponse:
        partner = _partner(request)
        if partner is None:
            return JSONResponse({"detail": "unauthenticated"}, status_code=401)
        body = await request.json()
        if request.headers.get("x-test-hang"):
            await asyncio.Event().wait()
        await asyncio.sleep(pause)
        context = idempotency_of(request)
        p = "%s" if url.dialect == "postgresql" else "?"
        params = (partner, context.key if context else None, json.dumps(body, sort_keys=True))
        sql = f"INSERT INTO orders (partner, idem_key, body) VALUES ({p}, {p}, {p}) RETURNING id"
        if context is not None and context.transaction is not None:
            # one_transaction: the order commits with the key and the stored response
            row = await context.transaction.fetchone(sql, params)
        else:
            async with db().transaction() as tx:
                row = await tx.fetchone(sql, params)
        assert row is not None
        if request.headers.get("x-test-fail-after-write"):
            return JSONResponse({"detail": "failed after writing"}, status_code=500)
        return JSONResponse(
            {"order_id": row[0], "partner": partner, "echo": body},
            status_code=201,
            headers={"Location": f"/orders/{row[0]}", "X-Order-Partner": partner},
        )

    @api.post("/flaky")
    async def flaky() -> JSONResponse:
        state["flaky"] += 1
        if state["flaky"] == 1:
            return JSONResponse({"detail": "database hiccup"}, status_code=503)
        return JSONResponse({"attempt": state["flaky"]}, status_code=201)

    @api.get("/orders")
    async def listing() -> dict[str, int]:
        async with db().transaction() as tx:
            row = await tx.fetchone("SELECT count(*) FROM orders")
        assert row is not None
        return {"orders": int(row[0])}

    return api


def main() -> None:
    import socket

    import uvicorn

    database_url, lease = sys.argv[1], float(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = make_app(
        database_url, lease=timedelta(seconds=lease), claim_at_commit=mode == "claim_at_commit"
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.01)
        print(f"listening on http://127.0.0.1:{port}", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
