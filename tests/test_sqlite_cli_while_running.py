"""Issue 28, point 1: on SQLite, the CLI answers at once while a handler runs.

A real worker subprocess runs a handler that holds its job's transaction — and so SQLite's
one write lock — for a minute. Every command an operator reaches for meanwhile answers within
a bound, measured (not slept): the ones that only read never take the write lock (a schema
already current is checked read-only, not migrated); cancel and retry-now of the running job
say it is running, exit 1, as the ops API answers 409; a command that must write (pause)
waits at most the CLI's lock timeout and says in one line that the database is locked —
never SQLite's 30 s busy wait and a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobfence import App
from jobfence.cli.common import CLI_LOCK_TIMEOUT

from .conftest import make_ledger
from .helpers import REPO, start_worker, wait_until

pytestmark = pytest.mark.slow

#: what a command that only reads (or refuses a running job) may take, start-up included
READ_BOUND = 10.0


def jobfence(url: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "JOBFENCE_DATABASE_URL": url, "COLUMNS": "200"}
    env.pop("JOBFENCE_APP", None)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "jobfence.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, time.monotonic() - began


async def test_cli_commands_answer_within_a_bound_while_a_handler_holds_the_write_lock(
    sqlite_database: str, tmp_path: Path
) -> None:
    url = sqlite_database
    await make_ledger(url)
    async with App(url) as app:
        await app.enqueue("work", {"mode": "sleep", "seconds": 60}, job_id="long")
    env = {"JF_DB": url, "JF_MARKS": str(tmp_path), "JF_LEASE": "120"}
    worker = start_worker("tests.apps.shutdown_app:app", env, tmp_path / "worker.log")
    try:
        wait_until(
            lambda: (tmp_path / "long.started.1").exists(), timeout=60, what="handler running"
        )
        listed, took = jobfence(url, "jobs", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert took < READ_BOUND, f"jobs list took {took:.1f}s"
        (job,) = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
        assert job["state"] == "running"
        row = str(job["id"])

        timings: dict[str, float] = {"jobs list": took}
        answers: dict[str, Any] = {}
        for name, args, code in [
            ("jobs show", ("jobs", "show", "--id", row), 0),
            ("dead-letters list", ("dead-letters", "list"), 0),
            ("queues list", ("queues", "list"), 0),
            ("jobs cancel", ("jobs", "cancel", "--id", row, "--reason", "stop it"), 1),
            ("jobs retry-now", ("jobs", "retry-now", "--id", row), 1),
        ]:
            done, took = jobfence(url, *args)
            timings[name] = took
            answers[name] = (done.returncode, done.stderr.strip())
            assert done.returncode == code, f"{name}: {done.stdout}{done.stderr}"
            assert "Traceback" not in done.stderr, done.stderr
        slow = {name: round(t, 1) for name, t in timings.items() if t >= READ_BOUND}
        assert slow == {}, timings
        for name in ("jobs cancel", "jobs retry-now"):
            _, error = answers[name]
            assert f"job {row} is running on worker" in error, error
            assert len(error.splitlines()) == 1, error

        paused, took = jobfence(url, "queues", "pause", "work", "--reason", "maintenance")
        assert paused.returncode == 1, paused.stdout + paused.stderr
        assert "Traceback" not in paused.stderr, paused.stderr
        (line,) = paused.stderr.strip().splitlines()
        assert line.startswith("jobfence: error: the SQLite database "), line
        assert "is locked" in line, line
        assert "nothing was changed" in line, line
        assert CLI_LOCK_TIMEOUT <= took < CLI_LOCK_TIMEOUT + READ_BOUND, took
    finally:
        # the handler sleeps a minute inside its transaction: SIGTERM would wait out the
        # grace for it; what the worker does on a stop is not this test's concern
        worker.kill()
        worker.wait()
