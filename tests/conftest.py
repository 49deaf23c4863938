"""Shared fixtures: a fresh PostgreSQL database per test (cloned from a migrated template)
and a fresh SQLite file per test. Real servers only; nothing is mocked."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import pytest

from jobfence.config import parse_database_url
from jobfence.db import connect
from jobfence.logs import FOREIGN_LOGGERS
from jobfence.store import Store

PG_ADMIN = os.environ.get("JOBFENCE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def pg_url(dbname: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0]
    return f"{base}/{dbname}"


def _admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def create_pg_database(template: str | None = None) -> str:
    name = f"jf_test_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return name


def drop_pg_database(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _migrate(url: str) -> None:
    db = connect(parse_database_url(url))
    await db.open(max_size=1)
    try:
        await Store(db).migrate()
    finally:
        await db.close()


class Clones:
    """Clones of one template database, made and dropped in a background thread.

    A clone takes about half a second and a drop a tenth, mostly PostgreSQL copying and
    syncing files; done while the tests run, the next clone is ready when its test asks.
    Each clone is still fresh (made from the template, used by one test, then dropped); a
    failed clone fails the test that takes it, a failed drop fails the session's end."""

    def __init__(self, template: str) -> None:
        self.template = template
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-clones")
        self._next: Future[str] | None = None
        self._drops: list[Future[None]] = []

    def take(self) -> str:
        """The name of a fresh clone (the one made ahead, if any); starts making the next."""
        ready = self._next or self._background.submit(create_pg_database, self.template)
        self._next = self._background.submit(create_pg_database, self.template)
        return ready.result()

    def give_back(self, name: str) -> None:
        """Drop a clone (in the background: the next test need not wait for it)."""
        self._drops = [drop for drop in self._drops if not drop.done() or drop.exception()]
        self._drops.append(self._background.submit(drop_pg_database, name))

    def close(self) -> None:
        """Drop the clone made ahead and nobody took; wait for every drop."""
        if self._next is not None:
            self.give_back(self._next.result())
        self._background.shutdown(wait=True)
        for drop in self._drops:
            drop.result()


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated database that every test's database is cloned from."""
    name = create_pg_database()
    try:
        asyncio.run(_migrate(pg_url(name)))
        yield name
    finally:
        drop_pg_database(name)


@pytest.fixture(scope="session")
def pg_clones(pg_template: str) -> Iterator[Clones]:
    clones = Clones(pg_template)
    try:
        yield clones
    finally:
        clones.close()


@pytest.fixture
def pg_database(pg_clones: Clones) -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database, dropped after the test."""
    name = pg_clones.take()
    try:
        yield pg_url(name)
    finally:
        pg_clones.give_back(name)


@pytest.fixture
def empty_pg_database() -> Iterator[str]:
    name = create_pg_database()
    try:
        yield pg_url(name)
    finally:
        drop_pg_database(name)


@pytest.fixture
def sqlite_database(tmp_path: object) -> str:
    """URL of a fresh SQLite file (migrated on first open)."""
    path = os.path.join(str(tmp_path), f"jf-{uuid.uuid4().hex[:8]}.db")
    asyncio.run(_migrate(f"sqlite:///{path}"))
    return f"sqlite:///{path}"


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs on both stores."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_database"))
    return str(request.getfixturevalue("sqlite_database"))


async def make_ledger(url: str) -> str:
    """Create the test ledger table (the handlers' "effect") in the database at ``url``."""
    db = connect(parse_database_url(url))
    await db.open(max_size=1)
    try:
        async with db.transaction() as tx:
            await tx.execute(
                "CREATE TABLE ledger (job_id TEXT NOT NULL, member_id TEXT NOT NULL, "
                "points INTEGER NOT NULL)"
            )
    finally:
        await db.close()
    return url


@pytest.fixture
async def ledger(database_url: str) -> str:
    """The database under test (both stores), with a ledger table."""
    return await make_ledger(database_url)


@pytest.fixture
async def pg_ledger(pg_database: str) -> str:
    """A PostgreSQL database with a ledger table (for PostgreSQL-only behaviour)."""
    return await make_ledger(pg_database)


@pytest.fixture(autouse=True)
def _loggers_restored() -> Iterator[None]:
    """An in-process CLI call configures jobfence's loggers with a handler on the sys.stderr
    of that moment — pytest's capture, closed after its test. Put the loggers back afterwards,
    so that a later test's records do not end as 'Logging error' tracebacks on its stderr."""
    loggers = [logging.getLogger(name) for name in ("jobfence", *FOREIGN_LOGGERS)]
    saved = [(list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, (handlers, level, propagate) in zip(loggers, saved, strict=True):
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
