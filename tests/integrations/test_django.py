"""The Django integration, run as a user runs it: the example project (examples/django_app) on
a database the test creates and drops, `manage.py migrate`, `manage.py place_order` and
`manage.py jobfence_worker` in subprocesses, real PostgreSQL (psycopg 3) and SQLite, no mocks.

The seed's criteria through Django's ORM: parallel duplicates, SIGKILL inside the atomic
block, a raising handler, retries then a dead letter, a replay, enqueue in a rolled-back
block, and what a handler that commits or rolls back by itself gets.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")

from jobfence import App

from ..conftest import create_pg_database, drop_pg_database, pg_url
from ..helpers import REPO, query, scalar, stop_process, table, wait_until

pytestmark = pytest.mark.slow

PROJECT = REPO / "examples" / "django_app"


class Shop:
    """The example Django project on one fresh database."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.env = {
            **os.environ,
            "SHOP_DATABASE_URL": url,
            "SHOP_MARKS": str(tmp),
            "SHOP_LEASE": "1",
            "PYTHONPATH": os.pathsep.join([str(PROJECT), str(REPO / "src")]),
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("JOBFENCE_DATABASE_URL", None)
        self.env.pop("JOBFENCE_APP", None)
        self.workers = 0

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
        )

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        self.workers += 1
        log = open(self.tmp / f"worker-{self.workers}.log", "ab")  # noqa: SIM115
        return subprocess.Popen(
            [sys.executable, "manage.py", "jobfence_worker", "--log-level", "DEBUG", *args],
            cwd=PROJECT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.tmp.glob("worker-*.log")))

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return asyncio.run(query(self.url, sql))

    def count(self, sql: str) -> int:
        return int(asyncio.run(scalar(self.url, sql)))

    def jobs_left(self) -> int:
        return self.count(f"SELECT count(*) FROM {table(self.url, 'jobs')}")

    def fences(self) -> list[tuple[Any, ...]]:
        return self.rows(
            f"SELECT consumer, job_id FROM {table(self.url, 'processed_jobs')} ORDER BY job_id"
        )

    def credits(self) -> list[tuple[Any, ...]]:
        return self.rows("SELECT job_id, member_id, points FROM shop_credit ORDER BY id")

    def letters(self) -> dict[str, tuple[Any, ...]]:
        rows = self.rows(
            "SELECT job_id, error_category, error_code, attempts, last_error "
            f"FROM {table(self.url, 'dead_letters')}"
        )
        return {row[0]: row[1:] for row in rows}

    def enqueue(self, *jobs: tuple[str, dict[str, Any]], queue: str = "points.credit") -> None:
        async def go() -> None:
            async with App(self.url) as app:
                await app.enqueue_many([app.job(queue, p, job_id=j) for j, p in jobs])

        asyncio.run(go())

    def run_until_settled(self, *args: str, timeout: float = 60) -> None:
        """A worker until the queue is empty (every job processed, skipped or dead)."""
        proc = self.worker(*args)
        try:
            wait_until(lambda: self.jobs_left() == 0, timeout=timeout, what="queue drained")
        finally:
            assert stop_process(proc) == 0, self.logs()


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`manage.py migrate` once per store, on a template that each test's database is copied
    from: the PostgreSQL database's name and the SQLite file's path."""
    tmp = tmp_path_factory.mktemp("shop-templates")
    name = create_pg_database()
    try:
        Shop(pg_url(name), tmp).manage("migrate")
        sqlite_file = tmp / "shop-template.db"
        Shop(f"sqlite:///{sqlite_file}", tmp).manage("migrate")
        yield {"postgresql": name, "sqlite": str(sqlite_file)}
    finally:
        drop_pg_database(name)


@pytest.fixture(params=["postgresql", "sqlite"])
def shop(
    request: pytest.FixtureRequest, migrated: dict[str, str], tmp_path: Path
) -> Iterator[Shop]:
    """A fresh database (dropped afterwards) as `manage.py migrate` leaves it: the project's
    tables and, through the jobfence app's post_migrate, jobfence's. The migrate ran once, on
    the module's template; each test gets a copy of it."""
    if request.param == "postgresql":
        name = create_pg_database(migrated["postgresql"])
        try:
            yield Shop(pg_url(name), tmp_path)
        finally:
            drop_pg_database(name)
    else:
        copy = tmp_path / f"shop-{uuid.uuid4().hex[:6]}.db"
        for suffix in ("", "-wal"):  # the migrate's process checkpointed; a WAL file if not
            template = Path(migrated["sqlite"] + suffix)
            if template.exists():
                shutil.copyfile(template, f"{copy}{suffix}")
        yield Shop(f"sqlite:///{copy}", tmp_path)


