"""Issue 12 §1: every command that touches a database follows the app's database
(``--app`` / ``JOBFENCE_APP``), and no command outside ``jobfence demo`` creates a SQLite
file of its own. Real ``jobfence`` subprocesses against real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import eventually, query, scalar, table

APP_SOURCE = """
from jobfence import App

app = App({url!r})


@app.consumer("points.credit")
async def credit(job, tx):
    await tx.execute(
        "INSERT INTO ledger (job_id, member_id, points) VALUES (%(j)s, %(m)s, %(p)s)",
        {{"j": job.job_id, "m": job.payload["member_id"], "p": job.payload["points"]}},
    )
"""


def run_in(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``jobfence ARGS`` from ``cwd`` (where the user's app module is), with no JOBFENCE_*
    variable inherited."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "jobfence.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def project(tmp_path: Path, pg_ledger: str) -> tuple[Path, str]:
    """A user's project folder: ``myapp.py`` whose App points at PostgreSQL."""
    (tmp_path / "myapp.py").write_text(APP_SOURCE.format(url=pg_ledger), encoding="utf-8")
    return tmp_path, pg_ledger


def no_sqlite_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix in (".db", ".sqlite"))


async def test_enqueue_and_dead_letters_follow_the_apps_database(
    project: tuple[Path, str],
) -> None:
    """The README's trap: the worker reads PostgreSQL from the app; enqueue and dead-letters
    given the same app (flag or environment) use that database, not a new ./jobfence.db."""
    folder, url = project
    put = run_in(
        folder,
        "enqueue",
        "points.credit",
        "--app",
        "myapp:app",
        "--payload",
        '{"member_id": "m-1", "points": 5}',
        "--job-id",
        "order-1",
    )
    assert put.returncode == 0, put.stderr
    assert await scalar(url, f"SELECT count(*) FROM {table(url, 'jobs')}") == 1
    listed = run_in(folder, "dead-letters", "list", "--json", env={"JOBFENCE_APP": "myapp:app"})
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == ""  # no letters, and no error
    assert no_sqlite_files(folder) == []

    # the worker started from the environment alone (no APP argument) processes that job
    log = (folder / "worker.log").open("ab")
    worker = subprocess.Popen(  # noqa: ASYNC220 - a real worker process, polled below
        [sys.executable, "-m", "jobfence.cli", "worker"],
        cwd=folder,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")},
            "JOBFENCE_APP": "myapp:app",
            "JOBFENCE_LOG_LEVEL": "DEBUG",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        rows = await eventually(
            lambda: query(url, "SELECT job_id, points FROM ledger"), what="the credit"
        )
        assert rows == [("order-1", 5)]
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        log.close()
    assert no_sqlite_files(folder) == []


def test_database_url_overrides_the_apps(project: tuple[Path, str], tmp_path: Path) -> None:
    """--database-url wins over the app's database (as the worker's always did)."""
    folder, _url = project
    other = tmp_path / "other.db"
    made = run_in(folder, "migrate", "--database-url", f"sqlite:///{other}", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["applied"]
    put = run_in(
        folder,
        "enqueue",
        "points.credit",
        "--payload",
        "{}",
        "--json",
        env={"JOBFENCE_APP": "myapp:app", "JOBFENCE_DATABASE_URL": f"sqlite:///{other}"},
    )
    assert put.returncode == 0, put.stderr
    assert json.loads(put.stdout)["queue"] == "points.credit"
    import sqlite3

    with sqlite3.connect(other) as conn:
        assert conn.execute("SELECT count(*) FROM core_jobs").fetchone() == (1,)


@pytest.mark.parametrize(
    "args",
    [
        ["enqueue", "q", "--payload", "{}"],
        ["dead-letters", "list"],
        ["dead-letters", "stats"],
        ["outbox", "list"],
        ["cleanup", "--once"],
        ["alerts", "list"],
        ["migrate"],
    ],
)
def test_no_database_anywhere_is_one_line_naming_the_three_ways(
    args: list[str], tmp_path: Path
) -> None:
    result = run_in(tmp_path, *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for way in ("--database-url", "JOBFENCE_DATABASE_URL", "--app", "JOBFENCE_APP"):
        assert way in lines[0]
    assert no_sqlite_files(tmp_path) == []


def test_a_sqlite_typo_is_not_a_new_empty_store(tmp_path: Path) -> None:
    """Only migrate (and a worker, which migrates SQLite) create a SQLite file; anything
    else names the missing file and how to create it."""
    typo = tmp_path / "jobz.db"
    result = run_in(tmp_path, "dead-letters", "list", "--database-url", f"sqlite:///{typo}")
    assert result.returncode == 1
    assert "no SQLite database at" in result.stderr
    assert "jobfence migrate --database-url" in result.stderr
    assert not typo.exists()


def test_a_bad_app_is_one_line(tmp_path: Path) -> None:
    result = run_in(tmp_path, "dead-letters", "list", "--app", "nosuch:app")
    assert result.returncode == 2
    assert "no module named 'nosuch'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_enqueue_follows_the_apps_transport(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """An app whose queue is a broker (Redis here): `jobfence enqueue --app` publishes to
    that broker, not to the database's job table, as the app's worker will consume it."""
    from .contract.support import cleanup, make_target, remaining

    target = make_target("redis", request)
    try:
        source = APP_SOURCE.format(url=target.database_url).replace(
            f"App({target.database_url!r})",
            f"App({target.database_url!r}, transport={target.transport_url!r})",
        )
        (tmp_path / "myapp.py").write_text(
            source.replace('"points.credit"', repr(target.queue)), encoding="utf-8"
        )
        put = run_in(
            tmp_path,
            "enqueue",
            target.queue,
            "--app",
            "myapp:app",
            "--payload",
            '{"member_id": "m-1", "points": 5}',
        )
        assert put.returncode == 0, put.stderr
        assert "no consumer" not in put.stderr  # the app serves that queue
        assert asyncio.run(remaining(target)) == 1
        db = target.database_url
        assert asyncio.run(scalar(db, f"SELECT count(*) FROM {table(db, 'jobs')}")) == 0
    finally:
        asyncio.run(cleanup(target))
