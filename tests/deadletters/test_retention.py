"""Decided dead letters past a retention the owner sets (PostgreSQL, issue 27): none is set by
default and nothing goes; once the owner sets one, the workers' cleanup removes the letters
decided and failed longer ago than that (with their replay items) — never a letter pending
review, never one a later letter replays — and a DELETE of a decided letter is still refused
to every role."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from jobfence.runtime.cleanup import expire_letters

from ..helpers import query
from .conftest import letter_params, opened, seed_letters
from .test_cleanup import review

NOW = datetime.now(UTC)


async def aged(url: str, job_id: str, failed_days_ago: int) -> int:
    """A letter pending review that failed ``failed_days_ago`` days ago; its id."""
    (letter,) = await seed_letters(url, [letter_params("postgresql", job_id)])
    await query(
        url,
        "UPDATE core.dead_letters SET failed_at = %s WHERE id = %s",
        (NOW - timedelta(days=failed_days_ago), letter),
    )
    return letter


async def letters(url: str) -> list[str]:
    return [r[0] for r in await query(url, "SELECT job_id FROM core.dead_letters ORDER BY id")]


async def test_without_a_retention_every_letter_stays(pg_database: str) -> None:
    """The default: no retention row, and a letter decided two years ago stays."""
    url = pg_database
    old = await aged(url, "decided-long-ago", 800)
    await review(url, old, "discarded", NOW - timedelta(days=790))
    async with opened(url) as db:
        assert await expire_letters(db) == 0
    assert await letters(url) == ["decided-long-ago"]


async def test_decided_letters_past_the_retention_go_pending_ones_never(pg_database: str) -> None:
    """Retention 30 days, batches of 2: the letters decided and failed more than 30 days ago
    go (one with the replay item that replayed it); a letter pending review for 90 days
    stays, so do one decided 10 days ago and an old replayed one whose later letter (its
    replay failed again) is pending. A DELETE of a decided letter is still refused."""
    url = pg_database
    gone = [await aged(url, f"old-{n}", 60 + n) for n in range(3)]
    for n, letter in enumerate(gone):
        await review(url, letter, "discarded" if n else "replayed", NOW - timedelta(days=50))
    pending = await aged(url, "pending-90-days", 90)
    recent = await aged(url, "decided-recently", 40)
    await review(url, recent, "replayed", NOW - timedelta(days=10))
    replayed = await aged(url, "replayed-then-failed", 70)
    await review(url, replayed, "replayed", NOW - timedelta(days=65))
    again = await aged(url, "replayed-then-failed", 64)
    await query(
        url, "UPDATE core.dead_letters SET previous_id = %s WHERE id = %s", (replayed, again)
    )
    await query(
        url,
        "WITH r AS (INSERT INTO core.replays (created_by, filter, total, expires_at) "
        "VALUES ('alice', '{}', 1, now()) RETURNING id) "
        "INSERT INTO core.replay_items (replay_id, dead_letter_id) SELECT id, %s FROM r",
        (gone[0],),
    )
    await query(url, "INSERT INTO core.dead_letter_retention (decided_for) VALUES ('30 days')")

    async with opened(url) as db:
        assert await expire_letters(db, batch=2) == 3
        assert await expire_letters(db, batch=2) == 0

    assert await letters(url) == [
        "pending-90-days", "decided-recently", "replayed-then-failed", "replayed-then-failed"
    ]  # fmt: skip
    assert await query(url, "SELECT count(*) FROM core.replay_items") == [(0,)]
    assert pending
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="evidence"):
        await query(url, "DELETE FROM core.dead_letters WHERE id = %s", (recent,))


async def test_a_replayed_letter_goes_once_its_later_letter_went(pg_database: str) -> None:
    """A chain of two decided letters past the retention goes whole: the later letter in one
    batch, the one it replayed (no longer referenced) in the next."""
    url = pg_database
    first = await aged(url, "chain", 100)
    await review(url, first, "replayed", NOW - timedelta(days=99))
    second = await aged(url, "chain", 98)
    await query(url, "UPDATE core.dead_letters SET previous_id = %s WHERE id = %s", (first, second))
    await review(url, second, "discarded", NOW - timedelta(days=97))
    await query(url, "INSERT INTO core.dead_letter_retention (decided_for) VALUES ('30 days')")
    async with opened(url) as db:
        assert await expire_letters(db, batch=1) == 2
    assert await letters(url) == []