def credit(member: str = "m-1", points: int = 10, then: str | None = None) -> dict[str, Any]:
    return {"member_id": member, "points": points, **({"then": then} if then else {})}


def test_migrate_creates_jobfence_schema_and_is_idempotent(shop: Shop) -> None:
    out = shop.manage("migrate").stdout
    assert "jobfence: applied" not in out  # the fixture's migrate applied everything
    assert shop.jobs_left() == 0
    assert shop.count("SELECT count(*) FROM shop_credit") == 0


def test_parallel_deliveries_make_one_orm_row_and_one_fence(shop: Shop) -> None:
    """64 deliveries of one job_id, 32 handlers at a time: one ORM row, one fence."""
    shop.enqueue(*[("order-42", credit()) for _ in range(64)])
    shop.run_until_settled("--concurrency", "32")
    assert shop.credits() == [("order-42", "m-1", 10)]
    assert shop.fences() == [("points.credit", "order-42")]
    assert shop.letters() == {}


def test_sigkill_inside_the_atomic_block_leaves_neither_then_one(shop: Shop) -> None:
    """SIGKILL while the handler's ORM write is uncommitted: no credit and no fence; the
    lease expires, a new worker redelivers it: exactly one of each."""
    shop.enqueue(("order-7", credit(then="hang")))
    proc = shop.worker()
    try:
        wait_until(lambda: (shop.tmp / "order-7.in-tx").exists(), what="handler inside atomic")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert shop.credits() == []
    assert shop.fences() == []
    shop.run_until_settled()
    assert shop.credits() == [("order-7", "m-1", 10)]
    assert shop.fences() == [("points.credit", "order-7")]


def test_failures_roll_back_the_orm_writes_and_retry_then_dead_letter(shop: Shop) -> None:
    """A handler that raises after its ORM write leaves no row and no fence; a transient
    failure is retried (the policy allows 2 retries) and then dead-lettered, still no row."""
    shop.enqueue(("bad", credit(then="raise")), ("flaky", credit(then="transient")))
    shop.run_until_settled()
    assert shop.credits() == []
    assert shop.fences() == []
    letters = shop.letters()
    assert letters["bad"][:3] == ("BUSINESS_ERROR", "BusinessError", 1)
    assert "member is closed" in letters["bad"][3]
    assert letters["flaky"][:3] == ("TEMPORARY_ERROR", "TemporaryError", 3)
    # the jobfence command line inside the project, on settings.JOBFENCE_APP
    listed = shop.manage("jobfence", "dead-letters", "list", "--json").stdout
    letters_listed = [json.loads(line) for line in listed.splitlines() if line.strip()]
    assert sorted(letter["job_id"] for letter in letters_listed) == ["bad", "flaky"]


def test_replay_of_a_processed_job_makes_no_second_effect(shop: Shop) -> None:
    shop.enqueue(("order-9", credit(points=5)))
    shop.run_until_settled()
    shop.enqueue(("order-9", credit(points=5)))  # what a replay does: the same job_id again
    shop.run_until_settled()
    assert shop.credits() == [("order-9", "m-1", 5)]
    assert shop.fences() == [("points.credit", "order-9")]


