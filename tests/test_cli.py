"""The `jobfence` command as a user runs it: a real subprocess each time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO, query


def jf(
    *args: str, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "jobfence.cli", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        input=input,
        timeout=120,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The failure is one line on stderr, no traceback."""
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jobfence: error: ")
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def test_migrate_is_idempotent_from_the_command_line(empty_pg_database: str) -> None:
    first = jf("migrate", "--database-url", empty_pg_database)
    assert first.returncode == 0, first.stderr
    assert "applied migrations 1" in first.stdout
    second = jf("migrate", env={"JOBFENCE_DATABASE_URL": empty_pg_database})
    assert second.returncode == 0
    assert "is up to date" in second.stdout


def test_enqueue_then_list_dead_letters_as_json(sqlite_database: str) -> None:
    ok = jf(
        "enqueue",
        "points.credit",
        "--payload",
        '{"member_id": "m", "points": 1}',
        "--job-id",
        "order-1",
        "--correlation-id",
        "req-1",
        "--database-url",
        sqlite_database,
    )
    assert (ok.returncode, ok.stdout.strip()) == (0, "order-1")
    raw = jf(
        "enqueue",
        "q",
        "--payload",
        "not json",
        "--raw",
        "--job-id",
        "raw-1",
        "--database-url",
        sqlite_database,
    )
    assert raw.returncode == 0, raw.stderr
    rows = [
        (job_id, bytes(payload), correlation_id)
        for job_id, payload, correlation_id in _jobs(sqlite_database)
    ]
    assert rows == [
        ("order-1", b'{"member_id":"m","points":1}', "req-1"),
        ("raw-1", b"not json", None),
    ]
    listed = jf("dead-letters", "list", "--json", "--database-url", sqlite_database)
    assert (listed.returncode, listed.stdout) == (0, "")


def _jobs(url: str) -> list[tuple[object, ...]]:
    import asyncio

    return asyncio.run(
        query(url, "SELECT job_id, payload, correlation_id FROM core_jobs ORDER BY id")
    )


def test_worker_processes_then_dead_letters_are_listed(
    sqlite_database: str, tmp_path: Path
) -> None:
    app_file = tmp_path / "cliapp.py"
    app_file.write_text(
        "import jobfence\n"
        f"app = jobfence.App({sqlite_database!r})\n"
        "@app.consumer('q', schema={'type': 'object', 'required': ['n']})\n"
        "async def handle(job, tx):\n"
        "    raise jobfence.BusinessError('rejected by the rules', code='RULE_7')\n"
    )
    for payload, job_id in (('{"n": 1}', "business"), ('{"m": 1}', "poison")):
        assert (
            jf(
                "enqueue",
                "q",
                "--payload",
                payload,
                "--job-id",
                job_id,
                "--database-url",
                sqlite_database,
            ).returncode
            == 0
        )
    import os
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "jobfence.cli", "worker", "cliapp:app", "--log-format", "json"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    letters: list[dict[str, object]] = []
    while time.monotonic() < deadline and len(letters) < 2:
        out = jf("dead-letters", "list", "--json", "--database-url", sqlite_database).stdout
        letters = [json.loads(line) for line in out.splitlines()]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    found = {(d["job_id"], d["error_category"], d["error_code"], d["attempts"]) for d in letters}
    assert found == {
        ("business", "BUSINESS_ERROR", "RULE_7", 1),
        ("poison", "VALIDATION_ERROR", "POISON", 1),
    }
    logs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    dead = [entry for entry in logs if entry.get("event") == "job dead-lettered"]
    assert {(e["job_id"], e["level"]) for e in dead} == {
        ("business", "warning"),
        ("poison", "warning"),
    }
    table = jf("dead-letters", "list", "--database-url", sqlite_database, env={"COLUMNS": "200"})
    assert "BUSINESS_ERROR" in table.stdout
    assert "rejected by the rules" in table.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["migrate", "--database-url", "mysql://x/y"], "unsupported database URL scheme 'mysql'"),
        (["migrate", "--database-url", "sqlite://relative.db"], "needs three slashes"),
        (
            ["migrate", "--database-url", "postgresql://u:secret@127.0.0.1:1/db"],
            "cannot connect to postgresql://u:***@127.0.0.1:1/db",
        ),
        (["migrate", "--database-url", "postgresql://127.0.0.1:5432"], "names no database"),
        (["worker", "nosuchmodule:app"], "no module named 'nosuchmodule'"),
        (["worker", "nocolon"], "is not MODULE:ATTRIBUTE"),
        (["worker", "json:dumps"], "not a jobfence.App"),
        (["worker", "x:y", "--concurrency", "0"], "0 is not in the range 1<=x<=1000"),
        (["worker", "x:y", "--concurency", "3"], "No such option '--concurency'"),
        (["worker", "x:y", "--batch-size", "65"], "65 is not in the range 1<=x<=64"),
        (["worker", "x:y", "--batch-window", "-1"], "'-1' is not a duration"),
        (["enqueue", "q", "--payload", "{nope"], "not valid JSON"),
        (["enqueue", "q", "--payload", "{}", "--job-id", ""], "job_id must not be empty"),
        (["dead-letters", "list", "--category", "OOPS"], "'OOPS' is not one of"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_bad_input_gets_one_clear_line(args: list[str], expected: str, tmp_path: Path) -> None:
    env = {"JOBFENCE_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    line = one_line_error(jf(*args, env=env))
    assert expected in line
    assert "secret" not in line


def test_demo_runs_and_checks_its_ledger_on_sqlite() -> None:
    result = jf("demo", "--jobs", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "effectively-once: OK" in result.stdout
    assert "dead letters: VALIDATION_ERROR" in result.stdout
    assert "dead letters: TEMPORARY_ERROR" in result.stdout


def test_demo_runs_on_postgresql(pg_database: str) -> None:
    result = jf("demo", "--jobs", "60", "--database-url", pg_database)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "effectively-once: OK" in result.stdout


def test_worker_serves_prometheus_metrics(ledger: str, tmp_path: Path) -> None:
    """`--metrics-port` serves the counters and the handler histogram of what it processed."""
    import asyncio
    import socket
    import urllib.request

    from jobfence import App

    from .helpers import start_worker, stop_process, wait_until

    async def enqueue() -> None:
        async with App(ledger, auto_migrate=True) as app:
            await app.enqueue("crash", {}, job_id="m-1")
            await app.enqueue("crash", {}, job_id="m-1")  # a duplicate

    asyncio.run(enqueue())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"JF_DB": ledger, "JF_MARKS": str(tmp_path)}
    proc = start_worker(
        "tests.apps.crash_app:app", env, tmp_path / "w.log", "--metrics-port", str(port)
    )

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                body: str = r.read().decode()
        except OSError:
            return ""
        done = 'jobfence_duplicates_skipped_total{consumer="crash",queue="crash"} 1.0' in body
        return body if done else ""

    try:
        body = wait_until(scrape, timeout=30, what="metrics after one job and one duplicate")
    finally:
        assert stop_process(proc) == 0
    assert 'jobfence_jobs_processed_total{consumer="crash",queue="crash"} 1.0' in body
    assert 'jobfence_handler_duration_seconds_count{queue="crash"} 1.0' in body
