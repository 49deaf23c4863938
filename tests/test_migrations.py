"""The numbered migrations produce exactly the declared schema, on both dialects; migrate is
idempotent and safe to run concurrently."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobfence import App, SchemaError
from jobfence.config import parse_database_url
from jobfence.db import Database, connect
from jobfence.sql import declared_schema, migrations
from jobfence.store import Store

PG_CATALOG = """
SELECT 'column', table_schema || '.' || table_name || '.' || column_name,
       concat_ws('|', data_type, is_nullable, column_default, is_identity, ordinal_position)
  FROM information_schema.columns WHERE table_schema = 'core'
UNION ALL
SELECT 'constraint', conrelid::regclass::text || '.' || conname, pg_get_constraintdef(c.oid)
  FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = 'core'
UNION ALL
SELECT 'index', schemaname || '.' || indexname, indexdef FROM pg_indexes WHERE schemaname = 'core'
UNION ALL
SELECT 'trigger', tgrelid::regclass::text || '.' || tgname, pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = r.relnamespace WHERE n.nspname = 'core' AND NOT t.tgisinternal
UNION ALL
SELECT 'function', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
       pg_get_functiondef(p.oid)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'core'
UNION ALL
SELECT 'view', schemaname || '.' || viewname, definition FROM pg_views WHERE schemaname = 'core'
UNION ALL
SELECT 'sequence', sequence_schema || '.' || sequence_name,
       concat_ws('|', data_type, start_value, increment)
  FROM information_schema.sequences WHERE sequence_schema = 'core'
ORDER BY 1, 2
"""


async def _open(url: str) -> Database:
    db = connect(parse_database_url(url))
    await db.open(max_size=2)
    return db


async def _pg_catalog(url: str) -> list[tuple[Any, ...]]:
    db = await _open(url)
    try:
        async with db.transaction() as tx:
            return await tx.fetchall(PG_CATALOG)
    finally:
        await db.close()


def _normal_sql(sql: str | None) -> str:
    sql = re.sub(r"--[^\n]*", "", sql or "")
    return re.sub(r"\s+", " ", sql).strip()


async def _sqlite_catalog(url: str) -> list[tuple[Any, ...]]:
    db = await _open(url)
    try:
        async with db.transaction() as tx:
            objects = await tx.fetchall(
                "SELECT type, name, tbl_name, sql FROM sqlite_master "
                "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
            )
            result: list[tuple[Any, ...]] = [(t, n, tb, _normal_sql(s)) for t, n, tb, s in objects]
            for kind, name, _, _ in objects:
                if kind == "table":
                    for column in await tx.fetchall(f"PRAGMA table_info('{name}')"):
                        result.append(("column", name, *column))
            return result
    finally:
        await db.close()


async def _apply_declared(url: str) -> None:
    db = await _open(url)
    try:
        async with db.transaction() as tx:
            await tx.script(declared_schema(db.dialect))
    finally:
        await db.close()


async def _migrate(url: str) -> list[int]:
    db = await _open(url)
    try:
        return await Store(db).migrate()
    finally:
        await db.close()


async def test_postgresql_migrations_equal_the_declared_schema(empty_pg_database: str) -> None:
    from .conftest import create_pg_database, drop_pg_database, pg_url

    applied = await _migrate(empty_pg_database)
    assert applied == [m.version for m in migrations("postgresql")]
    other = create_pg_database()
    try:
        await _apply_declared(pg_url(other))
        declared = await _pg_catalog(pg_url(other))
    finally:
        drop_pg_database(other)
    migrated = await _pg_catalog(empty_pg_database)
    assert len(migrated) > 20
    assert migrated == declared


async def test_sqlite_migrations_equal_the_declared_schema(tmp_path: Path) -> None:
    migrated_url = f"sqlite:///{tmp_path / 'migrated.db'}"
    declared_url = f"sqlite:///{tmp_path / 'declared.db'}"
    assert await _migrate(migrated_url) == [m.version for m in migrations("sqlite")]
    await _apply_declared(declared_url)
    migrated = await _sqlite_catalog(migrated_url)
    assert len(migrated) > 20
    assert migrated == await _sqlite_catalog(declared_url)


async def test_migrate_is_idempotent(database_url: str) -> None:
    """The fixtures' databases are migrated already: migrating again applies nothing."""
    assert await _migrate(database_url) == []
    app = App(database_url)
    assert await app.migrate() == []
    async with app:
        assert await app.store.schema_version() == len(migrations(app.url.dialect))


