"""A time window of dead letters (``since``/``until``, issue 16 §3): exact whatever the order
the letters failed in, paged by cursor, on both stores; on PostgreSQL the page is read
between the window's lowest and highest ids (dl_search_window), not by walking every newer
letter."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobfence.review import deadletters as dl
from jobfence.sql import queries

from ..helpers import table
from .conftest import letter_params, opened, seed_letters

BASE = datetime(2026, 6, 1, tzinfo=UTC)
ACTOR = dl.Actor("test")


def at(url: str, moment: datetime) -> Any:
    return moment if url.startswith("postgresql") else moment.timestamp()


async def seed_scrambled(url: str, n: int) -> dict[int, tuple[datetime, str]]:
    """``n`` letters in two queues whose failed_at is a shuffle of ``n`` minutes: id order
    and time order disagree everywhere. Returns id → (failed_at, queue)."""
    dialect = "postgresql" if url.startswith("postgresql") else "sqlite"
    queues = ["orders" if i % 3 else "audit" for i in range(n)]
    ids = await seed_letters(
        url, [letter_params(dialect, f"job-{i}", queue=queues[i]) for i in range(n)]
    )
    minutes = list(range(n))
    random.Random(16).shuffle(minutes)
    p = "%s" if dialect == "postgresql" else "?"
    out = {}
    async with opened(url) as db, db.transaction() as tx:
        for letter_id, minute, queue in zip(ids, minutes, queues, strict=True):
            when = BASE + timedelta(minutes=minute)
            await tx.execute(
                f"UPDATE {table(url, 'dead_letters')} SET failed_at = {p} WHERE id = {p}",
                (at(url, when), letter_id),
            )
            out[letter_id] = (when, queue)
    return out


async def every_page(url: str, flt: dl.Filter, limit: int) -> list[int]:
    found: list[int] = []
    cursor = None
    async with opened(url) as db:
        while True:
            page = await dl.search(db, flt, actor=ACTOR, limit=limit, before=cursor)
            found.extend(letter.id for letter in page.items)
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor


async def test_a_window_finds_exactly_its_letters_in_any_order_page_by_page(
    database_url: str,
) -> None:
    letters = await seed_scrambled(database_url, 120)
    windows = [
        (BASE + timedelta(minutes=10), BASE + timedelta(minutes=40), None),
        (BASE + timedelta(minutes=10), BASE + timedelta(minutes=40), "audit"),
        (None, BASE + timedelta(minutes=25), None),
        (BASE + timedelta(minutes=100), None, None),
        (BASE + timedelta(minutes=55), BASE + timedelta(minutes=56), None),  # one letter
        (BASE - timedelta(days=1), BASE, None),  # before every letter: none
        (BASE + timedelta(days=1), None, "orders"),  # after every letter: none
    ]
    for since, until, queue in windows:
        want = sorted(
            (
                i
                for i, (when, q) in letters.items()
                if (since is None or when >= since)
                and (until is None or when < until)
                and (queue is None or q == queue)
            ),
            reverse=True,
        )
        flt = dl.Filter(since=since, until=until, queue=queue, status="all")
        for limit in (7, 50):
            assert await every_page(database_url, flt, limit) == want, (since, until, queue)
    # with a job_id, its own index serves (dl_search): the same answer
    since = BASE + timedelta(minutes=60)
    for n in range(6):
        letter_id = sorted(letters)[n]  # job-n
        want = [letter_id] if letters[letter_id][0] >= since else []
        flt = dl.Filter(since=since, job_id=f"job-{n}", status="all")
        assert await every_page(database_url, flt, 5) == want


def _rows_read(url: str, name: str, params: dict[str, Any]) -> int:
    """Rows the scans of the named search query read (returned + filtered out)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + queries("postgresql")[name],  # type: ignore[arg-type]
            params,
        ).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    read = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal read
        if "Scan" in node["Node Type"] and node["Node Type"] != "CTE Scan":
            per_loop = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            read += int(per_loop * node.get("Actual Loops", 1))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return read


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_window_far_back_reads_its_letters_not_every_newer_one(database_url: str) -> None:
    """20 000 letters one a minute; a window of 200 of them 15 000 back. The window's page
    reads about the window (ids, then 50 rows), where the plain search walked the primary
    key over the ~15 000 newer letters."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO core.dead_letters (queue, consumer, job_id, payload, payload_size, "
            "attempts, error_category, last_error, status, failed_at) "
            "SELECT 'orders', 'orders', 'job-' || g, '\\x7b7d', 2, 1, 'TEMPORARY_ERROR', 'x', "
            "'pending_review', %s + g * interval '1 minute' FROM generate_series(1, 20000) g",
            (BASE,),
        )
        conn.execute("VACUUM ANALYZE core.dead_letters")
    since = BASE + timedelta(minutes=5000)
    flt = dl.Filter(since=since, until=since + timedelta(minutes=200), status="all").check()
    async with opened(database_url) as db:
        params = {**flt.params(db, None), "before": None, "limit": 50}
        page = await dl.search(db, flt, actor=ACTOR)
    assert len(page.items) == 50
    assert page.items[0].failed_at == since + timedelta(minutes=199)
    window = _rows_read(database_url, "dl_search_window", params)
    plain = _rows_read(database_url, "dl_search", params)
    assert window <= 2 * 200 + 50, window
    assert plain > 10_000, plain  # what the window query is there for