def test_enqueue_inside_a_rolled_back_atomic_block_leaves_no_job(shop: Shop) -> None:
    """`place_order` writes the order, its job and its outbox event in one atomic block."""
    failed = shop.manage("place_order", "m-1", "10", "--fail", check=False)
    assert failed.returncode == 1, failed.stderr
    assert "payment declined" in failed.stderr
    assert shop.count("SELECT count(*) FROM shop_order") == 0
    assert shop.jobs_left() == 0
    assert shop.count(f"SELECT count(*) FROM {table(shop.url, 'outbox')}") == 0

    placed = shop.manage("place_order", "m-1", "10")
    order = int(placed.stdout.split()[1])
    jobs = shop.rows(f"SELECT job_id FROM {table(shop.url, 'jobs')}")
    assert jobs == [(f"order-{order}",)]
    events = shop.rows(f"SELECT event_id FROM {table(shop.url, 'outbox')}")
    assert events == [(f"placed-{order}",)]
    shop.run_until_settled()
    assert shop.credits() == [(f"order-{order}", "m-1", 10)]


DJANGO_REFUSES = "forbidden when an 'atomic' block is active"
#: what a handler that tries to end its transaction gets: (its dead letter's code, words of
#: its error), per store where they differ
BOUNDARY = {
    # Django refuses these inside atomic() itself: nothing happened, the job fails
    "commit": ("TransactionManagementError", DJANGO_REFUSES),
    "connection-commit": ("TransactionManagementError", DJANGO_REFUSES),
    "rollback": ("TransactionManagementError", DJANGO_REFUSES),
    "set-autocommit": ("TransactionManagementError", DJANGO_REFUSES),
    "durable": ("RuntimeError", "durable atomic block cannot be nested"),
    # closing the connection ends the transaction
    "close": ("TX_ENDED", "closed by the handler"),
    # SQL that ends the transaction: refused before it reaches the database
    "sql-commit": ("TX_CONTROL_REFUSED", "ran COMMIT"),
    # the driver's own commit()/rollback(): refused (SQLite: an authorizer) or caught at
    # COMMIT (PostgreSQL: the fence's server-side guard); the work and the fence roll back
    "raw-commit": {
        "postgresql": ("TX_ENDED", "committed by someone other than jobfence"),
        "sqlite": ("TX_CONTROL_REFUSED", "ran COMMIT"),
    },
    "raw-rollback": {
        "postgresql": ("TX_ENDED", "rolled back on the psycopg connection"),
        "sqlite": ("TX_CONTROL_REFUSED", "ran ROLLBACK"),
    },
    # a failed statement the handler caught and carried on after, through the cursor or the
    # ORM: the transaction cannot commit (PostgreSQL aborts it; on SQLite jobfence fails the
    # job the same way) — the one rule of every integration (docs/concepts.md)
    "caught-sql-error": ("TX_ABORTED", "caught the error and returned normally"),
    "caught-orm-error": ("TX_ABORTED", "caught the error and returned normally"),
    # set_rollback(True): the handler rolled back work it had not scoped itself; it would
    # roll back silently, the job fails instead
    "set-rollback": ("TX_ROLLBACK_ONLY", "marked for rollback"),
}


def test_a_handler_cannot_commit_or_roll_back_its_transaction(shop: Shop) -> None:
    """Each way to end the transaction early: refused or caught, the job's ORM write and its
    fence roll back together (no credit, no fence) and the job is dead-lettered after its
    retries; the ways that are savepoints or refused-and-caught commit normally."""
    fine = ["commit-caught", "savepoint", "follow-up"]
    shop.enqueue(*[(mode, credit(then=mode)) for mode in [*BOUNDARY, *fine]])
    shop.run_until_settled()
    dialect = "postgresql" if shop.url.startswith("postgresql") else "sqlite"
    letters = shop.letters()
    credited = [row[0] for row in shop.credits()]
    fenced = [row[1] for row in shop.fences()]
    problems: list[str] = []
    for mode, expected in BOUNDARY.items():
        code, words = expected[dialect] if isinstance(expected, dict) else expected
        category, got_code, attempts, error = letters[mode]
        if mode in credited or mode in fenced:
            problems.append(f"{mode}: committed")
        if (category, got_code, attempts) != ("TECHNICAL_ERROR", code, 3) or words not in error:
            problems.append(f"{mode}: {category} {got_code} x{attempts}: {error}")
    assert problems == []
    # refused and caught: nothing happened, the job committed; a savepoint undid its part
    # only; a job enqueued from a handler joined its transaction and ran after it
    assert sorted(set(fine) - set(letters)) == sorted(fine)
    assert sorted(credited) == sorted([*fine, "audit-follow-up"])
    assert sorted(fenced) == sorted([*fine, "audit-follow-up"])
    notes = shop.rows("SELECT note FROM shop_credit WHERE job_id = 'audit-follow-up'")
    assert notes == [("follow-up",)]


