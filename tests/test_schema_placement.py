"""Issue 12 §11: ``core`` is a default schema, not a fixed one, and ``jobfence migrate --sql``
prints the migrations for teams that apply schema changes with their own tool."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from jobfence import App
from jobfence.errors import BusinessError, ConfigurationError
from jobfence.sql import migrations

from .helpers import RunningWorker, eventually, query, scalar
from .test_cli import jf, one_line_error


async def tables_in(url: str, schema: str) -> set[str]:
    rows = await query(
        url, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    )
    return {r[0] for r in rows}


async def test_a_whole_life_in_another_schema(empty_pg_database: str) -> None:
    """migrate, enqueue, work, fence, dead letter — all in ``acme_jobs``; ``core`` is never
    created."""
    url = empty_pg_database
    made = jf("migrate", "--database-url", url, "--schema", "acme_jobs")
    assert made.returncode == 0, made.stderr
    assert {"jobs", "processed_jobs", "dead_letters"} <= await tables_in(url, "acme_jobs")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE ledger (job_id text PRIMARY KEY)")

    app = App(url, schema="acme_jobs")

    @app.consumer("points.credit")
    async def credit(job: object, tx: object) -> None:
        job_id = job.job_id  # type: ignore[attr-defined]
        await tx.execute("INSERT INTO ledger (job_id) VALUES (%s)", (job_id,))  # type: ignore[attr-defined]
        if job_id == "bad":
            raise BusinessError("no such member")

    async with app:
        await app.enqueue("points.credit", {}, job_id="good")
        await app.enqueue("points.credit", {}, job_id="good")  # a duplicate delivery
        await app.enqueue("points.credit", {}, job_id="bad")
        async with RunningWorker(app):
            await eventually(
                lambda: scalar(url, "SELECT count(*) = 1 FROM acme_jobs.dead_letters"),
                what="the dead letter",
            )
            await eventually(
                lambda: scalar(url, "SELECT count(*) = 0 FROM acme_jobs.jobs"), what="drained"
            )
    assert await query(url, "SELECT job_id FROM ledger") == [("good",)]
    assert await scalar(url, "SELECT count(*) FROM acme_jobs.processed_jobs") == 1
    assert await scalar(url, "SELECT to_regnamespace('core') IS NULL")

    # the CLI reads the same schema from the environment
    listed = jf(
        "dead-letters", "list", "--json",
        env={"JOBFENCE_DATABASE_URL": url, "JOBFENCE_SCHEMA": "acme_jobs"},
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert '"job_id": "bad"' in listed.stdout
    # and without it, the default schema is not there: one line saying how to migrate
    line = one_line_error(jf("dead-letters", "list", "--database-url", url))
    assert "schema version 0" in line


async def test_two_schemas_in_one_database_do_not_see_each_other(
    empty_pg_database: str,
) -> None:
    url = empty_pg_database
    for schema in ("tenant_a", "tenant_b"):
        assert jf("migrate", "--database-url", url, "--schema", schema).returncode == 0
    async with App(url, schema="tenant_a") as a:
        await a.enqueue("q", {}, job_id="only-in-a")
    assert await scalar(url, "SELECT count(*) FROM tenant_a.jobs") == 1
    assert await scalar(url, "SELECT count(*) FROM tenant_b.jobs") == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--schema", "Acme-Jobs"], "schema name 'Acme-Jobs' is not usable"),
        (["--schema", "1jobs"], "not starting with a digit"),
    ],
)
def test_a_bad_schema_name_is_one_line(args: list[str], expected: str, pg_database: str) -> None:
    assert expected in one_line_error(jf("migrate", "--database-url", pg_database, *args))


def test_sqlite_has_no_schemas(tmp_path: Path) -> None:
    line = one_line_error(
        jf("migrate", "--database-url", f"sqlite:///{tmp_path / 'x.db'}", "--schema", "acme")
    )
    assert "SQLite has no schemas" in line
    with pytest.raises(ConfigurationError, match="SQLite has no schemas"):
        App(f"sqlite:///{tmp_path / 'y.db'}", schema="acme")


async def test_migrate_sql_applied_by_another_tool_is_what_jobfence_expects(
    empty_pg_database: str,
) -> None:
    """The printed script, run as a migration tool would (one transaction), leaves the
    database at jobfence's version: `jobfence migrate` then has nothing to do, and it works."""
    printed = jf("migrate", "--sql", "--schema", "flyway_jobs")
    assert printed.returncode == 0, printed.stderr
    script = printed.stdout
    assert script.startswith("-- jobfence migrations 1..")
    assert "core." not in script
    async with await psycopg.AsyncConnection.connect(empty_pg_database, autocommit=True) as conn:
        await conn.execute(script)  # type: ignore[arg-type]
    again = jf("migrate", "--database-url", empty_pg_database, "--schema", "flyway_jobs", "--json")
    assert again.returncode == 0, again.stderr
    assert '"applied": []' in again.stdout
    async with App(empty_pg_database, schema="flyway_jobs") as app:
        await app.enqueue("q", {"ok": True}, job_id="j")
    assert await scalar(empty_pg_database, "SELECT count(*) FROM flyway_jobs.jobs") == 1


async def test_migrate_sql_after_a_version_prints_only_what_is_pending(
    empty_pg_database: str,
) -> None:
    last = len(migrations("postgresql"))
    printed = jf("migrate", "--sql", "--after", str(last - 1))
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.count("INSERT INTO core.schema_migrations") == 1
    assert f"-- jobfence migrations {last}..{last} " in printed.stdout


def test_migrate_sql_for_sqlite(tmp_path: Path) -> None:
    printed = jf("migrate", "--sql", "--dialect", "sqlite")
    assert printed.returncode == 0, printed.stderr
    path = tmp_path / "flyway.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(printed.stdout)
    again = jf("migrate", "--database-url", f"sqlite:///{path}", "--json")
    assert again.returncode == 0, again.stderr
    assert '"applied": []' in again.stdout
