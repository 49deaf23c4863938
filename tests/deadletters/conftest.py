"""Fixtures for the dead-letter tests: seeding letters through the store's own statement, a
real ops API server on loopback, and a real HTTP server standing in for BetterStack."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jobfence import App
from jobfence.config import parse_database_url
from jobfence.db import Database, connect
from jobfence.ops.app import create_app
from jobfence.ops.auth import create_token
from jobfence.review.letters import partner_of


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[Database]:
    db = connect(parse_database_url(url))
    await db.open(max_size=4)
    try:
        yield db
    finally:
        await db.close()


def letter_params(
    dialect: str,
    job_id: str,
    *,
    queue: str = "points.credit",
    consumer: str | None = None,
    payload: bytes | None = None,
    category: str = "TEMPORARY_ERROR",
    error: str = "TemporaryError: ERP answered 503",
    code: str | None = "TemporaryError",
    correlation_id: str | None = None,
    truncated: bool = False,
) -> dict[str, Any]:
    """Parameters of the store's own ``insert_dead_letter`` statement."""
    data = (
        payload if payload is not None else json.dumps({"member_id": job_id, "points": 1}).encode()
    )
    kept = data[: len(data) // 2] if truncated else data
    return {
        "queue": queue,
        "consumer": consumer or queue,
        "job_id": job_id,
        "correlation_id": correlation_id or f"corr-{job_id}",
        "payload": kept,
        "payload_size": len(data),
        "payload_truncated": truncated,
        "attempts": 6,
        "category": category,
        "error_code": code,
        "error": error,
        "history": "[]",
        "enqueued_at": None,
        "partner": partner_of(data),
        "trace": None,
        "trace_context": None,
    }


async def seed_letters(url: str, letters: Sequence[dict[str, Any]]) -> list[int]:
    """Insert dead letters (as :func:`letter_params` builds them) in one transaction."""
    async with opened(url) as db, db.transaction() as tx:
        ids = []
        for params in letters:
            rows = await tx.q("insert_dead_letter", params)
            ids.append(int(rows[0]["id"]))
    return ids


async def seed_many(url: str, letters: Sequence[dict[str, Any]]) -> None:
    """Bulk insert (batched by the driver) for big seeds."""
    async with opened(url) as db, db.transaction() as tx:
        await tx.qmany("insert_dead_letter", letters)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Run an ASGI app under uvicorn on a loopback port; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if not server.started:
            await task  # raises what stopped it
            raise AssertionError("the server did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=30)


@dataclass
class Tokens:
    viewer: str
    operator: str
    partner_a: str  # operator scoped to partner "acme"
    partner_b_viewer: str  # viewer scoped to partner "globex"
    expired: str


@dataclass
class OpsServer:
    url: str
    database_url: str
    tokens: Tokens
    app: App

    def client(self, token: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30)


async def make_tokens(url: str) -> Tokens:
    async with opened(url) as db:
        tokens = Tokens(
            viewer=await create_token(db, name="vera", role="viewer"),
            operator=await create_token(db, name="otto", role="operator"),
            partner_a=await create_token(db, name="acme-ops", role="operator", partner="acme"),
            partner_b_viewer=await create_token(
                db, name="globex-view", role="viewer", partner="globex"
            ),
            expired=await create_token(
                db, name="old", role="operator", expires_in=timedelta(milliseconds=1)
            ),
        )
    return tokens


@pytest.fixture
async def ops(database_url: str) -> AsyncIterator[OpsServer]:
    """The ops API on a real loopback server over the database under test (both stores)."""
    tokens = await make_tokens(database_url)
    app = App(database_url)
    async with serve(create_app(jobfence_app=app, max_body=16 * 1024)) as url:
        yield OpsServer(url, database_url, tokens, app)
    await app.close()


# -- a stand-in for BetterStack (and any webhook) --------------------------------------------


@dataclass
class SinkStandIn:
    """Records every request; ``mode`` is "ok" (201), "fail" (500) or "hang" (answers late)."""

    mode: str = "ok"
    requests: list[dict[str, Any]] = field(default_factory=list)
    hang_seconds: float = 5.0
    url: str = ""

    def asgi(self) -> Starlette:
        async def incidents(request: Request) -> Response:
            body = await request.body()
            self.requests.append(
                {
                    "path": request.url.path,
                    "headers": dict(request.headers),
                    "body": body.decode(),
                    "json": json.loads(body),
                    "mode": self.mode,
                }
            )
            if self.mode == "fail":
                return JSONResponse({"errors": "internal"}, status_code=500)
            if self.mode == "hang":
                await asyncio.sleep(self.hang_seconds)
            return JSONResponse({"data": {"id": str(len(self.requests))}}, status_code=201)

        return Starlette(
            routes=[
                Route("/api/v3/incidents", incidents, methods=["POST"]),
                Route("/hook", incidents, methods=["POST"]),
            ]
        )

    def accepted(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["mode"] == "ok"]


@pytest.fixture
async def sink() -> AsyncIterator[SinkStandIn]:
    stand_in = SinkStandIn()
    async with serve(stand_in.asgi()) as url:
        stand_in.url = url
        yield stand_in