async def test_concurrent_migrations_apply_once(empty_pg_database: str) -> None:
    results = await asyncio.gather(*(_migrate(empty_pg_database) for _ in range(4)))
    everything = [m.version for m in migrations("postgresql")]
    assert sorted(results, key=len) == [[], [], [], everything]


async def test_postgresql_app_refuses_an_unmigrated_database(empty_pg_database: str) -> None:
    app = App(empty_pg_database)
    with pytest.raises(SchemaError, match="run `jobfence migrate"):
        await app.open()
    assert not app.is_open


async def test_sqlite_app_migrates_a_new_file_itself(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / f'{uuid.uuid4().hex}.db'}"
    async with App(url) as app:
        assert await app.store.schema_version() == len(migrations("sqlite"))


FENCE_PARTITIONS = next(m.version for m in migrations("postgresql") if m.name == "fence_partitions")


async def test_the_fence_table_becomes_partitioned_with_its_fences(empty_pg_database: str) -> None:
    """A database with fences in the unpartitioned table: the migration keeps every fence
    (the old table becomes one partition up to the midnight after its last expiry), they
    still fence their keys, new days come after it, and cleanup drops it whole once its last
    fence expired — but for a fence of a letter pending review, moved out first."""
    from jobfence.core.fence import claim_tx
    from jobfence.runtime.cleanup import cleanup_fences
    from jobfence.runtime.partitions import add_days

    url = empty_pg_database
    db = await _open(url)
    try:
        async with db.transaction() as tx:
            await tx.script(db.sql["create_migrations_table"])  # type: ignore[attr-defined]
            for m in migrations("postgresql"):
                if m.version < FENCE_PARTITIONS:
                    await tx.script(m.sql)
                    await tx.q("record_migration", {"version": m.version, "name": m.name})
            await tx.execute(
                "INSERT INTO core.processed_jobs (consumer, job_id, processed_at, expires_at) "
                "SELECT 'points', 'old-' || g, now() - interval '1 day', "
                "now() + g * interval '1 minute' FROM generate_series(1, 3000) AS g"
            )
            await tx.execute(
                "INSERT INTO core.dead_letters (queue, consumer, job_id, payload, payload_size, "
                "attempts, error_category, last_error) VALUES ('points', 'points', 'old-7', "
                "'\\x7b7d', 2, 6, 'TEMPORARY_ERROR', 'x')"
            )
        assert await Store(db).migrate() == [
            m.version for m in migrations("postgresql") if m.version >= FENCE_PARTITIONS
        ]
        async with db.transaction() as tx:
            parts = await tx.fetchall(
                "SELECT name, lower_bound = '-infinity', upper_bound FROM core.fence_partitions() "
                "ORDER BY 1"
            )
            last = (await tx.fetchall("SELECT max(expires_at) FROM core.processed_jobs"))[0][0]
            assert not await claim_tx(tx, "points", "old-2999", timedelta(days=7))
            assert await claim_tx(tx, "points", "new-1", timedelta(days=7))
        assert [p[0] for p in parts] == ["processed_jobs_default", "processed_jobs_legacy"]
        bound = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
        assert parts[1][1:] == (True, bound)
        assert await add_days(db, timedelta(days=7)) == 4
        async with db.transaction() as tx:
            assert (await tx.fetchall("SELECT count(*) FROM core.processed_jobs"))[0][0] == 3001
        clock = bound + timedelta(hours=1)
        after = await cleanup_fences(db, min_age=timedelta(minutes=30), now=clock)
        async with db.transaction() as tx:
            left = await tx.fetchall("SELECT job_id FROM core.processed_jobs ORDER BY 1")
            parts = await tx.fetchall("SELECT name FROM core.fence_partitions() ORDER BY 1")
    finally:
        await db.close()
    assert (after.days, after.deleted) == (1, 2999)
    assert left == [("new-1",), ("old-7",)]
    assert "processed_jobs_legacy" not in [p[0] for p in parts]


