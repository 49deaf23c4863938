"""Issue 12 §5: a job enqueued to a queue no consumer of the app serves is not silent.
``jobfence enqueue`` warns on stderr (and still enqueues), and ``dead-letters stats`` shows
every queue's backlog with the oldest waiting job's age, marking the queues the app does not
serve. Real ``jobfence`` subprocesses against real PostgreSQL and SQLite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import scalar, table
from .test_cli_app import run_in

APP_SOURCE = """
from jobfence import App

app = App({url!r})


@app.consumer("points.credit")
async def credit(job, tx):
    pass


@app.consumer("points.debit")
async def debit(job, tx):
    pass
"""


@pytest.fixture
def project(tmp_path: Path, database_url: str) -> tuple[Path, str]:
    """A user's project folder: ``myapp.py`` whose App serves points.credit and points.debit
    on the database under test (both stores)."""
    (tmp_path / "myapp.py").write_text(APP_SOURCE.format(url=database_url), encoding="utf-8")
    return tmp_path, database_url


def enqueue(folder: Path, queue: str, *extra: str) -> tuple[int, str, str]:
    done = run_in(folder, "enqueue", queue, "--app", "myapp:app", "--payload", "{}", *extra)
    return done.returncode, done.stdout, done.stderr


async def test_enqueue_to_an_unserved_queue_warns_in_one_line_and_still_enqueues(
    project: tuple[Path, str],
) -> None:
    folder, url = project
    code, out, err = enqueue(folder, "no.such.queue", "--job-id", "typo-1")
    assert code == 0, err
    assert out.strip() == "typo-1"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "warning" in lines[0]
    assert "'no.such.queue'" in lines[0]
    assert "myapp:app" in lines[0]
    assert "points.credit, points.debit" in lines[0]
    jobs = table(url, "jobs")
    assert await scalar(url, f"SELECT count(*) FROM {jobs} WHERE queue = 'no.such.queue'") == 1


async def test_with_json_the_warning_goes_to_stderr_and_stdout_stays_json(
    project: tuple[Path, str],
) -> None:
    folder, _url = project
    code, out, err = enqueue(folder, "no.such.queue", "--job-id", "typo-2", "--json")
    assert code == 0, err
    assert json.loads(out) == {"job_id": "typo-2", "queue": "no.such.queue"}
    assert "'no.such.queue'" in err


def test_a_served_queue_and_an_app_without_consumers_say_nothing(
    project: tuple[Path, str],
) -> None:
    folder, url = project
    code, _out, err = enqueue(folder, "points.credit")
    assert (code, err) == (0, "")
    # no app: nothing is known about who serves what, so nothing is claimed
    bare = run_in(folder, "enqueue", "no.such.queue", "--database-url", url, "--payload", "{}")
    assert (bare.returncode, bare.stderr) == (0, "")


def test_stats_shows_each_queues_backlog_and_marks_the_unserved(
    project: tuple[Path, str],
) -> None:
    folder, url = project
    for queue in ("no.such.queue", "no.such.queue", "points.credit"):
        assert enqueue(folder, queue)[0] == 0
    found = run_in(folder, "dead-letters", "stats", "--app", "myapp:app", "--json")
    assert found.returncode == 0, found.stderr
    queues = {q["queue"]: q for q in json.loads(found.stdout)["queues"]}
    assert sorted(queues) == ["no.such.queue", "points.credit"]
    typo, credit = queues["no.such.queue"], queues["points.credit"]
    assert (typo["waiting"], typo["running"], typo["served"]) == (2, 0, False)
    assert (credit["waiting"], credit["served"]) == (1, True)
    for q in (typo, credit):
        assert 0 <= q["oldest_waiting_s"] < 600

    shown = run_in(folder, "dead-letters", "stats", "--app", "myapp:app")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if "no.such.queue" in line)
    assert "NO - no consumer" in row
    assert "jobs wait on queue(s) no consumer of myapp:app serves: no.such.queue" in shown.stdout

    # without the app the backlog still shows; whether a queue is served is not known
    bare = run_in(folder, "dead-letters", "stats", "--database-url", url, "--json")
    assert bare.returncode == 0, bare.stderr
    assert {q["served"] for q in json.loads(bare.stdout)["queues"]} == {None}
