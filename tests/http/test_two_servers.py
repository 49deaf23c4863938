"""Several server processes (or hosts) on one database (issue 27): the key's uniqueness lives
in PostgreSQL, so two processes racing one key still make one effect."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from ..helpers import query
from .servers import start_server_process

A = {"Authorization": "Bearer token-a"}
ORDER = {"sku": "A-1", "quantity": 3}


async def test_two_server_processes_racing_one_key_make_one_order(pg_database: str) -> None:
    """32 identical POSTs with one key, half to each of two server processes at once: one
    order; one original 201, every other answer its replay or 409 IN_FLIGHT; no 5xx."""
    procs: list[Any] = []
    try:
        for _ in range(2):
            procs.append(
                await asyncio.to_thread(
                    start_server_process, "tests.http.idem_app", pg_database, "30"
                )
            )
        headers = {**A, "Idempotency-Key": "two-hosts"}
        async with (
            httpx.AsyncClient(base_url=procs[0][1], timeout=30) as one,
            httpx.AsyncClient(base_url=procs[1][1], timeout=30) as two,
        ):
            answers = await asyncio.gather(
                *(c.post("/orders", json=ORDER, headers=headers) for c in [one, two] * 16)
            )
            late = await two.post("/orders", json=ORDER, headers=headers)
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
    originals = [
        r for r in answers if r.status_code == 201 and "idempotent-replayed" not in r.headers
    ]
    replays = [r for r in answers if r.headers.get("idempotent-replayed") == "true"]
    in_flight = [r for r in answers if r.status_code == 409]
    assert await query(pg_database, "SELECT partner, idem_key FROM orders") == [
        ("partner-a", "two-hosts")
    ]
    assert len(originals) == 1
    assert len(originals) + len(replays) + len(in_flight) == 32
    assert {r.json()["code"] for r in in_flight} <= {"IDEMPOTENCY_KEY_IN_FLIGHT"}
    assert late.headers["idempotent-replayed"] == "true"
    assert late.json() == originals[0].json()
