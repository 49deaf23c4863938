"""`jobfence ops serve` through a PostgreSQL restart and an outage (issue 23): a request after
the restart never fails on a stale pooled connection, an unreachable database answers 503
problem+json (never a plain-text 500) while liveness stays up, and the server recovers by
itself. A private PostgreSQL instance (its own port and data), a real server process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobfence import App

from .contract.servers import PostgresServer
from .deadletters.conftest import letter_params, make_tokens, seed_letters
from .helpers import eventually
from .ops_servers import ops_servers

PROBLEM = "application/problem+json"


@pytest.fixture
def private_pg() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


async def _get_many(client: httpx.AsyncClient, path: str, n: int) -> list[httpx.Response]:
    return list(await asyncio.gather(*(client.get(path) for _ in range(n))))


async def test_ops_serve_survives_a_postgresql_restart_and_outage(
    private_pg: PostgresServer, tmp_path: Path
) -> None:
    url = private_pg.url
    await App(url).migrate()
    tokens = await make_tokens(url)
    await seed_letters(url, [letter_params("postgresql", f"o-{i}") for i in range(3)])
    async with (
        ops_servers(url, tmp_path) as (server,),
        httpx.AsyncClient(
            base_url=server.url,
            headers={"Authorization": f"Bearer {tokens.viewer}"},
            timeout=30,
        ) as client,
        httpx.AsyncClient(
            base_url=server.url, headers={"Origin": server.url}, timeout=30
        ) as console,
    ):
        signin = await console.post("/ui/login", data={"token": tokens.viewer})
        assert signin.status_code == 303
        # fill the pool: several connections, each of which the restart will leave stale
        for r in await _get_many(client, "/v1/dead-letters", 8):
            assert r.status_code == 200, r.text
        await asyncio.to_thread(private_pg.stop)  # a clean restart (pg_ctl stop -m fast)
        await asyncio.to_thread(private_pg.start)
        after = [
            *(await _get_many(client, "/v1/dead-letters", 8)),
            *[await client.get("/v1/dead-letters") for _ in range(12)],
        ]
        assert [r.status_code for r in after] == [200] * 20, [r.text for r in after][:3]
        assert all(len(r.json()["items"]) == 3 for r in after)

        await asyncio.to_thread(private_pg.kill)  # the database goes away
        for path in ("/v1/dead-letters", "/healthz", "/readyz", "/v1/stats"):
            r = await client.get(path)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert r.headers["content-type"] == PROBLEM, (path, r.headers)
            body = r.json()
            assert body["status"] == 503
            assert body["code"] == "UNAVAILABLE"
            assert body["title"] == "Database unavailable"
            assert r.headers["retry-after"] == "5"
        page = await console.get("/ui/dead-letters")  # the console: a page, not a crash
        assert page.status_code == 503
        assert page.headers["content-type"].startswith("text/html")
        assert "the database is unreachable" in page.text
        live = await client.get("/livez")
        assert live.status_code == 200  # liveness never asks the database
        assert server.proc.poll() is None

        await asyncio.to_thread(private_pg.start)  # back: no restart of the ops server

        async def recovered() -> bool:
            r = await client.get("/v1/dead-letters")
            assert r.status_code in (200, 503), r.text
            return r.status_code == 200

        await eventually(recovered, timeout=60, interval=0.2, what="the ops server to recover")
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ok"}
        page = await console.get("/ui/dead-letters")  # the session outlived the outage
        assert page.status_code == 200
        assert "o-2" in page.text
    assert "Traceback" not in server.output()