PARTITIONS_AND_RETENTION = next(
    m.version for m in migrations("postgresql") if m.name == "partitions_and_retention"
)


async def test_detached_days_and_letter_retention_keep_every_row(empty_pg_database: str) -> None:
    """A database before the migration with fences in day partitions (one day already
    expired) and dead letters old and new, pending and decided: the migration keeps every
    row, sets no retention (so cleanup removes no letter), and the next cleanup detaches and
    drops the expired day, keeping the fence of the letter pending review."""
    from jobfence.runtime.cleanup import cleanup_fences, expire_letters
    from jobfence.runtime.partitions import add_days

    url = empty_pg_database
    now = datetime.now(UTC)
    db = await _open(url)
    try:
        async with db.transaction() as tx:
            await tx.script(db.sql["create_migrations_table"])  # type: ignore[attr-defined]
            for m in migrations("postgresql"):
                if m.version < PARTITIONS_AND_RETENTION:
                    await tx.script(m.sql)
                    await tx.q("record_migration", {"version": m.version, "name": m.name})
        await add_days(db, timedelta(days=7), now - timedelta(days=7))  # last week's days
        await add_days(db, timedelta(days=7), now)
        async with db.transaction() as tx:
            await tx.execute(
                "INSERT INTO core.processed_jobs (consumer, job_id, processed_at, expires_at) "
                "SELECT 'points', 'f-' || g, now() - interval '9 days', "
                "now() - interval '2 days' + g * interval '1 second' "
                "FROM generate_series(1, 100) AS g"
            )
            await tx.execute(
                "INSERT INTO core.processed_jobs (consumer, job_id, processed_at, expires_at) "
                "SELECT 'points', 'live-' || g, now(), now() + interval '7 days' "
                "FROM generate_series(1, 50) AS g"
            )
            await tx.execute(
                "INSERT INTO core.dead_letters (queue, consumer, job_id, payload, payload_size, "
                "attempts, error_category, last_error, failed_at) SELECT 'points', 'points', "
                "'f-' || g, '\\x7b7d', 2, 6, 'TEMPORARY_ERROR', 'x', now() - g * interval "
                "'100 days' FROM generate_series(1, 4) AS g"
            )
            await tx.execute(
                "UPDATE core.dead_letters SET status = 'discarded', reviewed_at = now() - "
                "interval '90 days', reviewed_by = 'ops', review_reason = 'old' "
                "WHERE job_id IN ('f-2', 'f-3', 'f-4')"
            )
        assert await Store(db).migrate() == [
            m.version for m in migrations("postgresql") if m.version >= PARTITIONS_AND_RETENTION
        ]
        async with db.transaction() as tx:
            counts = await tx.fetchall(
                "SELECT (SELECT count(*) FROM core.processed_jobs), "
                "(SELECT count(*) FROM core.dead_letters), "
                "(SELECT count(*) FROM core.dead_letter_retention)"
            )
        expired = await expire_letters(db)
        cleaned = await cleanup_fences(db, min_age=timedelta(hours=1))
        async with db.transaction() as tx:
            left = await tx.fetchall(
                "SELECT job_id FROM core.processed_jobs WHERE job_id LIKE 'f-%' ORDER BY 1"
            )
            letters = await tx.fetchall("SELECT count(*) FROM core.dead_letters")
            detached = await tx.fetchall("SELECT count(*) FROM core.fence_partitions_detached()")
    finally:
        await db.close()
    assert counts == [(150, 4, 0)]
    assert expired == 0
    assert (cleaned.deleted, cleaned.days >= 1) == (99, True)
    assert left == [("f-1",)]  # its letter is pending review
    assert letters == [(4,)]
    assert detached == [(0,)]
