"""HTTP idempotency keys (SPEC I1–I4) through a real uvicorn server on loopback and real
PostgreSQL (SQLite where noted). The effect counted is a row in ``orders``."""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta
from typing import Any

import httpx
import pytest

from jobfence.config import parse_database_url
from jobfence.db import connect
from jobfence.http import (
    IdempotencyMiddleware,
    KeyProblem,
    cleanup_keys,
    fingerprint_request,
    parse_key,
)

from ..helpers import eventually, query, scalar
from .idem_app import make_app
from .servers import serving, start_server_process

A = {"Authorization": "Bearer token-a"}
B = {"Authorization": "Bearer token-b"}
ORDER = {"sku": "A-1", "quantity": 3}


async def test_64_concurrent_posts_with_one_key_make_one_order_and_no_5xx(
    pg_database: str,
) -> None:
    """64 identical POSTs with one key at once: exactly one order; one original 201, every
    other answer the stored replay (same body, marked) or 409 IN_FLIGHT; never a 5xx."""
    async with (
        serving(make_app(pg_database, pause=0.2)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        headers = {**A, "Idempotency-Key": "order-64"}
        answers = await asyncio.gather(
            *(client.post("/orders", json=ORDER, headers=headers) for _ in range(64))
        )
        late = await client.post("/orders", json=ORDER, headers=headers)
    originals = [
        r for r in answers if r.status_code == 201 and "idempotent-replayed" not in r.headers
    ]
    replays = [r for r in answers if r.headers.get("idempotent-replayed") == "true"]
    in_flight = [r for r in answers if r.status_code == 409]
    assert await query(pg_database, "SELECT partner, idem_key FROM orders") == [
        ("partner-a", "order-64")
    ]
    assert len(originals) == 1
    assert len(originals) + len(replays) + len(in_flight) == 64
    assert {r.status_code for r in answers} <= {201, 409}
    assert all(r.json() == originals[0].json() for r in replays)
    assert {r.json()["code"] for r in in_flight} <= {"IDEMPOTENCY_KEY_IN_FLIGHT"}
    assert all(r.headers["content-type"] == "application/problem+json" for r in in_flight)
    assert all(r.headers["retry-after"] == "1" for r in in_flight)
    assert late.status_code == 201
    assert late.headers["idempotent-replayed"] == "true"
    assert late.json() == originals[0].json()


async def test_replay_returns_the_stored_status_headers_and_body(pg_database: str) -> None:
    """The replay carries the original status, body and headers (Location, custom ones),
    plus Idempotent-Replayed: true; the X-Idempotency-Key header names the same key."""
    async with (
        serving(make_app(pg_database, pause=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        first = await client.post("/orders", json=ORDER, headers={**A, "Idempotency-Key": "k1"})
        again = await client.post("/orders", json=ORDER, headers={**A, "X-Idempotency-Key": "k1"})
        quoted = await client.post("/orders", json=ORDER, headers={**A, "Idempotency-Key": '"k1"'})
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    for replay in (again, quoted):
        assert replay.status_code == 201
        assert replay.json() == first.json()
        assert replay.headers["location"] == first.headers["location"]
        assert replay.headers["x-order-partner"] == "partner-a"
        assert replay.headers["content-type"] == "application/json"
        assert replay.headers["idempotent-replayed"] == "true"
    assert await scalar(pg_database, "SELECT count(*) FROM orders") == 1


async def test_same_key_with_a_different_body_is_409_mismatch(pg_database: str) -> None:
    """Reusing a key for another request answers 409 IDEMPOTENCY_KEY_MISMATCH (problem+json)
    and creates nothing; the same JSON with other key order and spacing is the same request."""
    async with (
        serving(make_app(pg_database, pause=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        headers = {**A, "Idempotency-Key": "k-mismatch", "Content-Type": "application/json"}
        first = await client.post("/orders", content=b'{"sku":"A-1","quantity":3}', headers=headers)
        reordered = await client.post(
            "/orders", content=b'{ "quantity": 3,\n "sku": "A-1" }', headers=headers
        )
        other = await client.post("/orders", json={"sku": "A-1", "quantity": 4}, headers=headers)
        other_path = await client.post("/flaky", json=ORDER, headers=headers)
    assert first.status_code == 201
    assert reordered.headers["idempotent-replayed"] == "true"
    for refused in (other, other_path):
        assert refused.status_code == 409
        assert refused.headers["content-type"] == "application/problem+json"
        problem = refused.json()
        assert problem["code"] == "IDEMPOTENCY_KEY_MISMATCH"
        assert problem["status"] == 409
        assert problem["type"] == "urn:jobfence:problem:idempotency-key-mismatch"
    assert await scalar(pg_database, "SELECT count(*) FROM orders") == 1


async def test_another_partners_identical_key_is_independent(pg_database: str) -> None:
    """Partner B using partner A's key gets its own new order, never A's stored response;
    each partner's replay stays its own."""
    async with (
        serving(make_app(pg_database, pause=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        a1 = await client.post("/orders", json=ORDER, headers={**A, "Idempotency-Key": "shared"})
        b1 = await client.post("/orders", json=ORDER, headers={**B, "Idempotency-Key": "shared"})
        b2 = await client.post("/orders", json=ORDER, headers={**B, "Idempotency-Key": "shared"})
        b_other = await client.post(
            "/orders", json={"sku": "B"}, headers={**B, "Idempotency-Key": "shared"}
        )
    assert (a1.status_code, b1.status_code) == (201, 201)
    assert "idempotent-replayed" not in b1.headers
    assert a1.json()["partner"] == "partner-a"
    assert b1.json()["partner"] == "partner-b"
    assert a1.json()["order_id"] != b1.json()["order_id"]
    assert b2.json() == b1.json()
    assert b_other.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"
    assert await query(pg_database, "SELECT partner FROM orders ORDER BY id") == [
        ("partner-a",),
        ("partner-b",),
    ]


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "IDEMPOTENCY_KEY_MISSING"),
        ({"Idempotency-Key": ""}, "IDEMPOTENCY_KEY_MALFORMED"),
        ({"Idempotency-Key": "x" * 256}, "IDEMPOTENCY_KEY_MALFORMED"),
        ({"Idempotency-Key": "caf\u00e9"}, "IDEMPOTENCY_KEY_MALFORMED"),
        ({"Idempotency-Key": "one", "X-Idempotency-Key": "two"}, "IDEMPOTENCY_KEY_MALFORMED"),
    ],
    ids=["missing", "empty", "256-chars", "not-ascii", "two-different"],
)
async def test_missing_or_malformed_key_is_400(
    pg_database: str, headers: dict[str, str], code: str
) -> None:
    """No key, an empty one, one of 256 characters, a non-ASCII one or two different keys:
    400 problem+json with the code, and the app never runs."""
    encoded = {k: v.encode("utf-8") for k, v in headers.items()}
    async with (
        serving(make_app(pg_database, pause=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        response = await client.post("/orders", json=ORDER, headers={**A, **encoded})
        longest = await client.post(
            "/orders", json=ORDER, headers={**A, "Idempotency-Key": "y" * 255}
        )
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code
    assert longest.status_code == 201
    assert await scalar(pg_database, "SELECT count(*) FROM orders") == 1


async def test_expired_key_makes_a_new_request(pg_database: str) -> None:
    """A key expires 24 h after its first use (the default window); after that the same key
    and request create a new order, and cleanup deletes expired keys."""
    async with (
        serving(make_app(pg_database, pause=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        headers = {**A, "Idempotency-Key": "k-expire"}
        first = await client.post("/orders", json=ORDER, headers=headers)
        window = await query(
            pg_database,
            "SELECT extract(epoch FROM expires_at - created_at)::int FROM core.idempotency_keys",
        )
        await query(
            pg_database,
            "UPDATE core.idempotency_keys SET created_at = created_at - interval '25 hours', "
            "expires_at = expires_at - interval '25 hours'",
        )
        second = await client.post("/orders", json=ORDER, headers=headers)
        replay = await client.post("/orders", json=ORDER, headers=headers)
    assert window == [(86400,)]
    assert first.status_code == second.status_code == 201
    assert "idempotent-replayed" not in second.headers
    assert second.json()["order_id"] != first.json()["order_id"]
    assert replay.json() == second.json()
    assert await scalar(pg_database, "SELECT count(*) FROM orders") == 2


async def test_cleanup_deletes_only_expired_keys(pg_database: str) -> None:
    """Cleanup removes keys past their window in bounded batches and keeps live ones."""
    async with (
        serving(make_app(pg_database, pause=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        for n in range(5):
            await client.post("/orders", json=ORDER, headers={**A, "Idempotency-Key": f"c{n}"})
    await query(
        pg_database,
        "UPDATE core.idempotency_keys SET expires_at = now() - interval '1 second' "
        "WHERE key IN ('c0', 'c1', 'c2')",
    )
    db = connect(parse_database_url(pg_database))
    await db.open(max_size=1)
    try:
        deleted = await cleanup_keys(db, batch=2)
    finally:
        await db.close()
    assert deleted == 3
    assert await query(pg_database, "SELECT key FROM core.idempotency_keys ORDER BY key") == [
        ("c3",),
        ("c4",),
    ]


async def test_a_5xx_answer_is_not_stored_and_the_key_is_released(pg_database: str) -> None:
    """A 503 from the app is passed on but not kept: the same key then runs the request
    again and its 201 is what gets replayed."""
    async with (
        serving(make_app(pg_database, pause=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        headers = {**A, "Idempotency-Key": "k-flaky"}
        first = await client.post("/flaky", json={}, headers=headers)
        second = await client.post("/flaky", json={}, headers=headers)
        third = await client.post("/flaky", json={}, headers=headers)
    assert (first.status_code, second.status_code, third.status_code) == (503, 201, 201)
    assert second.json() == {"attempt": 2}
    assert third.json() == {"attempt": 2}
    assert third.headers["idempotent-replayed"] == "true"


async def test_unauthenticated_and_unmatched_requests_pass_through(pg_database: str) -> None:
    """Without a partner the app answers itself (401) and no key is stored; GET needs no key."""
    async with (
        serving(make_app(pg_database, pause=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        anonymous = await client.post("/orders", json=ORDER, headers={"Idempotency-Key": "k"})
        listing = await client.get("/orders", headers=A)
    assert anonymous.status_code == 401
    assert listing.json() == {"orders": 0}
    assert await scalar(pg_database, "SELECT count(*) FROM core.idempotency_keys") == 0


async def test_key_of_a_server_killed_mid_request_frees_after_its_lease(
    pg_database: str,
) -> None:
    """A server SIGKILLed while a request is in flight leaves its key in progress. While it
    lived it renewed the lease; after the kill a retry of the same request gets 409
    IN_FLIGHT until the 3 s lease runs out, then runs anew (201, not a replay)."""
    proc, url = await asyncio.to_thread(
        start_server_process, "tests.http.idem_app", pg_database, "3"
    )
    headers = {**A, "Idempotency-Key": "k-crash"}
    lease_sql = "SELECT lease_expires_at FROM core.idempotency_keys WHERE state = 'in_progress'"
    statuses: list[tuple[int, str]] = []
    try:
        async with (
            httpx.AsyncClient(base_url=url, timeout=60) as doomed,
            serving(make_app(pg_database, pause=0, lease=timedelta(seconds=3))) as url2,
            httpx.AsyncClient(base_url=url2) as client,
        ):
            pending = asyncio.create_task(
                doomed.post("/orders", json=ORDER, headers={**headers, "X-Test-Hang": "1"})
            )
            first_lease = await eventually(
                lambda: query(pg_database, lease_sql), what="the request in flight"
            )
            await eventually(
                lambda: _later(pg_database, lease_sql, first_lease[0][0]),
                what="the living server to renew its lease",
            )
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait, 10)
            with pytest.raises(httpx.HTTPError):
                await pending

            async def retry() -> httpx.Response | None:
                response = await client.post("/orders", json=ORDER, headers=headers)
                statuses.append((response.status_code, response.json().get("code", "")))
                return response if response.status_code != 409 else None

            took_over = await eventually(retry, interval=0.1, what="the key to free")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert statuses[0] == (409, "IDEMPOTENCY_KEY_IN_FLIGHT")
    assert set(statuses[:-1]) == {(409, "IDEMPOTENCY_KEY_IN_FLIGHT")}
    assert statuses[-1] == (201, "")
    assert "idempotent-replayed" not in took_over.headers
    assert await query(pg_database, "SELECT idem_key FROM orders") == [("k-crash",)]


async def _later(url: str, sql: str, than: Any) -> bool:
    rows = await query(url, sql)
    return bool(rows) and rows[0][0] > than


def test_parse_key_rules() -> None:
    """Keys: 1–255 printable ASCII characters, bare or as a structured-field string."""
    assert parse_key(["abc-123"]) == "abc-123"
    assert parse_key(['"abc 123"']) == "abc 123"
    assert parse_key(["same", "same"]) == "same"
    assert parse_key([" " + "k" * 255 + " "]) == "k" * 255
    for bad, code in (
        ([], "IDEMPOTENCY_KEY_MISSING"),
        ([""], "IDEMPOTENCY_KEY_MALFORMED"),
        (['""'], "IDEMPOTENCY_KEY_MALFORMED"),
        (["k" * 256], "IDEMPOTENCY_KEY_MALFORMED"),
        (["tab\there"], "IDEMPOTENCY_KEY_MALFORMED"),
        (["a", "b"], "IDEMPOTENCY_KEY_MALFORMED"),
    ):
        with pytest.raises(KeyProblem) as caught:
            parse_key(bad)
        assert caught.value.code == code


def test_fingerprint_covers_method_path_query_and_canonical_json() -> None:
    """The fingerprint ignores JSON key order and spacing but not values, paths or queries."""
    base = fingerprint_request("POST", "/orders", b"", b'{"a":1,"b":[1,2]}', "application/json")
    assert base == fingerprint_request(
        "post", "/orders", b"", b'{ "b": [1, 2], "a": 1 }', "application/json; charset=utf-8"
    )
    assert base != fingerprint_request(
        "POST", "/orders", b"", b'{"a":2,"b":[1,2]}', "application/json"
    )
    assert base != fingerprint_request(
        "POST", "/other", b"", b'{"a":1,"b":[1,2]}', "application/json"
    )
    assert base != fingerprint_request(
        "POST", "/orders", b"x=1", b'{"a":1,"b":[1,2]}', "application/json"
    )
    raw = fingerprint_request("POST", "/orders", b"", b"a b", "text/plain")
    assert raw != fingerprint_request("POST", "/orders", b"", b"a  b", "text/plain")


async def test_sqlite_store_replays_and_refuses_like_postgresql(sqlite_database: str) -> None:
    """The same middleware on SQLite (given a database URL): replay, mismatch, in-flight."""
    async with (
        serving(make_app(sqlite_database, pause=0.3)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        headers = {**A, "Idempotency-Key": "lite"}
        first, racing = await asyncio.gather(
            client.post("/orders", json=ORDER, headers=headers),
            client.post("/orders", json=ORDER, headers=headers),
        )
        replay = await client.post("/orders", json=ORDER, headers=headers)
        mismatch = await client.post("/orders", json={"sku": "Z"}, headers=headers)
    codes = sorted([first.status_code, racing.status_code])
    assert codes in ([201, 409], [201, 201])
    assert replay.headers["idempotent-replayed"] == "true"
    assert mismatch.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"
    assert await scalar(sqlite_database, "SELECT count(*) FROM orders") == 1


def test_middleware_refuses_a_lease_not_shorter_than_the_window() -> None:
    """Configuration that cannot work is refused up front, in one line."""
    from jobfence import ConfigurationError

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    with pytest.raises(ConfigurationError, match="must be shorter than the key window"):
        IdempotencyMiddleware(
            app, database="sqlite:///x.db", lease=timedelta(hours=1), window=timedelta(hours=1)
        )