def test_worker_command_needs_an_app_and_refuses_async_handlers(shop: Shop) -> None:
    """One line each: no JOBFENCE_APP, and an `async def` handler on a DjangoApp."""
    script = (
        "import django; django.setup()\n"
        "from jobfence.integrations.django import DjangoApp\n"
        "app = DjangoApp()\n"
        "@app.consumer('q')\n"
        "async def handle(job, tx): pass\n"
    )
    env = {**shop.env, "DJANGO_SETTINGS_MODULE": "shop.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "is `async def`; Django's transactions are synchronous" in done.stderr
    settings = {**env, "DJANGO_SETTINGS_MODULE": "shop.settings_without_app"}
    (shop.tmp / "shop_settings_without_app.py").write_text(
        "from shop.settings import *\nJOBFENCE_APP = None\n"
    )
    settings["PYTHONPATH"] = os.pathsep.join([str(shop.tmp), settings["PYTHONPATH"]])
    settings["DJANGO_SETTINGS_MODULE"] = "shop_settings_without_app"
    done = subprocess.run(
        [sys.executable, "manage.py", "jobfence_worker"],
        cwd=PROJECT,
        env=settings,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "set JOBFENCE_APP = 'yourproject.jobs:app'" in done.stderr


def test_a_djangoapp_refuses_a_database_other_than_djangos(shop: Shop) -> None:
    env = {**shop.env, "JOBFENCE_DATABASE_URL": "sqlite:////tmp/elsewhere.db"}
    done = subprocess.run(
        [sys.executable, "manage.py", "jobfence_worker"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "keeps its fence in Django's database 'default'" in done.stderr


def test_jobfence_imports_without_django_and_the_integration_names_the_extra() -> None:
    """Without Django installed, jobfence (and its CLI) import; the integration says, in one
    line, which extra to install."""
    script = (
        "import sys\n"
        "sys.modules['django'] = None  # as if Django were not installed\n"
        "import jobfence, jobfence.cli, jobfence.runtime.harness\n"
        "try:\n"
        "    import jobfence.integrations.django\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.startswith(
        "MissingExtra jobfence.integrations.django needs jobfence[django]: "
        "pip install 'jobfence[django]'"
    ), done.stdout + done.stderr


def test_the_projects_own_tests_see_jobfence_in_djangos_test_database(shop: Shop) -> None:
    """`manage.py test`: Django creates (and drops) its test database and migrates it; the
    post_migrate hook gives it jobfence's tables, so enqueue inside atomic() is testable."""
    done = shop.manage("test", "shop", "--noinput", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Ran 2 tests" in done.stderr
    assert "OK" in done.stderr


def test_a_write_through_a_second_alias_of_the_sqlite_file_fails_the_first_attempt(
    shop: Shop,
) -> None:
    """Issue 28, point 4: on SQLite a second alias of the job's own file waits for the write
    lock the job holds until its handler returns — it can never succeed: the first attempt
    fails for good, saying why. On PostgreSQL the second alias's write commits on its own,
    outside the fence (docs/integrations/django.md says so): one per attempt."""
    shop.env["SHOP_SECOND_ALIAS"] = "1"
    shop.enqueue(("twice", credit(then="second-alias")))
    shop.run_until_settled()
    if shop.url.startswith("sqlite"):
        category, code, attempts, error = shop.letters()["twice"]
        assert (category, code, attempts) == ("NON_RETRYABLE_ERROR", "DB_SECOND_CONNECTION", 1)
        assert "through the Django database alias 'again'" in error, error
        assert shop.credits() == []
    else:
        assert shop.letters() == {}
        assert shop.credits() == [("twice", "m-1", 10), ("twice-again", "m", 0)]
    assert shop.fences() == (
        [("points.credit", "twice")] if shop.url.startswith("postgresql") else []
    )
